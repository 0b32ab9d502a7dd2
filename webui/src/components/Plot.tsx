// A uPlot chart in React: created when its structure changes, updated in place otherwise.
import { useEffect, useLayoutEffect, useRef } from "react";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";

export interface PlotProps {
  /** Options for a new chart of this width and height; called only when `structure` changes. */
  options: (width: number, height: number) => uPlot.Options;
  data: uPlot.AlignedData;
  /** Change this (series, scales, units) to make a new chart; data alone updates in place. */
  structure: string;
  height: number;
  className?: string;
  onCreate?: (u: uPlot) => void;
}

/** Whether the x scale shows less than all of the data (the user zoomed in). */
function zoomed(u: uPlot): boolean {
  const xs = u.data[0];
  const x = u.scales["x"];
  if (!xs || xs.length < 2 || x?.min == null || x.max == null) return false;
  const first = xs[0] as number;
  const last = xs[xs.length - 1] as number;
  const eps = (last - first) * 1e-9;
  return x.min > first + eps || x.max < last - eps;
}

export function Plot({ options, data, structure, height, className, onCreate }: PlotProps) {
  const box = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const latest = useRef({ options, data, onCreate });
  latest.current = { options, data, onCreate };

  // A new chart per structure; the x range the user zoomed to carries over.
  useLayoutEffect(() => {
    const el = box.current;
    if (!el) return;
    const old = plot.current;
    const keep = old && zoomed(old) ? { min: old.scales["x"]!.min!, max: old.scales["x"]!.max! } : null;
    old?.destroy();
    const width = Math.max(200, el.clientWidth);
    const u = new uPlot(latest.current.options(width, height), latest.current.data, el);
    if (keep) u.setScale("x", keep);
    plot.current = u;
    latest.current.onCreate?.(u);
    // No cleanup: the next structure destroys this chart, unmounting does below.
  }, [structure, height]);

  useEffect(() => {
    return () => {
      plot.current?.destroy();
      plot.current = null;
    };
  }, []);

  // Same structure, new data: update in place, keeping a zoomed-in range.
  const first = useRef(true);
  useEffect(() => {
    if (first.current) {
      first.current = false;
      return;
    }
    const u = plot.current;
    if (!u || u.data === data) return;
    u.setData(data, !zoomed(u));
  }, [data]);

  useEffect(() => {
    const el = box.current;
    if (!el) return;
    let width = el.clientWidth;
    const observer = new ResizeObserver(() => {
      const w = el.clientWidth;
      if (w !== width && w > 0 && plot.current) {
        width = w;
        plot.current.setSize({ width: Math.max(200, w), height });
      }
    });
    observer.observe(el);
    return () => observer.disconnect();
  }, [height]);

  return <div ref={box} className={className ?? "plot"} />;
}

export const SERIES_COLORS = [
  "#1f77b4",
  "#ff7f0e",
  "#2ca02c",
  "#d62728",
  "#9467bd",
  "#8c564b",
  "#e377c2",
  "#7f7f7f",
  "#bcbd22",
  "#17becf",
];

/** A distinct colour per series index: the first ten from a categorical palette, then
 * hues spread by the golden angle. */
export function seriesColor(i: number): string {
  if (i < SERIES_COLORS.length) return SERIES_COLORS[i]!;
  const hue = (i * 137.508) % 360;
  return `hsl(${hue.toFixed(0)}, 62%, ${i % 2 ? 42 : 52}%)`;
}

export const AXIS_STYLE: Partial<uPlot.Axis> = {
  stroke: "#5b6472",
  grid: { stroke: "#eceef1", width: 1 },
  ticks: { stroke: "#d5d9df", width: 1, size: 4 },
  font: "11px system-ui, -apple-system, Segoe UI, Roboto, sans-serif",
  labelFont: "11px system-ui, -apple-system, Segoe UI, Roboto, sans-serif",
};

/** The last value of a column of uPlot's data, or undefined when it has none. */
export function lastValue(column: ArrayLike<number | null | undefined> | undefined): number | undefined {
  if (!column) return undefined;
  for (let i = column.length - 1; i >= 0; i--) {
    const v = column[i];
    if (v != null && v === v) return v;
  }
  return undefined;
}

/** A live legend's value for a series: the hovered point's ("–" where the series has no
 * point there) and, while nothing is hovered, the series' latest value; the x series
 * says "latest" then. Instead of uPlot's "--" for every series. */
export function legendValue(format: (v: number) => string): uPlot.Series.Value {
  return (u, raw, seriesIdx, idx) => {
    if (idx != null) return raw == null || raw !== raw ? "–" : format(raw);
    if (seriesIdx === 0) return "latest";
    const last = lastValue(u.data[seriesIdx]);
    return last === undefined ? "–" : format(last);
  };
}

/** Record the y range a chart was drawn with on `el`, as `data-y-range="[min,max]"`
 * (what the browser tests read: the axis itself is drawn on a canvas). */
export function markYRange(el: HTMLElement | null, u: uPlot): void {
  const y = u.scales["y"];
  if (el && y?.min != null && y.max != null) el.dataset["yRange"] = JSON.stringify([y.min, y.max]);
}
