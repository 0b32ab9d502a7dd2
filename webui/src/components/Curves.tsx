// Learning curves of every trial of an experiment, for one metric, in one uPlot chart.
import { useCallback, useMemo, useRef, useState } from "react";
import { useNavigate } from "react-router";
import type uPlot from "uplot";
import { alignCurves, nearestIndex, singlePoint, toXY, type XY } from "../align";
import type { Curve, JsonObject } from "../api";
import { fmtNumber, fmtValue } from "../format";
import { linearRange, logAxis, logRange, valueRange } from "../axes";
import { AXIS_STYLE, Plot, markYRange } from "./Plot";

declare global {
  interface Window {
    /** performance.now() when the curves were first drawn with data (read by a benchmark). */
    __assayCurvesDrawnAt?: number;
  }
}

export interface CurvesProps {
  curves: Curve[];
  metric: string;
  xLabel: string;
  /** Multiplies batches into the x unit (1 / batches per epoch for epochs). */
  xScale: number;
  log: boolean;
  hparamsOf: (trialId: string) => JsonObject | undefined;
  colorOf: (trialId: string) => string;
  height?: number;
  /** The chart's data-testid ("curves" for the page's main chart, which also sets
   * `window.__assayCurvesDrawnAt`). */
  testId?: string;
}

interface Hover {
  /** Cursor position in the container's pixels. */
  left: number;
  top: number;
  trialId: string;
  x: number;
  y: number;
}

export function Curves({
  curves,
  metric,
  xLabel,
  xScale,
  log,
  hparamsOf,
  colorOf,
  height = 380,
  testId = "curves",
}: CurvesProps) {
  const box = useRef<HTMLDivElement>(null);
  const navigate = useNavigate();
  const [hover, setHover] = useState<Hover | null>(null);

  const prepared = useMemo(() => {
    const ids = curves.map((c) => String(c.trial_id));
    const xy: XY[] = curves.map((c) => toXY(c.total_batches, c.values, xScale, log));
    // A trial with one point so far (e.g. stopped at ASHA's first rung) has no line to
    // draw: it is drawn as a marker.
    const single = xy.map(singlePoint);
    const withPoints = xy.filter((c) => c.x.length > 0).length;
    return { ids, xy, data: alignCurves(xy), withPoints, single, markers: single.some(Boolean) };
  }, [curves, xScale, log]);

  // Read by uPlot's hooks, which are made once per chart.
  const live = useRef(prepared);
  live.current = prepared;
  const focused = useRef<number | null>(null);

  const structure = `${metric}|${xLabel}|${log}|${prepared.ids.join(",")}`;

  const options = useCallback(
    (width: number, h: number): uPlot.Options => {
      const ids = live.current.ids;
      const onCursor = (u: uPlot) => {
        const { left, top } = u.cursor;
        const p = live.current;
        if (left == null || top == null || left < 0) {
          if (focused.current !== null) {
            focused.current = null;
            u.setSeries(null, { focus: false });
          }
          setHover(null);
          return;
        }
        const xv = u.posToVal(left, "x");
        let best = -1;
        let bestDist = 24; // px
        let bestY = NaN;
        for (let s = 0; s < p.xy.length; s++) {
          if (!u.series[s + 1]?.show) continue;
          const c = p.xy[s]!;
          const k = nearestIndex(c.x, xv);
          if (k < 0) continue;
          const yv = c.y[k]!;
          if (yv !== yv) continue;
          const d = Math.abs(u.valToPos(yv, "y") - top);
          if (d < bestDist) {
            bestDist = d;
            best = s;
            bestY = yv;
          }
        }
        if (best < 0) {
          if (focused.current !== null) {
            focused.current = null;
            u.setSeries(null, { focus: false });
          }
          setHover(null);
          return;
        }
        if (focused.current !== best) {
          focused.current = best;
          u.setSeries(best + 1, { focus: true });
        }
        const c = p.xy[best]!;
        const k = nearestIndex(c.x, xv);
        const over = u.over.getBoundingClientRect();
        const outer = box.current?.getBoundingClientRect() ?? over;
        setHover({
          left: left + over.left - outer.left,
          top: top + over.top - outer.top,
          trialId: p.ids[best]!,
          x: c.x[k]!,
          y: bestY,
        });
      };
      const onDraw = (u: uPlot) => {
        const el = box.current;
        const n = live.current.withPoints;
        if (!el || u.data[0].length === 0) return;
        el.dataset["drawn"] = String(n);
        markYRange(el, u);
        if (n > 0 && testId === "curves" && window.__assayCurvesDrawnAt === undefined) {
          window.__assayCurvesDrawnAt = performance.now();
        }
      };
      return {
        width,
        height: h,
        legend: { show: false },
        focus: { alpha: 0.25 },
        cursor: {
          focus: { prox: -1 },
          points: { show: false },
          drag: { x: true, y: false, setScale: true },
        },
        scales: {
          // With markers, a margin so that those at either end are drawn whole.
          x: {
            time: false,
            range: (_u, lo, hi) => (live.current.markers || lo === hi ? linearRange(lo, hi, 0.015) : [lo, hi]),
          },
          // A log axis from the data's least positive value (values <= 0 are not drawn).
          // A linear one: a margin around a single value, not an axis from 0 to twice it.
          y: log
            ? { distr: 3, log: 10, range: (_u, lo, hi) => logRange(lo > 0 && hi >= lo ? [lo, hi] : null, 0.02) }
            : { range: (_u, lo, hi) => valueRange(lo, hi) },
        },
        axes: [
          { ...AXIS_STYLE, label: xLabel, labelSize: 20 },
          {
            ...AXIS_STYLE,
            label: metric,
            labelSize: 20,
            size: 60,
            ...(log ? logAxis((labels) => box.current?.setAttribute("data-y-ticks", JSON.stringify(labels))) : {}),
          },
        ],
        series: [
          { label: xLabel },
          ...ids.map((id) => ({
            label: `trial ${id}`,
            stroke: colorOf(id),
            width: 1.25,
            spanGaps: true,
            points: {
              show: (_u: uPlot, s: number) => live.current.single[s - 1] === true,
              size: 7,
              fill: colorOf(id),
            },
          })),
        ],
        hooks: { setCursor: [onCursor], draw: [onDraw] },
      };
    },
    // `structure` covers metric, unit, scale and series; colours follow the trial ids.
    [structure, testId],
  );

  const onCreate = useCallback(
    (u: uPlot) => {
      focused.current = null;
      u.over.addEventListener("click", () => {
        const f = focused.current;
        const id = f === null ? undefined : live.current.ids[f];
        if (id !== undefined) navigate(`/trials/${id}`);
      });
      u.over.addEventListener("mouseleave", () => setHover(null));
    },
    [navigate],
  );

  const hparams = hover ? hparamsOf(hover.trialId) : undefined;
  return (
    <div className="curves" data-testid={testId} ref={box}>
      <Plot options={options} data={prepared.data} structure={structure} height={height} onCreate={onCreate} />
      {hover && (
        <div
          className="tooltip"
          style={{
            left:
              hover.left + 250 > (box.current?.clientWidth ?? 800) ? hover.left - 250 : hover.left + 14,
            top: hover.top + 14,
          }}
        >
          <div className="tooltip-title">
            <span className="swatch" style={{ background: colorOf(hover.trialId) }} />
            trial {hover.trialId}
          </div>
          <div>
            {metric} <b>{fmtNumber(hover.y)}</b> at {xLabel} {fmtNumber(hover.x)}
          </div>
          {hparams &&
            Object.entries(hparams).map(([k, v]) => (
              <div key={k} className="tooltip-hp">
                {k}: {fmtValue(v)}
              </div>
            ))}
          <div className="muted">click to open the trial</div>
        </div>
      )}
    </div>
  );
}
