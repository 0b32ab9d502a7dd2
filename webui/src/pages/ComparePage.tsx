// `/compare?trials=3,9&experiments=2`: trials of any experiments side by side: their curves
// overlaid (a chart per metric, a line per trial), the hyperparameters that differ, and the
// best and last value of the searcher metric against the first trial's.
import { useCallback, useEffect, useMemo, useRef } from "react";
import { Link, useSearchParams } from "react-router";
import type uPlot from "uplot";
import { alignCurves, singlePoint, toXY, type XY } from "../align";
import {
  ApiError,
  api,
  num,
  type Experiment,
  type ExperimentDetail,
  type JsonValue,
  type MetricsReport,
  type Trial,
} from "../api";
import { linearRange, valueRange } from "../axes";
import { AXIS_STYLE, Plot, legendValue, markYRange, seriesColor } from "../components/Plot";
import { ErrorPanel, Loading, Section, StateBadge } from "../components/ui";
import { fmtNumber, fmtValue, searcherInfo } from "../format";
import { usePoll } from "../hooks";
import { parseIds } from "../selection";

/** More trials than this are not drawn (the rest are named as left out). */
export const MAX_COMPARED = 30;
const METRIC_POINTS = 1000;
const GROUPS = ["validation", "training"] as const;

interface Run {
  trial: Trial;
  experiment: Experiment;
  /** "name (experiment 3) · trial 12" */
  label: string;
  reports: Record<string, MetricsReport[]>;
}

interface Loaded {
  runs: Run[];
  /** What could not be loaded, in words ("trial 99: not found"). */
  problems: string[];
  leftOut: number;
}

function why(e: unknown): string {
  if (e instanceof ApiError && e.notFound) return "not found";
  return e instanceof Error ? e.message : String(e);
}

async function loadRuns(trialIds: string[], experimentIds: string[], signal: AbortSignal): Promise<Loaded> {
  const problems: string[] = [];
  const details = new Map<string, ExperimentDetail>();
  const getExperiment = async (id: string) => {
    if (details.has(id)) return details.get(id)!;
    const d = await api.experiment(id, signal);
    details.set(id, d);
    return d;
  };
  // Trials named one by one first, in the address's order; then each experiment's trials.
  const picked: Trial[] = [];
  const named = await Promise.allSettled(trialIds.map((id) => api.trial(id, signal)));
  named.forEach((r, i) => {
    if (r.status === "fulfilled") picked.push(r.value);
    else problems.push(`trial ${trialIds[i]}: ${why(r.reason)}`);
  });
  const exps = await Promise.allSettled(experimentIds.map((id) => getExperiment(id)));
  exps.forEach((r, i) => {
    if (r.status === "fulfilled") {
      for (const t of [...r.value.trials].sort((a, b) => num(a.id) - num(b.id))) {
        if (!picked.some((p) => String(p.id) === String(t.id))) picked.push(t);
      }
    } else problems.push(`experiment ${experimentIds[i]}: ${why(r.reason)}`);
  });
  signal.throwIfAborted();
  const kept = picked.slice(0, MAX_COMPARED);
  const owners = await Promise.allSettled(kept.map((t) => getExperiment(String(t.experiment_id))));
  const reports = await Promise.all(
    kept.map((t) =>
      Promise.all(GROUPS.map((g) => api.trialMetrics(t.id, g, METRIC_POINTS, signal).then((m) => m.reports))),
    ),
  );
  const runs: Run[] = [];
  kept.forEach((t, i) => {
    const owner = owners[i]!;
    if (owner.status === "rejected") {
      problems.push(`experiment ${String(t.experiment_id)} of trial ${String(t.id)}: ${why(owner.reason)}`);
      return;
    }
    const e = owner.value.experiment;
    runs.push({
      trial: t,
      experiment: e,
      label: `${e.name} (experiment ${String(e.id)}) · trial ${String(t.id)}`,
      reports: Object.fromEntries(GROUPS.map((g, j) => [g, reports[i]![j]!])),
    });
  });
  return { runs, problems, leftOut: Math.max(0, picked.length - MAX_COMPARED) };
}

export function ComparePage() {
  const [q, setQ] = useSearchParams();
  const trialIds = parseIds(q.get("trials"));
  const experimentIds = parseIds(q.get("experiments"));
  const key = `compare:${trialIds.join(",")}|${experimentIds.join(",")}`;
  const empty = trialIds.length === 0 && experimentIds.length === 0;
  const loaded = usePoll(key, (signal) => loadRuns(trialIds, experimentIds, signal), {
    active: !empty,
    intervalMs: 10_000,
    backoff: 3,
  });

  useEffect(() => {
    document.title = "Compare trials · Assay";
  }, []);

  const remove = (run: Run) => {
    const next = new URLSearchParams(q);
    const id = String(run.trial.id);
    const trials = trialIds.filter((t) => t !== id);
    // A trial that came with its experiment: the experiment's other trials are named instead.
    const exp = String(run.experiment.id);
    let exps = experimentIds;
    if (!trialIds.includes(id) && exps.includes(exp)) {
      exps = exps.filter((x) => x !== exp);
      for (const r of loaded.data?.runs ?? []) {
        const rid = String(r.trial.id);
        if (String(r.experiment.id) === exp && rid !== id && !trials.includes(rid)) trials.push(rid);
      }
    }
    if (trials.length) next.set("trials", trials.join(","));
    else next.delete("trials");
    if (exps.length) next.set("experiments", exps.join(","));
    else next.delete("experiments");
    setQ(next, { replace: true });
  };

  if (empty) {
    return (
      <div className="page">
        <div className="page-title">
          <h1>Compare trials</h1>
        </div>
        <div className="empty" data-testid="compare-empty">
          No trials picked. Tick trials on an experiment's page, or experiments in the{" "}
          <Link to="/">experiment list</Link>, then press Compare.
        </div>
      </div>
    );
  }
  const data = loaded.data;
  return (
    <div className="page">
      <div className="page-title">
        <h1>Compare trials</h1>
        <span className="muted" data-testid="compare-count">
          {data ? `${data.runs.length} trial${data.runs.length === 1 ? "" : "s"}` : ""}
        </span>
      </div>
      {loaded.error && <ErrorPanel error={loaded.error} title="Cannot load the trials" />}
      {data && data.problems.length > 0 && (
        <ErrorPanel error={new Error(data.problems.join("; "))} title="Left out" />
      )}
      {data && data.leftOut > 0 && (
        <div className="notice" data-testid="compare-left-out">
          {data.leftOut} more trial{data.leftOut === 1 ? " is" : "s are"} left out: at most {MAX_COMPARED} are compared.
        </div>
      )}
      {loaded.loading && !loaded.error && <Loading what="the trials" />}
      {data && data.runs.length > 0 && <CompareView runs={data.runs} onRemove={remove} />}
    </div>
  );
}

function CompareView({ runs, onRemove }: { runs: Run[]; onRemove: (r: Run) => void }) {
  const [q, setQ] = useSearchParams();
  const first = runs[0]!;
  const { metric: searcherMetric, smallerIsBetter } = searcherInfo(first.experiment.config);
  const validationNames = useMemo(() => {
    const s = new Set<string>();
    for (const r of runs) for (const rep of r.reports["validation"] ?? []) Object.keys(rep.metrics).forEach((k) => s.add(k));
    return [...s].sort();
  }, [runs]);
  const metric = q.get("metric") || searcherMetric || validationNames[0] || "";
  const smaller = metric === searcherMetric ? smallerIsBetter : /loss|error/i.test(metric);
  const showAll = q.get("hparams") === "all";
  const setParam = (k: string, v: string | null) => {
    const next = new URLSearchParams(q);
    if (v === null) next.delete(k);
    else next.set(k, v);
    setQ(next, { replace: true });
  };

  return (
    <>
      <Section
        title="Trials"
        right={
          <label>
            Metric{" "}
            <select value={metric} onChange={(e) => setParam("metric", e.target.value)} data-testid="compare-metric">
              {[...new Set([metric, ...validationNames])].filter(Boolean).map((n) => (
                <option key={n} value={n}>
                  {n}
                  {n === searcherMetric ? " (searcher)" : ""}
                </option>
              ))}
            </select>
          </label>
        }
      >
        <Deltas runs={runs} metric={metric} smallerIsBetter={smaller} onRemove={onRemove} />
      </Section>
      <Section
        title="Hyperparameters"
        right={
          <label>
            <input
              type="checkbox"
              checked={showAll}
              onChange={(e) => setParam("hparams", e.target.checked ? "all" : null)}
              data-testid="compare-hparams-all"
            />{" "}
            Show equal ones too
          </label>
        }
      >
        <HparamTable runs={runs} showAll={showAll} />
      </Section>
      <Section title="Curves">
        <CompareCharts runs={runs} first={metric} />
      </Section>
    </>
  );
}

// -- deltas ------------------------------------------------------------------------------

function bestAndLast(reports: MetricsReport[], metric: string, smallerIsBetter: boolean): [number, number] {
  let best = NaN;
  let last = NaN;
  let lastAt = -Infinity;
  for (const r of reports) {
    const v = num(r.metrics[metric]);
    if (!Number.isFinite(v)) continue;
    if (Number.isNaN(best) || (smallerIsBetter ? v < best : v > best)) best = v;
    const at = num(r.total_batches);
    if (at >= lastAt) {
      lastAt = at;
      last = v;
    }
  }
  return [best, last];
}

function Delta({ value, base, smallerIsBetter, testId }: { value: number; base: number; smallerIsBetter: boolean; testId: string }) {
  if (!Number.isFinite(value) || !Number.isFinite(base)) {
    return (
      <td className="num muted" data-testid={testId}>
        –
      </td>
    );
  }
  const d = value - base;
  const better = smallerIsBetter ? d < 0 : d > 0;
  const rel = base !== 0 ? ` (${d >= 0 ? "+" : ""}${((d / Math.abs(base)) * 100).toFixed(1)}%)` : "";
  const tone = d === 0 ? "" : better ? "delta-better" : "delta-worse";
  return (
    <td className={`num ${tone}`} data-testid={testId} data-value={String(d)}>
      {d >= 0 ? "+" : "−"}
      {fmtNumber(Math.abs(d))}
      {rel}
    </td>
  );
}

function Deltas({
  runs,
  metric,
  smallerIsBetter,
  onRemove,
}: {
  runs: Run[];
  metric: string;
  smallerIsBetter: boolean;
  onRemove: (r: Run) => void;
}) {
  const values = runs.map((r) => bestAndLast(r.reports["validation"] ?? [], metric, smallerIsBetter));
  const [baseBest, baseLast] = values[0]!;
  return (
    <div className="table-wrap">
      <table className="table" data-testid="compare-deltas">
        <thead>
          <tr>
            <th />
            <th>Trial</th>
            <th>State</th>
            <th className="num">Best {metric}</th>
            <th className="num">Δ best</th>
            <th className="num">Last {metric}</th>
            <th className="num">Δ last</th>
            <th />
          </tr>
        </thead>
        <tbody>
          {runs.map((r, i) => {
            const [best, last] = values[i]!;
            return (
              <tr key={String(r.trial.id)} data-testid="delta-row" data-trial={String(r.trial.id)}>
                <td>
                  <span className="swatch" style={{ background: seriesColor(i) }} />
                </td>
                <td>
                  <Link to={`/experiments/${r.experiment.id}`}>{r.experiment.name}</Link>{" "}
                  <span className="muted">({String(r.experiment.id)})</span> ·{" "}
                  <Link to={`/trials/${r.trial.id}`}>trial {String(r.trial.id)}</Link>
                  {i === 0 && <span className="chip">baseline</span>}
                </td>
                <td>
                  <StateBadge state={r.trial.state} />
                </td>
                <td className="num" data-testid="best" data-value={String(best)}>
                  {fmtNumber(best)}
                </td>
                {i === 0 ? <td className="num muted">–</td> : <Delta value={best} base={baseBest} smallerIsBetter={smallerIsBetter} testId="best-delta" />}
                <td className="num" data-testid="last" data-value={String(last)}>
                  {fmtNumber(last)}
                </td>
                {i === 0 ? <td className="num muted">–</td> : <Delta value={last} base={baseLast} smallerIsBetter={smallerIsBetter} testId="last-delta" />}
                <td>
                  <button
                    type="button"
                    className="link"
                    title="Leave this trial out of the comparison"
                    onClick={() => onRemove(r)}
                    data-testid="compare-remove"
                  >
                    Remove
                  </button>
                </td>
              </tr>
            );
          })}
        </tbody>
      </table>
      <div className="muted small">
        Δ: against the first trial ({smallerIsBetter ? "smaller" : "larger"} is better), from its validation metrics.
      </div>
    </div>
  );
}

// -- hyperparameters ---------------------------------------------------------------------

function HparamTable({ runs, showAll }: { runs: Run[]; showAll: boolean }) {
  const rows = useMemo(() => {
    const names: string[] = [];
    for (const r of runs) for (const k of Object.keys(r.trial.hparams ?? {})) if (!names.includes(k)) names.push(k);
    names.sort();
    return names.map((name) => {
      const values = runs.map((r) => r.trial.hparams?.[name]);
      const key = (v: JsonValue | undefined) => (v === undefined ? "\u0000missing" : JSON.stringify(v));
      const differ = new Set(values.map(key)).size > 1;
      return { name, values, differ };
    });
  }, [runs]);
  const shown = rows.filter((r) => showAll || r.differ);
  const hidden = rows.length - shown.length;
  return (
    <div className="table-wrap">
      <table className="table" data-testid="compare-hparams">
        <thead>
          <tr>
            <th>Hyperparameter</th>
            {runs.map((r, i) => (
              <th key={String(r.trial.id)} className="num" title={r.label}>
                <span className="swatch" style={{ background: seriesColor(i) }} /> trial {String(r.trial.id)}
              </th>
            ))}
          </tr>
        </thead>
        <tbody>
          {shown.map((row) => (
            <tr key={row.name} data-testid="hparam-row" data-name={row.name} className={row.differ ? undefined : "muted"}>
              <th>{row.name}</th>
              {row.values.map((v, i) => (
                <td key={i} className="num">
                  {fmtValue(v)}
                </td>
              ))}
            </tr>
          ))}
          {shown.length === 0 && (
            <tr>
              <td colSpan={runs.length + 1} className="empty">
                {rows.length ? "These trials have the same hyperparameters." : "These trials have no hyperparameters."}
              </td>
            </tr>
          )}
        </tbody>
      </table>
      {hidden > 0 && (
        <div className="muted small" data-testid="compare-hparams-hidden">
          {hidden} hyperparameter{hidden === 1 ? " has" : "s have"} the same value in every trial (not shown).
        </div>
      )}
    </div>
  );
}

// -- curves ------------------------------------------------------------------------------

interface ChartSpec {
  key: string;
  group: string;
  name: string;
  /** Indexes into runs of the series drawn. */
  runIdx: number[];
  labels: string[];
  data: uPlot.AlignedData;
  single: boolean[];
  withPoints: number;
}

function charts(runs: Run[], first: string): ChartSpec[] {
  const keys: { group: string; name: string }[] = [];
  for (const g of GROUPS) {
    const names = new Set<string>();
    for (const r of runs) for (const rep of r.reports[g] ?? []) Object.keys(rep.metrics).forEach((k) => names.add(k));
    for (const name of [...names].sort()) keys.push({ group: g, name });
  }
  // The compared metric's validation chart first.
  keys.sort((a, b) => Number(b.group === "validation" && b.name === first) - Number(a.group === "validation" && a.name === first));
  return keys.map(({ group, name }) => {
    const runIdx: number[] = [];
    const xy: XY[] = [];
    runs.forEach((r, i) => {
      const xs: number[] = [];
      const ys: number[] = [];
      for (const rep of r.reports[group] ?? []) {
        const v = rep.metrics[name];
        if (v === undefined) continue;
        xs.push(num(rep.total_batches));
        ys.push(num(v));
      }
      if (xs.length === 0) return;
      runIdx.push(i);
      xy.push(toXY(xs, ys));
    });
    return {
      key: `${group}.${name}`,
      group,
      name,
      runIdx,
      labels: runIdx.map((i) => runs[i]!.label),
      data: alignCurves(xy),
      single: xy.map(singlePoint),
      withPoints: xy.length,
    };
  });
}

function CompareCharts({ runs, first }: { runs: Run[]; first: string }) {
  const specs = useMemo(() => charts(runs, first), [runs, first]);
  if (specs.length === 0) {
    return <div className="chart-placeholder">These trials have reported no metrics yet.</div>;
  }
  return (
    <div className="trial-charts compare-charts">
      {specs.map((s) => (
        <CompareChart key={s.key} spec={s} />
      ))}
    </div>
  );
}

function CompareChart({ spec }: { spec: ChartSpec }) {
  const box = useRef<HTMLDivElement>(null);
  const live = useRef(spec);
  live.current = spec;
  const structure = `${spec.key}|${spec.runIdx.join(",")}|${spec.labels.join(",")}`;
  const options = useCallback(
    (width: number, height: number): uPlot.Options => ({
      width,
      height,
      title: `${spec.name} (${spec.group})`,
      cursor: { drag: { x: true, y: false } },
      scales: {
        x: {
          time: false,
          range: (_u, lo, hi) => (live.current.single.some(Boolean) || lo === hi ? linearRange(lo, hi, 0.015) : [lo, hi]),
        },
        y: { range: (_u, lo, hi) => valueRange(lo, hi) },
      },
      legend: { live: true },
      axes: [
        { ...AXIS_STYLE, label: "batches", labelSize: 18 },
        { ...AXIS_STYLE, size: 56 },
      ],
      series: [
        { label: "batches", value: legendValue(fmtNumber) },
        ...spec.runIdx.map((ri, s) => ({
          label: spec.labels[s]!,
          value: legendValue(fmtNumber),
          stroke: seriesColor(ri),
          width: 1.5,
          spanGaps: true,
          points: {
            show: (_u: uPlot, si: number) => live.current.single[si - 1] === true,
            size: 7,
            fill: seriesColor(ri),
          },
        })),
      ],
      hooks: {
        draw: [
          (u: uPlot) => {
            const el = box.current;
            markYRange(el, u);
            if (el && u.data[0].length > 0) el.dataset["drawn"] = String(live.current.withPoints);
          },
        ],
      },
    }),
    // A chart per metric and set of trials; new points update it in place.
    [structure],
  );
  return (
    <div className="metric-chart" ref={box} data-testid="compare-chart" data-metric={spec.key} data-series={spec.withPoints}>
      <Plot options={options} data={spec.data} structure={structure} height={240} />
    </div>
  );
}
