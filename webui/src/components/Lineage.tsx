// A population-based search's lineage: which trial a copy started from and in which
// round, on the experiment's trials table, as a small view with a column per round, and
// on the trial page.
import { useMemo } from "react";
import { Link } from "react-router";
import { api, num, type Checkpoint, type ExperimentDetail, type JsonObject, type MetricsReport, type Trial } from "../api";
import { usePoll } from "../hooks";
import { fmtInt } from "../format";
import { Section } from "./ui";
import "./search-views.css";

function isPbt(config: JsonObject | undefined): boolean {
  const s = config?.["searcher"];
  return typeof s === "object" && s !== null && !Array.isArray(s) && s["name"] === "pbt";
}

function hasParent(t: Trial): boolean {
  return t.parent_trial_id !== undefined && t.parent_trial_id !== null;
}

/** Whether the experiment's trials have a lineage to show: a pbt search, or a copy. */
export function showsLineage(detail: ExperimentDetail): boolean {
  return isPbt(detail.experiment.config) || detail.trials.some(hasParent);
}

/** The round a trial was created in: a copy's, else 0 (the first population). */
function roundOf(t: Trial): number {
  return hasParent(t) ? (t.search_round ?? 0) : 0;
}

/** The trials table's cell: "round 2 · copied from trial 7", or "round 0". */
export function LineageCell({ t }: { t: Trial }) {
  const round = roundOf(t);
  return (
    <span
      data-testid="trial-lineage-cell"
      data-round={String(round)}
      data-parent={hasParent(t) ? String(t.parent_trial_id) : ""}
    >
      round {round}
      {hasParent(t) && (
        <>
          {" · copied from "}
          <Link to={`/trials/${String(t.parent_trial_id)}`}>trial {String(t.parent_trial_id)}</Link>
        </>
      )}
    </span>
  );
}

/** Every trial in the column of the round that created it, a copy naming its parent. */
export function LineagePanel({ detail }: { detail: ExperimentDetail }) {
  const rounds = useMemo(() => {
    const byRound = new Map<number, Trial[]>();
    for (const t of [...detail.trials].sort((a, b) => num(a.id) - num(b.id))) {
      const r = roundOf(t);
      byRound.set(r, [...(byRound.get(r) ?? []), t]);
    }
    const last = Math.max(0, ...byRound.keys());
    return Array.from({ length: last + 1 }, (_, r) => byRound.get(r) ?? []);
  }, [detail.trials]);
  if (!showsLineage(detail)) return null;
  return (
    <Section title="Lineage">
      <div className="lineage" data-testid="lineage" data-rounds={String(rounds.length)}>
        {rounds.map((trials, r) => (
          <div key={r} className="lineage-round" data-testid="lineage-round" data-round={String(r)}>
            <div className="label">Round {r}</div>
            {trials.map((t) => (
              <div
                key={String(t.id)}
                className="lineage-trial"
                data-testid="lineage-trial"
                data-id={String(t.id)}
                data-parent={hasParent(t) ? String(t.parent_trial_id) : ""}
              >
                <Link to={`/trials/${String(t.id)}`}>trial {String(t.id)}</Link>
                {hasParent(t) && (
                  <span className="muted small">
                    {" ← "}
                    <Link to={`/trials/${String(t.parent_trial_id)}`}>{String(t.parent_trial_id)}</Link>
                  </span>
                )}
              </div>
            ))}
            {trials.length === 0 && <div className="muted small">no new trial</div>}
          </div>
        ))}
      </div>
      <div className="hint">
        Each round&apos;s column holds the trials it created; a copy names the trial whose checkpoint it started from
        (← N). The first population is round 0.
      </div>
    </Section>
  );
}

/** The batch count of the checkpoint a copy started from: its own latest checkpoint while
 * that is still its parent's, else the parent's latest checkpoint before the copy's first
 * report (a copy reports only batches it trained past that checkpoint). */
export function startBatch(t: Trial, parentCheckpoints: Checkpoint[], firstReport: number | undefined): number | undefined {
  const named = parentCheckpoints.find((c) => c.uuid === t.latest_checkpoint);
  if (named) return num(named.total_batches);
  if (firstReport === undefined) return undefined;
  let best: number | undefined;
  for (const c of parentCheckpoints) {
    const b = num(c.total_batches);
    if (b < firstReport && (best === undefined || b > best)) best = b;
  }
  return best;
}

/** The trial page's line: "Started from trial 7's checkpoint at batch 400 (round 2)". */
export function TrialLineage({ t, byGroup }: { t: Trial; byGroup: Record<string, MetricsReport[]> | undefined }) {
  const parent = hasParent(t) ? String(t.parent_trial_id) : "";
  const checkpoints = usePoll(
    `lineage-ckpt:${parent}`,
    (signal) => (parent ? api.checkpoints({ trial_id: parent }, signal) : Promise.resolve(null)),
    { active: false },
  );
  if (!parent) return null;
  const reported = Object.values(byGroup ?? {})
    .flat()
    .map((r) => num(r.total_batches))
    .filter(Number.isFinite);
  const first = reported.length > 0 ? Math.min(...reported) : undefined;
  const batch = checkpoints.data ? startBatch(t, checkpoints.data.checkpoints, first) : undefined;
  return (
    <p
      className="lineage-line"
      data-testid="trial-lineage"
      data-parent={parent}
      data-round={String(t.search_round ?? 0)}
      data-batch={batch === undefined ? "" : String(batch)}
    >
      Started from <Link to={`/trials/${parent}`}>trial {parent}</Link>&apos;s checkpoint
      {batch !== undefined && ` at batch ${fmtInt(batch)}`} (round {t.search_round ?? 0})
    </p>
  );
}
