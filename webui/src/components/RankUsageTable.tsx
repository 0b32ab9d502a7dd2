// A running trial's ranks: CPU, memory and (on GPU slots) the GPU, from the agents' last heartbeats.
import { num, type RankUsage } from "../api";
import { fmtBytes, fmtPercent } from "../format";

export function RankUsageTable({ ranks }: { ranks: RankUsage[] }) {
  const gpus = ranks.some((r) => num(r.device_memory_bytes) > 0);
  return (
    <div className="table-wrap">
      <table className="table" data-testid="rank-usage">
        <thead>
          <tr>
            <th className="num">Rank</th>
            <th>Agent</th>
            <th className="num">Slot</th>
            <th className="num" title="CPU time per second of the rank's processes: 100% is one core busy">
              CPU
            </th>
            <th className="num">Memory</th>
            {gpus && <th className="num">GPU</th>}
            {gpus && <th className="num">GPU memory</th>}
          </tr>
        </thead>
        <tbody>
          {ranks.map((r) => (
            <tr key={`${r.agent_id}:${r.rank}`} data-testid="rank-usage-row" data-rank={r.rank}>
              <td className="num">{r.rank}</td>
              <td className="mono small">{r.agent_id}</td>
              <td className="num">{r.slot}</td>
              <td className="num">{fmtPercent(num(r.cpu_utilization))}</td>
              <td className="num nowrap">{fmtBytes(num(r.memory_rss_bytes))}</td>
              {gpus && <td className="num">{fmtPercent(num(r.device_utilization))}</td>}
              {gpus && (
                <td className="num nowrap">
                  {fmtBytes(num(r.device_memory_used_bytes))} / {fmtBytes(num(r.device_memory_bytes))}
                </td>
              )}
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}
