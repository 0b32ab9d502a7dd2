// The experiment page's learning curves: every trial's curve of the chosen metric and,
// beside a validation metric, a training metric's (the loss by default). A search that
// validates only at its rungs (ASHA) leaves most validation curves a single marker; the
// training curves beside them show how each trial trained.
import { useCallback, useEffect, useMemo, useState } from "react";
import { api, num, type Curve, type ExperimentDetail, type MetricName, type Trial } from "../api";
import { batchesPerEpoch, plural } from "../format";
import { usePoll } from "../hooks";
import { Curves } from "./Curves";
import { seriesColor } from "./Plot";
import { ErrorPanel, Section } from "./ui";

/** Points per trial asked of the server: enough for a wide chart, extremes kept. */
export const CURVE_POINTS = 800;
/** The `beside` query value that shows no training curves. */
const NOTHING = "none";

/** The metrics to choose from: the master's list when it sends one, else the names one
 * trial has reported (asked of the trial metrics route). */
function useMetricNames(detail: ExperimentDetail): MetricName[] | undefined {
  const fromMaster = detail.metric_names;
  const probe = useMemo(() => {
    const trials = [...detail.trials].sort((a, b) => num(b.total_batches) - num(a.total_batches));
    return trials[0] ? String(trials[0].id) : "";
  }, [detail.trials]);
  const [probed, setProbed] = useState<MetricName[] | undefined>();
  useEffect(() => {
    if (fromMaster || !probe) return;
    const controller = new AbortController();
    Promise.all(
      ["validation", "training"].map((g) =>
        api
          .trialMetrics(probe, g, 2, controller.signal)
          .then((r) => [...new Set(r.reports.flatMap((x) => Object.keys(x.metrics)))].map((name) => ({ group: g, name })))
          .catch(() => [] as MetricName[]),
      ),
    ).then((lists) => setProbed(lists.flat()), () => undefined);
    return () => controller.abort();
  }, [fromMaster, probe]);
  return fromMaster ?? probed;
}

/** The training metric drawn beside a validation metric: the one the URL names (none for
 * "none"), else `loss` when the trials report it, else the first training metric. */
export function besideMetric(group: string, chosen: string | null, training: string[]): string {
  if (group !== "validation" || chosen === NOTHING) return "";
  if (chosen) return chosen;
  return training.includes("loss") ? "loss" : (training[0] ?? "");
}

export interface CurvesPanelProps {
  detail: ExperimentDetail;
  metric: string;
  group: string;
  curves: Curve[] | undefined;
  curvesError: Error | undefined;
  /** Whether the experiment may still report (its curves are polled). */
  running: boolean;
  param: (key: string) => string | null;
  setParam: (c: Record<string, string | null>) => void;
}

export function CurvesPanel({ detail, metric, group, curves, curvesError, running, param, setParam }: CurvesPanelProps) {
  const e = detail.experiment;
  const id = String(e.id);
  const names = useMetricNames(detail);
  const options = useMemo(() => {
    const list = [...(names ?? [])];
    if (metric && !list.some((m) => m.name === metric && m.group === group)) list.unshift({ group, name: metric });
    return list.sort((a, b) => a.group.localeCompare(b.group) * -1 || a.name.localeCompare(b.name));
  }, [names, metric, group]);
  const training = useMemo(() => options.filter((o) => o.group === "training").map((o) => o.name), [options]);
  const beside = besideMetric(group, param("beside"), training);

  const bpe = batchesPerEpoch(e.config);
  const xUnit = param("x") === "epochs" && bpe ? "epochs" : "batches";
  const log = param("log") === "1";

  // Asked for once the chosen metric's curves are in, not to slow those down.
  const settled = curves !== undefined || curvesError !== undefined;
  const besideCurves = usePoll(
    `curves:${id}:training:${beside}:${settled}`,
    (signal) =>
      settled && beside
        ? api.experimentMetrics(id, { name: beside, group: "training", max_points: CURVE_POINTS }, signal)
        : Promise.resolve(null),
    { active: running && !!beside, backoff: 5 },
  );

  const byId = useMemo(() => {
    const sorted = [...detail.trials].sort((a, b) => num(a.id) - num(b.id));
    const m = new Map<string, { trial: Trial; color: string }>();
    sorted.forEach((t, i) => m.set(String(t.id), { trial: t, color: seriesColor(i) }));
    return m;
  }, [detail.trials]);
  const hparamsOf = useCallback((tid: string) => byId.get(tid)?.trial.hparams, [byId]);
  const colorOf = useCallback((tid: string) => byId.get(tid)?.color ?? "#888", [byId]);

  const groups = [...new Set(options.map((o) => o.group))];
  const withPoints = (cs: Curve[] | undefined) => (cs ?? []).filter((c) => c.values.length > 0).length;
  const drawn = withPoints(curves);
  const chart = (cs: Curve[], name: string, testId: string) => (
    <Curves
      curves={cs}
      metric={name}
      xLabel={xUnit}
      xScale={xUnit === "epochs" && bpe ? 1 / bpe : 1}
      log={log}
      hparamsOf={hparamsOf}
      colorOf={colorOf}
      height={beside ? 340 : 380}
      testId={testId}
    />
  );
  const main = (
    <>
      {curvesError && <ErrorPanel error={curvesError} title="Cannot load the curves" />}
      {!curves && !curvesError && metric && <div className="chart-placeholder">Loading curves…</div>}
      {!metric && <div className="chart-placeholder">Choose a metric to plot.</div>}
      {curves && drawn === 0 && (
        <div className="chart-placeholder" data-testid="curves" data-drawn="0">
          No trial has reported {metric} ({group}) yet.
        </div>
      )}
      {curves && drawn > 0 && chart(curves, metric, "curves")}
    </>
  );
  const besideData = besideCurves.data?.curves;
  return (
    <Section
      title="Learning curves"
      right={
        <>
          <label>
            Metric{" "}
            <select
              data-testid="metric-select"
              value={`${group}\u0000${metric}`}
              onChange={(ev) => {
                const [g, n] = ev.target.value.split("\u0000");
                setParam({ group: g ?? "validation", metric: n ?? "" });
              }}
            >
              {!metric && <option value={`${group}\u0000`}>choose a metric</option>}
              {groups.map((g) => (
                <optgroup key={g} label={g}>
                  {options
                    .filter((o) => o.group === g)
                    .map((o) => (
                      <option key={`${o.group}/${o.name}`} value={`${o.group}\u0000${o.name}`}>
                        {o.name} ({o.group})
                      </option>
                    ))}
                </optgroup>
              ))}
            </select>
          </label>
          {group === "validation" && training.length > 0 && (
            <label title="Training curves drawn beside the validation ones">
              Beside{" "}
              <select
                data-testid="beside-select"
                value={beside || NOTHING}
                onChange={(ev) => setParam({ beside: ev.target.value })}
              >
                {training.map((n) => (
                  <option key={n} value={n}>
                    {n} (training)
                  </option>
                ))}
                <option value={NOTHING}>nothing</option>
              </select>
            </label>
          )}
          <label title={bpe ? "" : "Epochs need records_per_epoch and global_batch_size in the config"}>
            X axis{" "}
            <select
              value={xUnit}
              onChange={(ev) => setParam({ x: ev.target.value === "epochs" ? "epochs" : null })}
              data-testid="x-axis"
            >
              <option value="batches">batches</option>
              {bpe && <option value="epochs">epochs</option>}
            </select>
          </label>
          <label className="check">
            <input
              type="checkbox"
              checked={log}
              onChange={(ev) => setParam({ log: ev.target.checked ? "1" : null })}
              data-testid="log-scale"
            />{" "}
            log scale
          </label>
        </>
      }
    >
      {beside ? (
        <div className="curves-pair">
          <div>
            <div className="chart-caption">
              {metric} ({group})
            </div>
            {main}
          </div>
          <div>
            <div className="chart-caption">{beside} (training)</div>
            {besideCurves.error && <ErrorPanel error={besideCurves.error} title="Cannot load the training curves" />}
            {!besideData && !besideCurves.error && <div className="chart-placeholder">Loading curves…</div>}
            {besideData && withPoints(besideData) === 0 && (
              <div className="chart-placeholder" data-testid="beside-curves" data-drawn="0">
                No trial has reported {beside} (training) yet.
              </div>
            )}
            {besideData && withPoints(besideData) > 0 && chart(besideData, beside, "beside-curves")}
          </div>
        </div>
      ) : (
        main
      )}
      {curves && drawn > 0 && (
        <div className="hint">
          {plural(drawn, "trial")} · hover a line for its trial and hyperparameters, click to open it · drag to zoom,
          double-click to reset
        </div>
      )}
    </Section>
  );
}
