// Hyperparameters against the searcher's metric: parallel coordinates (canvas) and one
// scatter plot (uPlot, points only) per numeric hyperparameter.
import { useCallback, useEffect, useMemo, useRef, useState } from "react";
import { useNavigate } from "react-router";
import uPlot from "uplot";
import type { JsonValue } from "../api";
import { fmtNumber, fmtValue, type HparamSpec } from "../format";
import { linearRange, logAxis, logRange, logTicks, positiveExtent, tickLabels } from "../axes";
import { AXIS_STYLE, Plot } from "./Plot";

export interface HpPoint {
  id: string;
  hparams: Record<string, JsonValue>;
  metric: number; // NaN when the trial has no validation yet
}

interface Axis {
  name: string;
  categorical: boolean;
  log: boolean;
  categories: string[];
  min: number;
  max: number;
  value: (p: HpPoint) => number; // NaN when missing
}

/** The axes worth plotting: searched hparams (from the config) that are present, else
 * every hparam whose value varies between trials. */
export function hparamAxes(specs: HparamSpec[], points: HpPoint[]): Axis[] {
  let names = specs.map((s) => s.name);
  if (names.length === 0) {
    const seen = new Map<string, Set<string>>();
    for (const p of points) {
      for (const [k, v] of Object.entries(p.hparams)) {
        if (!seen.has(k)) seen.set(k, new Set());
        seen.get(k)!.add(JSON.stringify(v));
      }
    }
    names = [...seen].filter(([, vals]) => vals.size > 1).map(([k]) => k);
  }
  return names.map((name) => {
    const spec = specs.find((s) => s.name === name);
    const raw = points.map((p) => p.hparams[name]);
    const numeric = spec ? spec.kind !== "categorical" : raw.every((v) => v == null || typeof v === "number");
    if (!numeric) {
      const fromSpec = (spec?.values ?? []).map((v) => fmtValue(v));
      const categories = [...new Set([...fromSpec, ...raw.filter((v) => v != null).map((v) => fmtValue(v))])];
      return {
        name,
        categorical: true,
        log: false,
        categories,
        min: 0,
        max: Math.max(1, categories.length - 1),
        value: (p: HpPoint) => {
          const v = p.hparams[name];
          return v == null ? NaN : categories.indexOf(fmtValue(v));
        },
      };
    }
    const log = spec?.kind === "log";
    const vals = raw.filter((v): v is number => typeof v === "number" && (!log || v > 0));
    // The searched range too, so that axes do not jump as trials arrive (a log axis: its
    // positive part only).
    const bounds = [spec?.min, spec?.max].filter((v): v is number => typeof v === "number" && (!log || v > 0));
    let min = Math.min(...vals, ...bounds);
    let max = Math.max(...vals, ...bounds);
    if (!Number.isFinite(min) || !Number.isFinite(max)) [min, max] = [0, 1];
    if (min === max) [min, max] = log ? [min / 2, max * 2] : [min - 1, max + 1];
    return {
      name,
      categorical: false,
      log,
      categories: [],
      min,
      max,
      value: (p: HpPoint) => {
        const v = p.hparams[name];
        return typeof v === "number" && (!log || v > 0) ? v : NaN;
      },
    };
  });
}

/** Good (1) to bad (0) as a colour: blue through grey to orange. */
function rampColor(t: number, alpha = 0.8): string {
  if (!Number.isFinite(t)) return `rgba(150,150,150,${alpha * 0.6})`;
  const a = [214, 96, 32]; // bad
  const b = [33, 102, 172]; // good
  const c = a.map((v, i) => Math.round(v + (b[i]! - v) * t));
  return `rgba(${c[0]},${c[1]},${c[2]},${alpha})`;
}

function position(axis: Axis, v: number): number {
  if (!Number.isFinite(v)) return NaN;
  if (axis.log) return (Math.log(v) - Math.log(axis.min)) / (Math.log(axis.max) - Math.log(axis.min));
  return (v - axis.min) / (axis.max - axis.min);
}

/** Where an axis of the parallel coordinates is labelled: every category; a log axis at
 * round values (its ends when none falls inside); a linear axis at its ends. */
function axisTicks(axis: Axis, height: number): { ticks: number[]; labels: string[] } {
  if (axis.categorical) return { ticks: axis.categories.map((_, k) => k), labels: axis.categories };
  if (axis.log) {
    const ticks = logTicks(axis.min, axis.max, height / 40);
    return { ticks, labels: tickLabels(ticks) };
  }
  const ticks = [axis.min, axis.max];
  return { ticks, labels: ticks.map((t) => fmtNumber(t, 3)) };
}

export interface HparamPlotsProps {
  specs: HparamSpec[];
  points: HpPoint[];
  metric: string;
  smallerIsBetter: boolean;
}

export function HparamPlots({ specs, points, metric, smallerIsBetter }: HparamPlotsProps) {
  const axes = useMemo(() => hparamAxes(specs, points), [specs, points]);
  const range = useMemo(() => {
    const ms = points.map((p) => p.metric).filter(Number.isFinite);
    return ms.length ? { min: Math.min(...ms), max: Math.max(...ms) } : null;
  }, [points]);
  const goodness = useCallback(
    (m: number) => {
      if (!range || !Number.isFinite(m)) return NaN;
      const t = range.max === range.min ? 1 : (m - range.min) / (range.max - range.min);
      return smallerIsBetter ? 1 - t : t;
    },
    [range, smallerIsBetter],
  );
  if (axes.length === 0) {
    return (
      <div data-testid="hparams" className="empty">
        No searched hyperparameters: every trial has the same values.
      </div>
    );
  }
  const numeric = axes.filter((a) => !a.categorical);
  return (
    <div data-testid="hparams">
      <ParallelCoords axes={axes} points={points} metric={metric} goodness={goodness} />
      <div className="legend-ramp">
        <span>worse {metric}</span>
        <span className="ramp" />
        <span>better</span>
      </div>
      {!range && <div className="empty">No trial has a validation {metric} yet: the plots fill in as trials validate.</div>}
      {numeric.length > 0 && range && (
        <div className="scatter-grid">
          {numeric.map((a) => (
            <Scatter key={a.name} axis={a} points={points} metric={metric} />
          ))}
        </div>
      )}
    </div>
  );
}

// -- parallel coordinates ----------------------------------------------------------------

function ParallelCoords({
  axes,
  points,
  metric,
  goodness,
}: {
  axes: Axis[];
  points: HpPoint[];
  metric: string;
  goodness: (m: number) => number;
}) {
  const canvas = useRef<HTMLCanvasElement>(null);
  const navigate = useNavigate();
  const [width, setWidth] = useState(800);
  const [hover, setHover] = useState<{ index: number; x: number; y: number } | null>(null);
  const height = 300;
  const pad = { left: 56, right: 72, top: 34, bottom: 24 };

  const all = useMemo<Axis[]>(() => {
    const ms = points.map((p) => p.metric).filter(Number.isFinite);
    let min = ms.length ? Math.min(...ms) : 0;
    let max = ms.length ? Math.max(...ms) : 1;
    if (min === max) [min, max] = [min - 1, max + 1];
    return [
      ...axes,
      { name: metric, categorical: false, log: false, categories: [], min, max, value: (p) => p.metric },
    ];
  }, [axes, points, metric]);

  // Pixel polylines, one per trial; NaN y where the trial lacks the value.
  const lines = useMemo(() => {
    const w = width - pad.left - pad.right;
    const h = height - pad.top - pad.bottom;
    const step = all.length > 1 ? w / (all.length - 1) : 0;
    return points.map((p) =>
      all.map((a, i) => ({ x: pad.left + i * step, y: pad.top + (1 - position(a, a.value(p))) * h })),
    );
  }, [all, points, width, pad.left, pad.right, pad.top, pad.bottom]);

  useEffect(() => {
    const el = canvas.current?.parentElement;
    if (!el) return;
    const observer = new ResizeObserver(() => setWidth(Math.max(300, el.clientWidth)));
    observer.observe(el);
    return () => observer.disconnect();
  }, []);

  useEffect(() => {
    const c = canvas.current;
    if (!c) return;
    const dpr = window.devicePixelRatio || 1;
    c.width = width * dpr;
    c.height = height * dpr;
    c.style.width = `${width}px`;
    c.style.height = `${height}px`;
    const g = c.getContext("2d");
    if (!g) return;
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, width, height);
    const drawLine = (i: number, stroke: string, lw: number) => {
      const pts = lines[i]!;
      g.beginPath();
      let pen = false;
      for (const pt of pts) {
        if (!Number.isFinite(pt.y)) {
          pen = false;
          continue;
        }
        if (pen) g.lineTo(pt.x, pt.y);
        else g.moveTo(pt.x, pt.y);
        pen = true;
      }
      g.strokeStyle = stroke;
      g.lineWidth = lw;
      g.stroke();
    };
    // Worst first, so the best trials are drawn on top.
    const order = points.map((_, i) => i).sort((a, b) => (goodness(points[a]!.metric) || 0) - (goodness(points[b]!.metric) || 0));
    for (const i of order) drawLine(i, rampColor(goodness(points[i]!.metric), hover ? 0.25 : 0.7), 1.2);
    if (hover) drawLine(hover.index, "#111", 2.5);

    // Axes over the lines.
    const h = height - pad.top - pad.bottom;
    const drawn: Record<string, string[]> = {};
    g.font = "11px system-ui, -apple-system, Segoe UI, Roboto, sans-serif";
    g.textAlign = "center";
    all.forEach((a, i) => {
      const x = lines[0]?.[i]?.x ?? pad.left + (i * (width - pad.left - pad.right)) / Math.max(1, all.length - 1);
      g.strokeStyle = "#8a93a0";
      g.lineWidth = 1;
      g.beginPath();
      g.moveTo(x, pad.top);
      g.lineTo(x, pad.top + h);
      g.stroke();
      g.fillStyle = "#1f2933";
      g.font = "600 11px system-ui, -apple-system, Segoe UI, Roboto, sans-serif";
      g.fillText(a.name + (a.log ? " (log)" : ""), x, pad.top - 18);
      g.font = "11px system-ui, -apple-system, Segoe UI, Roboto, sans-serif";
      g.fillStyle = "#5b6472";
      const { ticks, labels } = axisTicks(a, h);
      drawn[a.name] = labels;
      ticks.forEach((t, k) => {
        const y = pad.top + (1 - position(a, t)) * h;
        g.textAlign = i === all.length - 1 ? "left" : "right";
        g.fillText(labels[k] ?? "", x + (i === all.length - 1 ? 6 : -6), y + 4);
      });
      g.textAlign = "center";
    });
    c.dataset["ticks"] = JSON.stringify(drawn);
  }, [lines, all, points, goodness, hover, width, pad.top, pad.bottom, pad.left, pad.right]);

  const onMove = (e: React.MouseEvent<HTMLCanvasElement>) => {
    const r = e.currentTarget.getBoundingClientRect();
    const mx = e.clientX - r.left;
    const my = e.clientY - r.top;
    let best = -1;
    let bestD = 8;
    lines.forEach((pts, i) => {
      for (let k = 1; k < pts.length; k++) {
        const a = pts[k - 1]!;
        const b = pts[k]!;
        if (mx < a.x || mx > b.x || !Number.isFinite(a.y) || !Number.isFinite(b.y)) continue;
        const y = a.y + ((b.y - a.y) * (mx - a.x)) / (b.x - a.x || 1);
        const d = Math.abs(y - my);
        if (d < bestD) {
          bestD = d;
          best = i;
        }
      }
    });
    setHover(best < 0 ? null : { index: best, x: mx, y: my });
  };

  const p = hover ? points[hover.index] : undefined;
  return (
    <div className="pcoords">
      <canvas
        ref={canvas}
        data-testid="pcoords"
        onMouseMove={onMove}
        onMouseLeave={() => setHover(null)}
        onClick={() => p && navigate(`/trials/${p.id}`)}
        style={{ cursor: p ? "pointer" : "default" }}
      />
      {hover && p && (
        <div className="tooltip" style={{ left: hover.x + 250 > width ? hover.x - 250 : hover.x + 14, top: hover.y + 14 }}>
          <div className="tooltip-title">trial {p.id}</div>
          <div>
            {metric} <b>{fmtNumber(p.metric)}</b>
          </div>
          {axes.map((a) => (
            <div key={a.name} className="tooltip-hp">
              {a.name}: {fmtValue(p.hparams[a.name])}
            </div>
          ))}
        </div>
      )}
    </div>
  );
}

// -- scatter -----------------------------------------------------------------------------

function Scatter({ axis, points, metric }: { axis: Axis; points: HpPoint[]; metric: string }) {
  const navigate = useNavigate();
  const sorted = useMemo(
    () =>
      points
        .filter((p) => Number.isFinite(axis.value(p)) && Number.isFinite(p.metric))
        .sort((a, b) => axis.value(a) - axis.value(b)),
    [points, axis],
  );
  const data = useMemo<uPlot.AlignedData>(
    () => [sorted.map((p) => axis.value(p)), sorted.map((p) => p.metric)],
    [sorted, axis],
  );
  const live = useRef(sorted);
  live.current = sorted;
  const box = useRef<HTMLDivElement>(null);
  const [hover, setHover] = useState<{ i: number; left: number; top: number } | null>(null);

  const options = useCallback(
    (width: number, height: number): uPlot.Options => ({
      width,
      height,
      legend: { show: false },
      cursor: { drag: { x: false, y: false }, points: { size: 9 } },
      // Ranges from the data itself (not from the range asked for), with a margin so
      // that points at the ends are drawn whole.
      scales: {
        x: axis.log
          ? { time: false, distr: 3, log: 10, range: (u) => logRange(positiveExtent(u.data[0])) }
          : { time: false, range: (u) => linearRange(u.data[0][0] ?? null, u.data[0][u.data[0].length - 1] ?? null) },
        y: { range: (_u, lo, hi) => linearRange(lo, hi, 0.08) },
      },
      axes: [
        {
          ...AXIS_STYLE,
          label: axis.name,
          labelSize: 18,
          ...(axis.log ? logAxis((labels) => box.current?.setAttribute("data-x-ticks", JSON.stringify(labels))) : {}),
        },
        { ...AXIS_STYLE, label: metric, labelSize: 18, size: 52 },
      ],
      series: [
        {},
        {
          stroke: "#2166ac",
          paths: () => null,
          points: {
            show: true,
            size: 6,
            width: 1,
            fill: (u: uPlot) => (u ? "rgba(33,102,172,0.45)" : ""),
          },
        },
      ],
      hooks: {
        draw: [(u: uPlot) => box.current?.setAttribute("data-edge-gap", String(edgeGap(u)))],
        setCursor: [
          (u: uPlot) => {
            const i = u.cursor.idx;
            const { left, top } = u.cursor;
            if (i == null || left == null || top == null || left < 0) setHover(null);
            else setHover({ i, left: left + u.over.offsetLeft, top: top + u.over.offsetTop });
          },
        ],
      },
    }),
    [axis, metric],
  );

  const onCreate = useCallback(
    (u: uPlot) => {
      u.over.addEventListener("click", () => {
        const i = u.cursor.idx;
        const p = i == null ? undefined : live.current[i];
        if (p) navigate(`/trials/${p.id}`);
      });
      u.over.style.cursor = "pointer";
    },
    [navigate],
  );

  const p = hover ? sorted[hover.i] : undefined;
  return (
    <div className="scatter" data-testid="scatter" data-name={axis.name} ref={box}>
      <Plot
        options={options}
        data={data}
        structure={`${axis.name}|${axis.log}|${metric}`}
        height={200}
        onCreate={onCreate}
      />
      {hover && p && (
        <div className="tooltip" style={{ left: hover.left + 12, top: hover.top + 12 }}>
          <div className="tooltip-title">trial {p.id}</div>
          <div>
            {axis.name} {fmtValue(p.hparams[axis.name])}, {metric} <b>{fmtNumber(p.metric)}</b>
          </div>
        </div>
      )}
    </div>
  );
}

/** The least distance, in CSS pixels, from the centre of any point to the edge of the
 * plotting area (at least the markers' radius when no point is cut). */
function edgeGap(u: uPlot): number {
  const width = u.bbox.width / uPlot.pxRatio;
  const height = u.bbox.height / uPlot.pxRatio;
  const [xs, ys] = [u.data[0], u.data[1] ?? []];
  let gap = Infinity;
  for (let i = 0; i < xs.length; i++) {
    const x = xs[i];
    const y = ys[i];
    if (x == null || y == null || !Number.isFinite(x) || !Number.isFinite(y)) continue;
    const px = u.valToPos(x, "x");
    const py = u.valToPos(y, "y");
    gap = Math.min(gap, px, width - px, py, height - py);
  }
  return Number.isFinite(gap) ? Math.floor(gap) : -1;
}
