// `/trials/:id`: state and runs, metrics charts, hyperparameters, checkpoints, live log.
import { useEffect, useMemo } from "react";
import { Link, useParams } from "react-router";
import { api, num, type Double, type MetricsReport, type Trial } from "../api";
import { TrialLineage } from "../components/Lineage";
import { LogViewer } from "../components/LogViewer";
import { RegisterCheckpoint } from "../components/RegisterModel";
import { RankUsageTable } from "../components/RankUsageTable";
import { TrialCharts } from "../components/TrialCharts";
import { CopyCommand, ErrorPanel, Loading, Section, StateBadge, downloadCommand } from "../components/ui";
import { fmtBytes, fmtDuration, fmtInt, fmtNumber, fmtTime, fmtValue, isTrialTerminal, searcherInfo, stateLabel } from "../format";
import { usePoll } from "../hooks";

const METRIC_POINTS = 1000;

export function TrialPage() {
  const { id = "" } = useParams();
  const valid = /^\d+$/.test(id);
  const trial = usePoll(`trial:${id}`, (signal) =>
    valid ? api.trial(id, signal) : Promise.reject(new Error(`"${id}" is not a trial id`)),
  );
  const t = trial.data;
  const live = t ? !isTrialTerminal(t.state) : true;

  useEffect(() => {
    document.title = `Trial ${id} · Assay`;
  }, [id]);

  if (trial.error && !t) {
    return (
      <div className="page">
        <ErrorPanel error={trial.error} title="Cannot show this trial" />
        <p>
          <Link to="/">Back to the experiments</Link>
        </p>
      </div>
    );
  }
  if (!t) {
    return (
      <div className="page">
        <Loading what={`trial ${id}`} />
      </div>
    );
  }
  return <TrialView t={t} live={live} refreshError={trial.error} />;
}

function TrialView({ t, live, refreshError }: { t: Trial; live: boolean; refreshError?: Error }) {
  const id = String(t.id);
  const expId = String(t.experiment_id);
  // The experiment only for its name and searcher metric: fetched once.
  const exp = usePoll(`trial-exp:${expId}`, (signal) => api.experiment(expId, signal), { active: false });
  const training = usePoll(`tm:${id}:training`, (s) => api.trialMetrics(id, "training", METRIC_POINTS, s), {
    active: live,
    backoff: 5,
  });
  const validation = usePoll(`tm:${id}:validation`, (s) => api.trialMetrics(id, "validation", METRIC_POINTS, s), {
    active: live,
    backoff: 5,
  });
  const checkpoints = usePoll(`ckpt-t:${id}`, (s) => api.checkpoints({ trial_id: id }, s), { active: live, intervalMs: 5000 });

  const byGroup = useMemo<Record<string, MetricsReport[]> | undefined>(() => {
    if (!training.data || !validation.data) return undefined;
    return { training: training.data.reports, validation: validation.data.reports };
  }, [training.data, validation.data]);

  const e = exp.data?.experiment;
  const { metric } = searcherInfo(e?.config);
  const hparams = Object.entries(t.hparams ?? {});
  return (
    <div className="page">
      <div className="exp-header">
        <div className="exp-title">
          <h1>
            <span className="muted">Trial</span> {id}
          </h1>
          <StateBadge state={t.state} testId="trial-state" />
          <span className="muted">
            of experiment <Link to={`/experiments/${expId}`}>{e ? `${expId} · ${e.name}` : expId}</Link>
          </span>
        </div>
        <dl className="facts">
          <div>
            <dt>Batches</dt>
            <dd>{fmtInt(num(t.total_batches))}</dd>
          </div>
          <div>
            <dt>Best {metric || "validation"}</dt>
            <dd>{fmtNumber(num(t.best_validation))}</dd>
          </div>
          <div>
            <dt>Run</dt>
            <dd>{t.run_id}</dd>
          </div>
          <div>
            <dt>Restarts</dt>
            <dd>{t.restarts}</dd>
          </div>
          <div>
            <dt>Seed</dt>
            <dd>{String(t.seed)}</dd>
          </div>
          <div>
            <dt>Started</dt>
            <dd>{fmtTime(t.start_time)}</dd>
          </div>
          <div>
            <dt>Duration</dt>
            <dd>{fmtDuration(t.start_time, t.end_time)}</dd>
          </div>
        </dl>
        <TrialLineage t={t} byGroup={byGroup} />
        {t.last_error && (
          <div className="last-error" data-testid="last-error">
            <strong>Last error{t.state === "TRIAL_STATE_ERROR" ? "" : ` (run ${t.run_id})`}:</strong> {t.last_error}
          </div>
        )}
      </div>
      {refreshError && <ErrorPanel error={refreshError} title="Refreshing failed; showing the last data" />}

      {live && (t.ranks ?? []).length > 0 && (
        <Section title="Utilisation per rank">
          <RankUsageTable ranks={t.ranks ?? []} />
        </Section>
      )}

      <Section title="Metrics">
        {(training.error || validation.error) && (
          <ErrorPanel error={training.error ?? validation.error} title="Cannot load the metrics" />
        )}
        {byGroup ? <TrialCharts byGroup={byGroup} /> : !training.error && !validation.error && <Loading what="metrics" />}
      </Section>

      <div className="two-col narrow-first">
        <Section title="Hyperparameters">
          <table className="table kv-table" data-testid="trial-hparams">
            <tbody>
              {hparams.map(([k, v]) => (
                <tr key={k}>
                  <th>{k}</th>
                  <td className="mono">{fmtValue(v)}</td>
                </tr>
              ))}
              {hparams.length === 0 && (
                <tr>
                  <td className="empty">No hyperparameters.</td>
                </tr>
              )}
            </tbody>
          </table>
        </Section>
        <Section title="Checkpoints">
          {checkpoints.error && <ErrorPanel error={checkpoints.error} title="Cannot list checkpoints" />}
          {checkpoints.loading && <Loading />}
          {checkpoints.data && (
            <div className="table-wrap">
              <table className="table checkpoint-table" data-testid="checkpoints">
                <thead>
                  <tr>
                    <th>UUID</th>
                    <th className="num">Batches</th>
                    <th>State</th>
                    <th>Metrics</th>
                    <th className="num">Size</th>
                    <th>Download</th>
                    <th>Registry</th>
                  </tr>
                </thead>
                <tbody>
                  {[...checkpoints.data.checkpoints]
                    .sort((a, b) => num(b.total_batches) - num(a.total_batches))
                    .map((c) => (
                      <tr key={c.uuid} data-testid="checkpoint-row" data-uuid={c.uuid}>
                        <td className="mono small" title={c.location}>
                          {c.uuid.slice(0, 8)}
                          {c.uuid === t.latest_checkpoint && <span className="chip">latest</span>}
                        </td>
                        <td className="num">{fmtInt(num(c.total_batches))}</td>
                        <td>{stateLabel(c.state)}</td>
                        <td className="small">
                          <CheckpointMetrics metrics={c.validation_metrics} />
                        </td>
                        <td className="num nowrap">{fmtBytes(c.files.reduce((n, f) => n + num(f.size_bytes), 0))}</td>
                        <td>
                          {c.state === "CHECKPOINT_STATE_DELETED" ? (
                            "deleted"
                          ) : (
                            <CopyCommand command={downloadCommand(c.uuid)} compact />
                          )}
                        </td>
                        <td className="nowrap">
                          {c.state !== "CHECKPOINT_STATE_DELETED" && <RegisterCheckpoint uuid={c.uuid} />}
                        </td>
                      </tr>
                    ))}
                  {checkpoints.data.checkpoints.length === 0 && (
                    <tr>
                      <td colSpan={7} className="empty">
                        No checkpoints yet.
                      </td>
                    </tr>
                  )}
                </tbody>
              </table>
            </div>
          )}
        </Section>
      </div>

      <Section title="Log">
        <LogViewer trialId={id} live={live} />
      </Section>
    </div>
  );
}

/** A checkpoint's validation metrics, one a line (a line of them overflows the card). */
function CheckpointMetrics({ metrics }: { metrics: Record<string, Double> }) {
  const entries = Object.entries(metrics).sort(([a], [b]) => a.localeCompare(b));
  if (entries.length === 0) return <>–</>;
  return (
    <>
      {entries.map(([k, v]) => (
        <div key={k} className="nowrap">
          {k} <span className="mono">{fmtNumber(num(v))}</span>
        </div>
      ))}
    </>
  );
}
