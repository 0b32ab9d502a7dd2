// `/usage`: slot-hours per day by user and by pool, with totals; admins also see how
// busy each pool was. A regular user's answers hold their own usage only.
import { useCallback, useEffect, useMemo } from "react";
import uPlot from "uplot";
import { api, num, type PoolUsage, type UsageReport } from "../api";
import { AXIS_STYLE, Plot, seriesColor } from "../components/Plot";
import { ErrorPanel, Loading, Section } from "../components/ui";
import { fmtPercent } from "../format";
import { usePoll, useQueryState } from "../hooks";

const WINDOWS = [7, 30, 90];
const DAY_MS = 86_400_000;

/** The first day (UTC, YYYY-MM-DD) of a window of `days` days ending today. */
function firstDay(days: number): string {
  const now = new Date();
  const today = Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate());
  return new Date(today - (days - 1) * DAY_MS).toISOString().slice(0, 10);
}

/** Slot-hours as a person reads them: fewer decimals for more hours, and a short run's
 * few seconds still show (0.0022, not 0.00). */
export function fmtSlotHours(v: number): string {
  if (v === 0) return "0";
  return v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v >= 0.01 ? v.toFixed(2) : v.toFixed(4);
}

interface Daily {
  days: string[];
  keys: string[];
  /** slot-hours[key index][day index] */
  values: number[][];
  totals: Map<string, number>;
}

/** A per-day report as one row of values per group, over every day of the window. */
function daily(report: UsageReport | undefined, since: string): Daily {
  const days: string[] = [];
  const today = new Date().toISOString().slice(0, 10);
  for (let t = Date.parse(`${since}T00:00:00Z`); ; t += DAY_MS) {
    const d = new Date(t).toISOString().slice(0, 10);
    if (d > today) break;
    days.push(d);
  }
  const totals = new Map<string, number>();
  for (const g of report?.groups ?? []) totals.set(g.key, (totals.get(g.key) ?? 0) + num(g.slot_hours));
  const keys = [...totals.keys()].sort((a, b) => (totals.get(b) ?? 0) - (totals.get(a) ?? 0) || a.localeCompare(b));
  const index = new Map(days.map((d, i) => [d, i]));
  const values = keys.map(() => days.map(() => 0));
  const row = new Map(keys.map((k, i) => [k, i]));
  for (const g of report?.groups ?? []) {
    const i = row.get(g.key);
    const j = index.get(g.day);
    if (i !== undefined && j !== undefined) values[i]![j]! += num(g.slot_hours);
  }
  return { days, keys, values, totals };
}

function UsageChart({ data, what, testId }: { data: Daily; what: string; testId: string }) {
  const structure = `${what}|${data.keys.join(",")}|${data.days.length}`;
  const plotData = useMemo<uPlot.AlignedData>(
    () => [data.days.map((d) => Date.parse(`${d}T00:00:00Z`) / 1000), ...data.values],
    [data],
  );
  const keys = data.keys;
  const options = useCallback(
    (width: number, height: number): uPlot.Options => ({
      width,
      height,
      legend: { show: true },
      scales: { x: { time: true }, y: { range: (_u, _lo, hi) => [0, hi > 0 ? hi * 1.1 : 1] } },
      axes: [
        { ...AXIS_STYLE, label: "day (UTC)", labelSize: 20 },
        { ...AXIS_STYLE, label: "slot-hours", labelSize: 20, size: 60 },
      ],
      series: [
        { label: "day" },
        ...keys.map((k, i) => ({
          label: k,
          stroke: seriesColor(i),
          width: 1.5,
          points: { show: true, size: 6, fill: seriesColor(i) },
        })),
      ],
    }),
    // The structure names the series; a new one makes a new chart.
    [structure],
  );
  return (
    <div className="usage-chart" data-testid={testId} data-series={JSON.stringify(keys)}>
      {keys.length === 0 ? (
        <p className="muted">No slot was used in this window.</p>
      ) : (
        <Plot options={options} data={plotData} structure={structure} height={260} />
      )}
    </div>
  );
}

function Totals({ data, header, testId }: { data: Daily; header: string; testId: string }) {
  const all = [...data.totals.values()].reduce((a, b) => a + b, 0);
  return (
    <div className="table-wrap">
      <table className="table" data-testid={testId}>
        <thead>
          <tr>
            <th>{header}</th>
            <th className="num">Slot-hours</th>
            <th className="num">Share</th>
          </tr>
        </thead>
        <tbody>
          {data.keys.map((k) => (
            <tr key={k} data-testid={`${testId}-row`} data-key={k}>
              <td>{k}</td>
              <td className="num" data-testid="slot-hours">
                {fmtSlotHours(data.totals.get(k) ?? 0)}
              </td>
              <td className="num">{all > 0 ? fmtPercent((data.totals.get(k) ?? 0) / all) : "–"}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

function Pools({ pools }: { pools: PoolUsage[] }) {
  return (
    <div className="table-wrap">
      <table className="table" data-testid="usage-pools">
        <thead>
          <tr>
            <th>Pool</th>
            <th className="num">Used slot-hours</th>
            <th className="num" title="its connected agents' slots, each from its first join (or the window's start) to the window's end (or now)">
              Capacity
            </th>
            <th className="num">Used</th>
            <th className="num">Idle</th>
          </tr>
        </thead>
        <tbody>
          {pools.map((p) => (
            <tr key={p.pool} data-key={p.pool}>
              <td>{p.pool}</td>
              <td className="num">{fmtSlotHours(num(p.used_slot_seconds) / 3600)}</td>
              <td className="num">{fmtSlotHours(num(p.capacity_slot_seconds) / 3600)}</td>
              <td className="num">{fmtPercent(num(p.used_ratio))}</td>
              <td className="num">{fmtPercent(num(p.idle_ratio))}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

export function UsagePage() {
  const [get, set] = useQueryState();
  const chosen = Number(get("days") ?? 30);
  const days = WINDOWS.includes(chosen) ? chosen : 30;
  const since = firstDay(days);
  const byUser = usePoll(`usage-user-${since}`, (s) => api.usage({ by: "user", since, per_day: true }, s), {
    intervalMs: 30_000,
  });
  const byPool = usePoll(`usage-pool-${since}`, (s) => api.usage({ by: "pool", since, per_day: true }, s), {
    intervalMs: 30_000,
  });

  useEffect(() => {
    document.title = "Usage · Assay";
  }, []);

  const users = useMemo(() => daily(byUser.data, since), [byUser.data, since]);
  const pools = useMemo(() => daily(byPool.data, since), [byPool.data, since]);
  const own = byUser.data !== undefined && !byUser.data.all_users;

  return (
    <div className="page" data-testid="usage-page">
      <div className="page-title">
        <h1>Usage</h1>
        <div className="spacer" />
        <label>
          Window{" "}
          <select
            value={days}
            data-testid="usage-window"
            onChange={(e) => set({ days: e.target.value === "30" ? null : e.target.value })}
          >
            {WINDOWS.map((d) => (
              <option key={d} value={d}>
                last {d} days
              </option>
            ))}
          </select>
        </label>
      </div>
      <p className="muted" data-testid="usage-scope">
        Slot-hours from {since} (UTC) to now{own ? ": your own usage only" : ", every user's"}.
      </p>
      {byUser.error && <ErrorPanel error={byUser.error} title="Cannot read usage" />}
      <Section title="By user">
        {byUser.loading && !byUser.error && <Loading what="usage" />}
        {byUser.data && (
          <>
            <UsageChart data={users} what="user" testId="usage-by-user" />
            <Totals data={users} header="User" testId="usage-users" />
          </>
        )}
      </Section>
      {byPool.error && <ErrorPanel error={byPool.error} title="Cannot read usage by pool" />}
      <Section title="By pool">
        {byPool.loading && !byPool.error && <Loading what="usage" />}
        {byPool.data && (
          <>
            <UsageChart data={pools} what="pool" testId="usage-by-pool" />
            <Totals data={pools} header="Pool" testId="usage-pool-totals" />
            {byPool.data.pools.length > 0 && <Pools pools={byPool.data.pools} />}
          </>
        )}
      </Section>
    </div>
  );
}
