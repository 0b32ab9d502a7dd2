// `/experiments/:id`: header and actions, learning curves of every trial, hyperparameter
// plots, the trials, the best checkpoint and the config.
import { useCallback, useEffect, useMemo, useState } from "react";
import { Link, useParams } from "react-router";
import { api, num, type Checkpoint, type Experiment, type ExperimentDetail, type Trial } from "../api";
import { CURVE_POINTS, CurvesPanel } from "../components/CurvesPanel";
import { DeleteExperimentButton } from "../components/DeleteExperimentDialog";
import { ForkButton } from "../components/ForkDialog";
import { RegisterCheckpoint } from "../components/RegisterModel";
import { HparamPlots, hparamAxes, type HpPoint } from "../components/HparamPlots";
import { LineageCell, LineagePanel, showsLineage } from "../components/Lineage";
import { ParetoPanel } from "../components/Pareto";
import {
  CopyCommand,
  ErrorPanel,
  ExperimentActions,
  Loading,
  Progress,
  Section,
  StateBadge,
  WaitingNote,
  downloadCommand,
} from "../components/ui";
import {
  fmtBytes,
  fmtDuration,
  fmtInt,
  fmtNumber,
  fmtTime,
  fmtValue,
  hparamSpecs,
  isTerminal,
  plural,
  searcherInfo,
  toYaml,
} from "../format";
import { toggleSelected, useSelection } from "../selection";
import { usePoll, useQueryState, useSession } from "../hooks";
import { projectPath } from "./ExperimentListPage";
import { fmtSlotHours } from "./UsagePage";

export function ExperimentPage() {
  const { id = "" } = useParams();
  const [param, setParam] = useQueryState();
  const valid = /^\d+$/.test(id);

  // The experiment and (when the URL names the metric) its curves load in parallel.
  const detail = usePoll(`exp:${id}`, (signal) =>
    valid ? api.experiment(id, signal) : Promise.reject(new Error(`"${id}" is not an experiment id`)),
  );
  const exp = detail.data?.experiment;
  const searcher = searcherInfo(exp?.config);
  const group = param("group") ?? "validation";
  const metric = param("metric") ?? (group !== "validation" ? "" : searcher.metric);
  const running = exp ? !isTerminal(exp.state) : true;

  const curves = usePoll(
    `curves:${id}:${group}:${metric}`,
    (signal) =>
      valid && metric
        ? api.experimentMetrics(id, { name: metric, group, max_points: CURVE_POINTS }, signal)
        : Promise.resolve(null),
    { active: running, backoff: 5 },
  );

  const [actionError, setActionError] = useState<unknown>(null);
  const [override, setOverride] = useState<Experiment | null>(null);
  useEffect(() => setOverride(null), [detail.data]);

  useEffect(() => {
    document.title = exp ? `${exp.name} (${String(exp.id)}) · Assay` : `Experiment ${id} · Assay`;
  }, [exp, id]);

  if (!valid) return <PageError error={new Error(`"${id}" is not an experiment id`)} />;
  if (detail.error && !detail.data) return <PageError error={detail.error} />;
  if (!detail.data || !exp) {
    return (
      <div className="page">
        <Loading what={`experiment ${id}`} />
      </div>
    );
  }
  const shown = override ?? exp;
  const curvesSettled = !metric || curves.data !== undefined || curves.error !== undefined;
  return (
    <div className="page">
      <Header
        e={shown}
        slotSeconds={num(detail.data.slot_seconds ?? 0)}
        onDone={(u, err) => {
          setActionError(err ?? null);
          if (u) setOverride(u);
          detail.reload();
        }}
      />
      {actionError !== null && <ErrorPanel error={actionError} title="The action failed" />}
      {detail.error && <ErrorPanel error={detail.error} title="Refreshing failed; showing the last data" />}
      <CurvesPanel
        detail={detail.data}
        metric={metric}
        group={group}
        curves={curves.data?.curves}
        curvesError={curves.error}
        running={running}
        param={param}
        setParam={setParam}
      />
      <HparamsPanel detail={detail.data} />
      <ParetoPanel detail={detail.data} />
      <TrialsPanel detail={detail.data} />
      <LineagePanel detail={detail.data} />
      <div className="two-col">
        {/* Asked for once the curves are in, so as not to slow the master down meanwhile. */}
        {curvesSettled ? (
          <BestCheckpoint experimentId={id} e={exp} trials={detail.data.trials} running={running} />
        ) : (
          <Section title="Best checkpoint">
            <Loading />
          </Section>
        )}
        <Section title="Config">
          <pre className="config" data-testid="config">
            {exp.config_yaml || (exp.config ? toYaml(exp.config) : "(none)")}
          </pre>
        </Section>
      </div>
    </div>
  );
}

function PageError({ error }: { error: unknown }) {
  return (
    <div className="page">
      <ErrorPanel error={error} title="Cannot show this experiment" />
      <p>
        <Link to="/">Back to the experiments</Link>
      </p>
    </div>
  );
}

function Header({
  e,
  slotSeconds,
  onDone,
}: {
  e: Experiment;
  slotSeconds: number;
  onDone: (u: Experiment | null, err?: unknown) => void;
}) {
  const best = num(e.best_validation);
  const { user } = useSession();
  // The master tells usage to the experiment's owner and to admins only.
  const seesUsage = user !== null && (user.admin || user.username === e.owner);
  const { metric, smallerIsBetter } = searcherInfo(e.config);
  return (
    <div className="exp-header">
      <div className="exp-title">
        <h1>
          <span className="muted">Experiment {String(e.id)}</span> {e.name}
        </h1>
        <StateBadge state={e.state} testId="experiment-state" />
        {e.archived && <span className="chip chip-muted">archived</span>}
        {e.labels.map((l) => (
          <span key={l} className="chip">
            {l}
          </span>
        ))}
        <div className="spacer" />
        <ExperimentActions experiment={e} onDone={onDone} />
        <ForkButton experiment={e} />
        <DeleteExperimentButton experiment={e} />
      </div>
      {e.waiting && (
        <div className="notice waiting" data-testid="experiment-waiting">
          <strong>Waiting:</strong> its trials cannot start on this cluster as it is: each {e.waiting}. They
          start when agents that can hold them connect or are enabled.
        </div>
      )}
      {e.description && <p className="description">{e.description}</p>}
      <dl className="facts">
        <div>
          <dt>Searcher</dt>
          <dd>{e.searcher || "–"}</dd>
        </div>
        <div>
          <dt>Progress</dt>
          <dd>
            <Progress value={num(e.progress)} />
          </dd>
        </div>
        <div>
          <dt>Best {metric || "metric"}</dt>
          <dd>
            {fmtNumber(best)} <span className="muted">({smallerIsBetter ? "smaller" : "larger"} is better)</span>
          </dd>
        </div>
        <div>
          <dt>Trials</dt>
          <dd>{e.num_trials}</dd>
        </div>
        {e.project && (
          <div>
            <dt>Project</dt>
            <dd data-testid="experiment-project">
              <Link to={projectPath(e.workspace ?? "", e.project)}>
                {e.workspace}/{e.project}
              </Link>
            </dd>
          </div>
        )}
        <div>
          <dt>Owner</dt>
          <dd>{e.owner || "–"}</dd>
        </div>
        <div>
          <dt>Priority</dt>
          <dd>{e.priority}</dd>
        </div>
        <div>
          <dt>Started</dt>
          <dd>{fmtTime(e.start_time)}</dd>
        </div>
        <div>
          <dt>Duration</dt>
          <dd>{fmtDuration(e.start_time, e.end_time)}</dd>
        </div>
        <div>
          <dt title="slots held by its trials, times how long">Slot-hours</dt>
          <dd data-testid="experiment-slot-hours">{seesUsage ? fmtSlotHours(slotSeconds / 3600) : "–"}</dd>
        </div>
      </dl>
    </div>
  );
}

// -- hyperparameters ---------------------------------------------------------------------

function HparamsPanel({ detail }: { detail: ExperimentDetail }) {
  const e = detail.experiment;
  const { metric, smallerIsBetter } = searcherInfo(e.config);
  const specs = useMemo(() => hparamSpecs(e.config), [e.config]);
  const points = useMemo<HpPoint[]>(
    () =>
      detail.trials.map((t) => ({
        id: String(t.id),
        hparams: t.hparams ?? {},
        metric: num(t.best_validation),
      })),
    [detail.trials],
  );
  return (
    <Section title={`Hyperparameters vs. best ${metric || "metric"}`}>
      <HparamPlots specs={specs} points={points} metric={metric || "metric"} smallerIsBetter={smallerIsBetter} />
    </Section>
  );
}

// -- trials ------------------------------------------------------------------------------

type TrialSort = { key: string; asc: boolean };

function TrialsPanel({ detail }: { detail: ExperimentDetail }) {
  const picked = useSelection();
  const e = detail.experiment;
  const { metric, smallerIsBetter } = searcherInfo(e.config);
  const specs = useMemo(() => hparamSpecs(e.config), [e.config]);
  const hpNames = useMemo(() => {
    const points = detail.trials.map((t) => ({ id: String(t.id), hparams: t.hparams ?? {}, metric: NaN }));
    return hparamAxes(specs, points).map((a) => a.name);
  }, [specs, detail.trials]);
  const [sort, setSort] = useState<TrialSort>({ key: "id", asc: true });
  const lineage = showsLineage(detail);

  const value = useCallback(
    (t: Trial, key: string): number | string => {
      switch (key) {
        case "id":
          return num(t.id);
        case "state":
          return t.state;
        case "batches":
          return num(t.total_batches);
        case "best": {
          const v = num(t.best_validation);
          return Number.isFinite(v) ? v : smallerIsBetter ? Infinity : -Infinity;
        }
        case "restarts":
          return t.restarts;
        default: {
          const v = t.hparams?.[key.slice(3)];
          return typeof v === "number" ? v : fmtValue(v);
        }
      }
    },
    [smallerIsBetter],
  );
  const rows = useMemo(() => {
    const out = [...detail.trials];
    out.sort((a, b) => {
      const va = value(a, sort.key);
      const vb = value(b, sort.key);
      const c = typeof va === "number" && typeof vb === "number" ? va - vb : String(va).localeCompare(String(vb));
      return sort.asc ? c : -c;
    });
    return out;
  }, [detail.trials, sort, value]);

  const th = (key: string, title: string, className?: string) => (
    <th
      className={`sortable ${sort.key === key ? "sorted" : ""} ${className ?? ""}`}
      onClick={() => setSort((s) => ({ key, asc: s.key === key ? !s.asc : key !== "best" || smallerIsBetter }))}
    >
      {title}
      {sort.key === key && <span className="sort-arrow">{sort.asc ? "▲" : "▼"}</span>}
    </th>
  );
  return (
    <Section title={`Trials (${detail.trials.length})`}>
      <div className="table-wrap tall">
        <table className="table" data-testid="trials">
          <thead>
            <tr>
              <th className="pick">
                <input
                  type="checkbox"
                  title="Pick every trial to compare"
                  aria-label="Pick every trial to compare"
                  checked={rows.length > 0 && rows.every((t) => picked.trials.includes(String(t.id)))}
                  onChange={(e) => rows.forEach((t) => toggleSelected("trials", String(t.id), e.target.checked))}
                  data-testid="pick-all-trials"
                />
              </th>
              {th("id", "Trial", "num")}
              {th("state", "State")}
              {hpNames.map((n) => th(`hp:${n}`, n, "num"))}
              {th("batches", "Batches", "num")}
              {th("best", `Best ${metric || "metric"}`, "num")}
              {th("restarts", "Restarts", "num")}
              {lineage && <th>Lineage</th>}
              <th>Checkpoint</th>
            </tr>
          </thead>
          <tbody>
            {rows.map((t) => (
              <tr key={String(t.id)} data-testid="trial-row" data-id={String(t.id)}>
                <td className="pick">
                  <input
                    type="checkbox"
                    title="Pick to compare"
                    aria-label={`Pick trial ${String(t.id)} to compare`}
                    checked={picked.trials.includes(String(t.id))}
                    onChange={(e) => toggleSelected("trials", String(t.id), e.target.checked)}
                    data-testid="pick-trial"
                  />
                </td>
                <td className="num">
                  <Link to={`/trials/${t.id}`}>{String(t.id)}</Link>
                </td>
                <td>
                  <StateBadge state={t.state} />
                  {t.waiting && <WaitingNote why={t.waiting} />}
                  {t.last_error && (
                    <span className="error-mark" title={t.last_error}>
                      !
                    </span>
                  )}
                </td>
                {hpNames.map((n) => (
                  <td key={n} className="num">
                    {fmtValue(t.hparams?.[n])}
                  </td>
                ))}
                <td className="num">{fmtInt(num(t.total_batches))}</td>
                <td className="num">{fmtNumber(num(t.best_validation))}</td>
                <td className="num">{t.restarts}</td>
                {lineage && (
                  <td className="nowrap">
                    <LineageCell t={t} />
                  </td>
                )}
                <td className="mono small">{t.latest_checkpoint ? t.latest_checkpoint.slice(0, 8) : "–"}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </Section>
  );
}

// -- best checkpoint ---------------------------------------------------------------------

function pickBest(checkpoints: Checkpoint[], metric: string, smallerIsBetter: boolean): Checkpoint | undefined {
  const live = checkpoints.filter((c) => c.state !== "CHECKPOINT_STATE_DELETED");
  let best: Checkpoint | undefined;
  let bestV = NaN;
  for (const c of live) {
    const v = num(c.validation_metrics[metric]);
    if (!Number.isFinite(v)) continue;
    if (!best || (smallerIsBetter ? v < bestV : v > bestV)) {
      best = c;
      bestV = v;
    }
  }
  return best;
}

function BestCheckpoint({
  experimentId,
  e,
  trials,
  running,
}: {
  experimentId: string;
  e: Experiment;
  trials: Trial[];
  running: boolean;
}) {
  const cps = usePoll(`ckpt:${experimentId}`, (signal) => api.checkpoints({ experiment_id: experimentId }, signal), {
    active: running,
    intervalMs: 10_000,
  });
  const { metric, smallerIsBetter } = searcherInfo(e.config);
  const all = cps.data?.checkpoints ?? [];
  const byMetrics = pickBest(all, metric, smallerIsBetter);
  // Without validation metrics on checkpoints: the latest checkpoint of the best trial.
  const bestTrial = useMemo(() => {
    let best: Trial | undefined;
    for (const t of trials) {
      const v = num(t.best_validation);
      if (!Number.isFinite(v) || !t.latest_checkpoint) continue;
      const bv = best ? num(best.best_validation) : NaN;
      if (!best || (smallerIsBetter ? v < bv : v > bv)) best = t;
    }
    return best;
  }, [trials, smallerIsBetter]);
  const ofBestTrial = bestTrial ? all.find((c) => c.uuid === bestTrial.latest_checkpoint) : undefined;
  const shown = byMetrics ?? ofBestTrial;
  return (
    <Section title="Best checkpoint">
      {cps.error && <ErrorPanel error={cps.error} title="Cannot list checkpoints" />}
      {cps.loading && <Loading />}
      {cps.data && !shown && <div className="empty">No checkpoints yet.</div>}
      {shown && (
        <div className="checkpoint" data-testid="best-checkpoint">
          <p className="muted small">
            {byMetrics
              ? `The checkpoint with the best ${metric} in its validation metrics.`
              : `The latest checkpoint of trial ${String(bestTrial?.id)}, the trial with the best ${metric} (${fmtNumber(num(bestTrial?.best_validation))}).`}
          </p>
          <dl className="kv">
            <dt>UUID</dt>
            <dd className="mono">{shown.uuid}</dd>
            <dt>Trial</dt>
            <dd>
              <Link to={`/trials/${shown.trial_id}`}>{String(shown.trial_id)}</Link>
            </dd>
            <dt>Batches</dt>
            <dd>{fmtInt(num(shown.total_batches))}</dd>
            {Object.entries(shown.validation_metrics).map(([k, v]) => (
              <MetricRow key={k} name={k} value={num(v)} />
            ))}
            <dt>Files</dt>
            <dd>
              {shown.files.length} ({fmtBytes(shown.files.reduce((n, f) => n + num(f.size_bytes), 0))})
            </dd>
            <dt>Location</dt>
            <dd className="mono small">{shown.location}</dd>
          </dl>
          <div className="label">Download</div>
          <CopyCommand command={downloadCommand(shown.uuid)} />
          <div className="label">Model registry</div>
          <RegisterCheckpoint uuid={shown.uuid} />
          <div className="muted small" data-testid="checkpoint-count">
            {plural(all.length, "checkpoint")} in this experiment.
          </div>
        </div>
      )}
    </Section>
  );
}

function MetricRow({ name, value }: { name: string; value: number }) {
  return (
    <>
      <dt>{name}</dt>
      <dd>{fmtNumber(value)}</dd>
    </>
  );
}
