// `/cluster`: agents with their slots and devices, totals, and the queue of trials.
import { useEffect, useState } from "react";
import { Link } from "react-router";
import { api, num, servedRoutes, type Agent, type QueuedTrial, type ResourcePool, type Slot } from "../api";
import { ErrorPanel, Loading, Meter, Section } from "../components/ui";
import { fmtBytes, fmtTime } from "../format";
import { usePoll, useSession } from "../hooks";

const QUEUE_ROUTE = "/api/v1/queue";
const POOLS_ROUTE = "/api/v1/resource-pools";
const DRAIN_ROUTE = "/api/v1/agents/{id}/drain";
const ENABLE_ROUTE = "/api/v1/agents/{id}/enable";
const BIND_ROUTE = "/api/v1/resource-pools/{pool}/bind";

// Whether a trial holds the slot: the master leaves out the ids of a trial in a workspace
// the user is not in, and says `busy`.
const taken = (s: Slot): boolean => Boolean(s.busy || s.allocation_id);

function useServedRoutes(): Set<string> | undefined {
  const [routes, setRoutes] = useState<Set<string>>();
  useEffect(() => {
    let alive = true;
    void servedRoutes().then((r) => alive && setRoutes(r));
    return () => {
      alive = false;
    };
  }, []);
  return routes;
}

export function ClusterPage() {
  const agents = usePoll("agents", (s) => api.agents(s));
  const routes = useServedRoutes();
  const hasQueue = routes?.has(QUEUE_ROUTE) ?? false;
  const hasPools = routes?.has(POOLS_ROUTE) ?? false;
  const { user } = useSession();
  // Only administrators may enable or disable agents: others do not get the buttons.
  const served = routes ? [...routes].some((r) => r === ENABLE_ROUTE || /^\/api\/v1\/agents\/\{[^}]+\}\/enable$/.test(r)) : false;
  const canToggle = served && user?.admin === true;
  const canDrain = canToggle && (routes?.has(DRAIN_ROUTE) ?? false);
  const [actionError, setActionError] = useState<unknown>(null);
  const [busy, setBusy] = useState<string | null>(null);

  useEffect(() => {
    document.title = "Cluster · Assay";
  }, []);

  const list = agents.data?.agents ?? [];
  const slots = list.flatMap((a) => a.slots);
  const busySlots = slots.filter(taken).length;
  const usable = list.filter((a) => a.connected && a.enabled).flatMap((a) => a.slots.filter((s) => s.enabled));
  const free = usable.filter((s) => !taken(s)).length;
  const canBind = user?.admin === true && (routes?.has(BIND_ROUTE) ?? false);

  const toggle = async (a: Agent, drain = false) => {
    setBusy(a.id);
    try {
      await (drain ? api.drainAgent(a.id) : api.setAgentEnabled(a.id, !a.enabled));
      setActionError(null);
    } catch (e) {
      setActionError(e);
    } finally {
      setBusy(null);
      agents.reload();
    }
  };

  return (
    <div className="page">
      <div className="page-title">
        <h1>Cluster</h1>
      </div>
      {agents.data && (
        <div className="totals" data-testid="cluster-totals">
          <Total label="Agents" value={`${list.filter((a) => a.connected).length} / ${list.length}`} hint="connected / all" />
          <Total label="Slots" value={String(slots.length)} />
          <Total label="Busy" value={String(busySlots)} />
          <Total label="Free" value={String(free)} hint="on connected, enabled agents" />
          <Total
            label="Devices"
            value={String(list.reduce((n, a) => n + a.devices.length, 0))}
          />
        </div>
      )}
      {actionError !== null && <ErrorPanel error={actionError} title="Cannot change the agent" />}
      {agents.error && <ErrorPanel error={agents.error} title="Cannot list agents" />}
      <Section title="Agents">
        {agents.loading && !agents.error && <Loading what="agents" />}
        {agents.data && (
          <div className="table-wrap">
            <table className="table" data-testid="agents">
              <thead>
                <tr>
                  <th>Agent</th>
                  <th>Status</th>
                  <th>Slots</th>
                  <th>Devices</th>
                  <th>CPU</th>
                  <th>Memory</th>
                  <th>Heartbeat</th>
                  {canToggle && <th />}
                </tr>
              </thead>
              <tbody>
                {list.map((a) => (
                  <tr key={a.id} data-testid="agent-row" data-id={a.id} className={a.connected ? undefined : "dim"}>
                    <td>
                      <div className="strong">{a.id}</div>
                      <div className="muted small mono">{a.address}</div>
                      {a.resource_pool && (
                        <div className="muted small" data-testid="agent-pool">
                          pool {a.resource_pool}
                          {a.agent_label ? ` · label ${a.agent_label}` : ""}
                        </div>
                      )}
                    </td>
                    <td>
                      <span className={`state state-${a.connected ? "active" : "stopped"}`}>
                        {a.connected ? "connected" : "disconnected"}
                      </span>{" "}
                      {!a.enabled && (
                        <span className="state state-paused" data-testid="agent-state">
                          {a.draining && a.slots.some(taken) ? "draining" : "disabled"}
                        </span>
                      )}
                    </td>
                    <td>
                      <div className="slots">
                        {a.slots.map((s) => (
                          <span
                            key={s.index}
                            className={`slot ${taken(s) ? "slot-busy" : "slot-free"} ${s.enabled ? "" : "slot-off"}`}
                            title={`slot ${s.index} (${s.type.replace("SLOT_TYPE_", "").toLowerCase()})${s.enabled ? "" : ", disabled"}`}
                          >
                            {s.index}:{" "}
                            {s.allocation_id && num(s.trial_id) > 0 ? (
                              <Link to={`/trials/${s.trial_id}`}>trial {String(s.trial_id)}</Link>
                            ) : taken(s) ? (
                              "busy"
                            ) : (
                              "free"
                            )}
                          </span>
                        ))}
                      </div>
                    </td>
                    <td>
                      {a.devices.map((d) => (
                        <div key={`${d.index}-${d.uuid}`} className="device">
                          <span className="device-name" title={d.uuid}>
                            {d.type === "SLOT_TYPE_CUDA" ? "GPU" : "CPU"} {d.index} · {d.name || "unknown"}
                            {num(d.memory_bytes) > 0 && <span className="muted"> · {fmtBytes(num(d.memory_bytes))}</span>}
                          </span>
                          <Meter value={num(d.utilization)} />
                        </div>
                      ))}
                      {a.devices.length === 0 && <span className="muted">–</span>}
                    </td>
                    <td>
                      <Meter value={num(a.cpu_utilization)} />
                    </td>
                    <td>
                      <Meter
                        value={num(a.memory_used_fraction)}
                        label={`${Math.round(num(a.memory_used_fraction) * 100)}% of ${fmtBytes(num(a.memory_bytes))}`}
                      />
                    </td>
                    <td className="nowrap">{fmtTime(a.last_heartbeat)}</td>
                    {canToggle && (
                      <td>
                        <button
                          type="button"
                          disabled={busy === a.id}
                          onClick={() => void toggle(a)}
                          data-testid={a.enabled ? "agent-disable" : "agent-enable"}
                        >
                          {a.enabled ? "Disable" : "Enable"}
                        </button>
                        {canDrain && a.enabled && (
                          <button
                            type="button"
                            disabled={busy === a.id}
                            onClick={() => void toggle(a, true)}
                            data-testid="agent-drain"
                            title="Place no new trials here; running ones finish"
                          >
                            Drain
                          </button>
                        )}
                      </td>
                    )}
                  </tr>
                ))}
                {list.length === 0 && (
                  <tr>
                    <td colSpan={canToggle ? 8 : 7} className="empty">
                      No agents have registered with this master.
                    </td>
                  </tr>
                )}
              </tbody>
            </table>
          </div>
        )}
      </Section>
      {hasPools && <PoolsPanel canBind={canBind} />}
      {hasQueue && <QueuePanel />}
    </div>
  );
}

function Total({ label, value, hint }: { label: string; value: string; hint?: string }) {
  return (
    <div className="total" title={hint}>
      <div className="total-value">{value}</div>
      <div className="total-label">{label}</div>
    </div>
  );
}

function poolSlots(p: ResourcePool): string {
  const kinds = p.slots ?? [];
  if (kinds.length === 0) return "none";
  return kinds
    .map((s) => `${s.used ?? 0} / ${s.total ?? 0} ${s.slot_type === "SLOT_TYPE_CUDA" ? "GPU" : "CPU"} busy`)
    .join(", ");
}

function PoolsPanel({ canBind }: { canBind: boolean }) {
  const pools = usePoll("resource-pools", (s) => api.resourcePools(s));
  const rows: ResourcePool[] = pools.data?.pools ?? [];
  const [bindError, setBindError] = useState<unknown>(null);
  const change = async (pool: string, workspace: string, bind: boolean) => {
    try {
      await api.bindPool(pool, workspace, bind);
      setBindError(null);
    } catch (e) {
      setBindError(e);
    } finally {
      pools.reload();
    }
  };
  return (
    <Section title="Resource pools">
      <div data-testid="pools">
        {pools.error && <ErrorPanel error={pools.error} title="Cannot list the resource pools" />}
        {bindError !== null && <ErrorPanel error={bindError} title="Cannot change the pool's workspaces" />}
        {pools.loading && !pools.error && <Loading what="resource pools" />}
        {pools.data && (
          <table className="table">
            <thead>
              <tr>
                <th>Pool</th>
                <th>Scheduler</th>
                <th className="num">Agents</th>
                <th>Slots</th>
                <th className="num">Queued</th>
                <th title="A bound pool takes experiments of its workspaces only">Workspaces</th>
              </tr>
            </thead>
            <tbody>
              {rows.map((p) => (
                <tr key={p.name} data-testid="pool-row" data-id={p.name}>
                  <td>
                    <div className="strong">
                      {p.name}
                      {p.default ? <span className="muted"> (default)</span> : null}
                    </div>
                    {p.description && <div className="muted small">{p.description}</div>}
                  </td>
                  <td>{p.scheduler}</td>
                  <td className="num" title={(p.agents ?? []).join(", ")}>
                    {(p.agents ?? []).length}
                  </td>
                  <td data-testid="pool-slots">{poolSlots(p)}</td>
                  <td className="num">{p.queued_trials ?? 0}</td>
                  <td data-testid="pool-workspaces">
                    <PoolWorkspaces pool={p} canBind={canBind} onChange={change} />
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
      </div>
    </Section>
  );
}

// A pool's bound workspaces ("all" when it has none); admins remove the bindings made
// here (not the settings' own) and add one by the workspace's name.
function PoolWorkspaces({
  pool,
  canBind,
  onChange,
}: {
  pool: ResourcePool;
  canBind: boolean;
  onChange: (pool: string, workspace: string, bind: boolean) => Promise<void>;
}) {
  const [name, setName] = useState("");
  const bindings = pool.bindings ?? [];
  return (
    <div>
      {bindings.length === 0 && <span className="muted">all</span>}
      {bindings.map((b) => (
        <span key={b.workspace} className="chip" data-testid="pool-binding" title={b.from_settings ? "bound by the master's settings" : undefined}>
          {b.workspace}
          {canBind && !b.from_settings && (
            <button
              type="button"
              className="link"
              aria-label={`unbind ${b.workspace}`}
              data-testid="pool-unbind"
              onClick={() => void onChange(pool.name, b.workspace, false)}
            >
              ×
            </button>
          )}{" "}
        </span>
      ))}
      {canBind && (
        <form
          className="inline"
          onSubmit={(e) => {
            e.preventDefault();
            if (name.trim()) void onChange(pool.name, name.trim(), true).then(() => setName(""));
          }}
        >
          <input
            value={name}
            onChange={(e) => setName(e.target.value)}
            placeholder="workspace"
            aria-label={`bind ${pool.name} to a workspace`}
            data-testid="pool-bind-name"
            size={12}
          />
          <button type="submit" data-testid="pool-bind">
            Bind
          </button>
        </form>
      )}
    </div>
  );
}

// What a queued trial waits for: the scheduler's reason in words, or plain free slots.
function waitText(r: QueuedTrial): string {
  if (!r.waiting || r.wait_kind === "no_free_slots") return r.waiting ? `free slots: ${r.waiting}` : "free slots";
  const label: Record<string, string> = {
    max_slots: "max_slots",
    quota: "user quota",
    share: "fair share",
    priority: "its turn",
  };
  return `${label[r.wait_kind ?? ""] ?? r.wait_kind}: ${r.waiting}`;
}

function QueuePanel() {
  const queue = usePoll("queue", (s) => api.queue(s));
  const rows: QueuedTrial[] = queue.data?.trials ?? [];
  return (
    <Section title={`Queue${queue.data ? ` (${rows.length})` : ""}`}>
      <div data-testid="queue">
        {queue.error && <ErrorPanel error={queue.error} title="Cannot read the queue" />}
        {queue.loading && !queue.error && <Loading what="queue" />}
        {queue.data && (
          <table className="table">
            <thead>
              <tr>
                <th className="num">#</th>
                <th>Trial</th>
                <th>Experiment</th>
                <th className="num">Priority</th>
                <th className="num">Slots</th>
                <th>Waiting for</th>
              </tr>
            </thead>
            <tbody>
              {rows.map((r, i) => (
                <tr key={String(r.trial_id)} data-testid="queue-row" data-id={String(r.trial_id)}>
                  <td className="num" data-testid="queue-position">
                    {r.position || i + 1}
                  </td>
                  <td>
                    <Link to={`/trials/${r.trial_id}`}>{String(r.trial_id)}</Link>
                  </td>
                  <td>
                    <Link to={`/experiments/${r.experiment_id}`}>
                      {String(r.experiment_id)}
                      {r.experiment_name ? ` · ${r.experiment_name}` : ""}
                    </Link>
                  </td>
                  <td className="num">{r.priority}</td>
                  <td className="num">
                    {r.slots} {r.slot_type === "SLOT_TYPE_CUDA" ? "GPU" : r.slot_type === "SLOT_TYPE_CPU" ? "CPU" : ""}
                    {r.resource_pool ? <span className="muted" data-testid="queue-pool"> · {r.resource_pool}</span> : null}
                  </td>
                  <td
                    data-testid="queue-reason"
                    data-kind={r.wait_kind || undefined}
                    className={r.reason ? "warn" : undefined}
                  >
                    {r.reason ? `cannot start: ${r.reason}` : waitText(r)}
                  </td>
                </tr>
              ))}
              {rows.length === 0 && (
                <tr>
                  <td colSpan={6} className="empty">
                    No trials are waiting for slots.
                  </td>
                </tr>
              )}
            </tbody>
          </table>
        )}
      </div>
    </Section>
  );
}
