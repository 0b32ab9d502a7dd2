// Axis ranges and ticks. Log axes: a range that starts at the data's smallest positive
// value, and ticks at round values (1, 2, 5 × 10^k) all labelled in one notation. uPlot's own log ticks assume a
// range that starts on such a value; from any other start they come out unround (and
// labelled "0"), and from a start near 0 so many that drawing them stalls the page.
import uPlot from "uplot";

/** The smallest and largest positive finite values, or null when there is none. */
export function positiveExtent(values: ArrayLike<number | null | undefined>): [number, number] | null {
  let lo = Infinity;
  let hi = -Infinity;
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (v == null || !(v > 0) || v === Infinity) continue;
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  return lo <= hi ? [lo, hi] : null;
}

/** A log axis's range over [lo, hi], widened by `pad` of its span (in log space) on each
 * side so that markers at the ends are drawn whole; a single value gets a factor of 2 each
 * way. Never reaches 0: [1, 10] when there is no positive value. */
export function logRange(extent: [number, number] | null, pad = 0.05): [number, number] {
  if (!extent) return [1, 10];
  const [lo, hi] = extent;
  if (lo === hi) return [lo / 2, hi * 2];
  const f = (hi / lo) ** pad;
  return [lo / f, hi * f];
}

/** Whether [lo, hi] is one value as uPlot sees it (a single point, or a flat series). */
function flat(lo: number, hi: number): boolean {
  const scale = Math.max(Math.abs(lo), Math.abs(hi));
  return hi - lo < 1e-24 || (scale > 0 && (hi - lo) / scale < 1e-10);
}

/** A value axis's range: uPlot's own for values that differ (10% of the span each way,
 * to round numbers, from 0 when the values are all near it); for a single value, 10% of
 * it each way (±1 around 0), where uPlot would run from 0 to twice the value. */
export function valueRange(lo: number | null, hi: number | null): uPlot.Range.MinMax {
  if (lo == null || hi == null || !Number.isFinite(lo) || !Number.isFinite(hi)) return [lo, hi];
  if (flat(lo, hi)) return linearRange(lo, lo);
  return uPlot.rangeNum(lo, hi, 0.1, true);
}

/** A linear axis's range over [lo, hi], widened by `pad` of its span on each side. */
export function linearRange(lo: number | null, hi: number | null, pad = 0.06): uPlot.Range.MinMax {
  if (lo == null || hi == null || !Number.isFinite(lo) || !Number.isFinite(hi)) return [lo, hi];
  const m = lo === hi ? Math.abs(lo) * 0.1 || 1 : (hi - lo) * pad;
  return [lo - m, hi + m];
}

const MULTIPLES = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 5], [1, 3], [1]];

/** Round ticks between `min` and `max` (both > 0), at most `maxTicks` (at least 2) of them:
 * powers of ten, with the richest set of multiples between them that fits. A range inside
 * one decade that holds fewer than two such values gets evenly spaced round ticks. */
export function logTicks(min: number, max: number, maxTicks: number): number[] {
  if (!(min > 0) || !(max >= min) || !Number.isFinite(max)) return [];
  const limit = Math.max(2, Math.floor(maxTicks));
  const e0 = Math.floor(Math.log10(min));
  const e1 = Math.ceil(Math.log10(max));
  const inside = (v: number) => v >= min * (1 - 1e-12) && v <= max * (1 + 1e-12);
  for (const mults of MULTIPLES) {
    const ticks: number[] = [];
    for (let e = e0; e <= e1; e++) {
      for (const m of mults) {
        const v = Number(`${m}e${e}`); // exact, unlike m * 10 ** e
        if (inside(v)) ticks.push(v);
      }
    }
    // Each set holds the next: once one has too few, evenly spaced ticks read better.
    if (ticks.length < 2) return linearTicks(min, max, limit);
    if (ticks.length <= limit) return ticks;
  }
  // Many decades: every k-th power of ten.
  const k = Math.ceil((e1 - e0 + 1) / limit);
  const ticks: number[] = [];
  for (let e = Math.ceil(e0 / k) * k; e <= e1; e += k) {
    const v = Number(`1e${e}`);
    if (inside(v)) ticks.push(v);
  }
  return ticks;
}

/** Evenly spaced round ticks (a step of 1, 2 or 5 × 10^k) between `min` and `max`. */
export function linearTicks(min: number, max: number, maxTicks: number): number[] {
  const span = max - min;
  if (!(span > 0)) return Number.isFinite(min) ? [min] : [];
  const limit = Math.max(2, Math.floor(maxTicks));
  const magnitude = 10 ** Math.floor(Math.log10(span / limit));
  let step = magnitude * 10;
  for (const m of [1, 2, 5]) {
    if (span / (magnitude * m) <= limit) {
      step = magnitude * m;
      break;
    }
  }
  const ticks: number[] = [];
  for (let i = Math.ceil(min / step); i * step <= max * (1 + 1e-12); i++) ticks.push(Number((i * step).toPrecision(12)));
  return ticks;
}

/** Labels for an axis's ticks in one notation: plain decimals when every tick reads well
 * so (0.001 to 99,999), else exponents ("1e-4", "2e-4", "1e-3"). Never "0" for a tick
 * that is not 0. */
export function tickLabels(ticks: readonly number[]): string[] {
  const plain = ticks.every((v) => v === 0 || (Math.abs(v) >= 1e-3 && Math.abs(v) < 1e5));
  return ticks.map((v) => {
    if (plain) return String(Number(v.toPrecision(6)));
    const [mantissa, exponent] = Number(v.toPrecision(6)).toExponential().split("e");
    return `${mantissa}e${Number(exponent)}`;
  });
}

/** The most ticks an axis of this chart has room for (labels about 50 px apart across,
 * 28 px apart up the side). */
function roomFor(u: uPlot, axisIdx: number): number {
  const horizontal = (u.axes[axisIdx]?.side ?? (axisIdx === 0 ? 2 : 3)) % 2 === 0;
  return horizontal ? (u.width - 80) / 50 : (u.height - 60) / 28;
}

/** uPlot axis options for a log scale: round ticks and one notation; `onLabels` receives
 * the labels each time the axis is laid out (the page exposes them to tests). */
export function logAxis(onLabels?: (labels: string[]) => void): Partial<uPlot.Axis> {
  return {
    splits: (u, axisIdx, min, max) => logTicks(min, max, roomFor(u, axisIdx)),
    // Every split is a round value already: no thinning by leading digit.
    filter: (_u, splits) => splits,
    values: (_u, splits) => {
      const labels = tickLabels(splits);
      onLabels?.(labels);
      return labels;
    },
  };
}
