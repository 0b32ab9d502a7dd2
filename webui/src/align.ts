// Curves with their own x values -> uPlot's aligned data (one shared, sorted x array).
import type uPlot from "uplot";

export interface XY {
  /** Ascending x values. */
  x: Float64Array;
  /** y values; NaN where there is none. */
  y: Float64Array;
}

/** Parse parallel JSON arrays (numbers, or strings for big ints / "NaN") into typed
 * arrays, sorted by x; `scale` multiplies x (batches -> epochs); with `positiveOnly`
 * (log axes) values <= 0 become NaN. */
export function toXY(
  xs: ReadonlyArray<number | string>,
  ys: ReadonlyArray<number | string>,
  scale = 1,
  positiveOnly = false,
): XY {
  const n = Math.min(xs.length, ys.length);
  const x = new Float64Array(n);
  const y = new Float64Array(n);
  let sorted = true;
  for (let i = 0; i < n; i++) {
    const xv = xs[i]!;
    const yv = ys[i]!;
    x[i] = (typeof xv === "number" ? xv : Number(xv)) * scale;
    let v = typeof yv === "number" ? yv : Number(yv);
    if (!Number.isFinite(v) || (positiveOnly && v <= 0)) v = NaN;
    y[i] = v;
    if (i > 0 && x[i]! < x[i - 1]!) sorted = false;
  }
  if (sorted) return { x, y };
  const order = Array.from(x.keys()).sort((a, b) => x[a]! - x[b]!);
  return { x: Float64Array.from(order, (i) => x[i]!), y: Float64Array.from(order, (i) => y[i]!) };
}

/** The union of every curve's x values (sorted, distinct) and each curve's y on it, null
 * where the curve has no point (drawn across with `spanGaps`). */
export function alignCurves(curves: readonly XY[]): uPlot.AlignedData {
  let total = 0;
  for (const c of curves) total += c.x.length;
  const all = new Float64Array(total);
  let at = 0;
  for (const c of curves) {
    all.set(c.x, at);
    at += c.x.length;
  }
  all.sort();
  let m = 0;
  for (let i = 0; i < total; i++) {
    if (i === 0 || all[i] !== all[m - 1]) all[m++] = all[i]!;
  }
  const xs = all.slice(0, m);
  const ys: (number | null)[][] = [];
  for (const c of curves) {
    const col: (number | null)[] = new Array<number | null>(m).fill(null);
    // Both ascending: one merge walk instead of a search per point.
    let j = 0;
    for (let i = 0; i < c.x.length; i++) {
      const xv = c.x[i]!;
      while (xs[j]! < xv) j++;
      const yv = c.y[i]!;
      if (yv === yv) col[j] = yv; // NaN stays a gap
    }
    ys.push(col);
  }
  return [xs, ...ys];
}

/** Whether a curve has exactly one point with a value: no line to draw, so a marker. */
export function singlePoint(c: XY): boolean {
  let n = 0;
  for (let i = 0; i < c.y.length && n < 2; i++) if (c.y[i] === c.y[i]) n++;
  return n === 1;
}

/** Index of the point of `x` (ascending) nearest to `v`; -1 when empty. */
export function nearestIndex(x: Float64Array, v: number): number {
  const n = x.length;
  if (n === 0) return -1;
  let lo = 0;
  let hi = n - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (x[mid]! < v) lo = mid + 1;
    else hi = mid;
  }
  if (lo > 0 && Math.abs(x[lo - 1]! - v) <= Math.abs(x[lo]! - v)) return lo - 1;
  return lo;
}
