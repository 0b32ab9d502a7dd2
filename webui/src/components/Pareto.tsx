// A multi-objective experiment's Pareto front: every trial's point (its final validation)
// on the first two objectives, the front's points marked and joined, the rest dimmed.
// Plain SVG, so that each point is an element a person can hover and a test can read.
import { useMemo } from "react";
import { useNavigate } from "react-router";
import { num, type ExperimentDetail, type Objective } from "../api";
import { linearRange, linearTicks, tickLabels } from "../axes";
import { fmtInt, fmtNumber, plural } from "../format";
import { Section } from "./ui";
import "./search-views.css";

const WIDTH = 640;
const HEIGHT = 380;
const MARGIN = { left: 64, right: 16, top: 12, bottom: 48 };

interface Point {
  id: string;
  batches: number;
  values: number[];
  x: number;
  y: number;
  onFront: boolean;
}

/** "val_loss (↓ smaller is better)" */
export function objectiveLabel(o: Objective): string {
  return `${o.name} (${o.smaller_is_better ? "↓ smaller" : "↑ larger"} is better)`;
}

function scale(lo: number, hi: number, from: number, to: number): (v: number) => number {
  return (v) => (hi === lo ? (from + to) / 2 : from + ((v - lo) / (hi - lo)) * (to - from));
}

function range(values: number[]): [number, number] {
  const [lo, hi] = linearRange(Math.min(...values), Math.max(...values));
  return [lo ?? 0, hi ?? 1];
}

export function ParetoPanel({ detail }: { detail: ExperimentDetail }) {
  const objectives = detail.objectives ?? [];
  const navigate = useNavigate();
  const { points, missing } = useMemo(() => {
    const out: Point[] = [];
    let incomplete = 0;
    for (const p of detail.pareto_points ?? []) {
      const values = p.values.map((v) => num(v));
      const [x, y] = values;
      if (x === undefined || y === undefined || !Number.isFinite(x) || !Number.isFinite(y)) {
        incomplete++;
        continue;
      }
      out.push({ id: String(p.trial_id), batches: num(p.total_batches), values, x, y, onFront: p.on_front });
    }
    return { points: out, missing: incomplete };
  }, [detail.pareto_points]);
  if (objectives.length < 2) return null;
  const [ox, oy] = objectives as [Objective, Objective];

  const front = points.filter((p) => p.onFront).sort((a, b) => a.x - b.x || a.y - b.y);
  const [x0, x1] = points.length ? range(points.map((p) => p.x)) : [0, 1];
  const [y0, y1] = points.length ? range(points.map((p) => p.y)) : [0, 1];
  const sx = scale(x0, x1, MARGIN.left, WIDTH - MARGIN.right);
  const sy = scale(y0, y1, HEIGHT - MARGIN.bottom, MARGIN.top);
  const xTicks = linearTicks(x0, x1, 8);
  const yTicks = linearTicks(y0, y1, 6);
  const xLabels = tickLabels(xTicks);
  const yLabels = tickLabels(yTicks);
  const title = (p: Point) =>
    `Trial ${p.id}${p.onFront ? " (on the front)" : ""}, at batch ${fmtInt(p.batches)}: ` +
    objectives.map((o, i) => `${o.name} ${fmtNumber(p.values[i] ?? NaN)}`).join(", ");
  return (
    <Section title="Pareto front">
      <div
        className="pareto"
        data-testid="pareto"
        data-points={String(points.length)}
        data-front={front.map((p) => p.id).join(",")}
        data-x={ox.name}
        data-y={oy.name}
      >
        <svg
          viewBox={`0 0 ${WIDTH} ${HEIGHT}`}
          width={WIDTH}
          height={HEIGHT}
          role="img"
          aria-label={`Trials by ${ox.name} and ${oy.name}, the Pareto front highlighted`}
        >
          <g className="pareto-grid">
            {xTicks.map((v, i) => (
              <g key={`x${i}`}>
                <line x1={sx(v)} x2={sx(v)} y1={MARGIN.top} y2={HEIGHT - MARGIN.bottom} />
                <text x={sx(v)} y={HEIGHT - MARGIN.bottom + 16} textAnchor="middle">
                  {xLabels[i]}
                </text>
              </g>
            ))}
            {yTicks.map((v, i) => (
              <g key={`y${i}`}>
                <line x1={MARGIN.left} x2={WIDTH - MARGIN.right} y1={sy(v)} y2={sy(v)} />
                <text x={MARGIN.left - 6} y={sy(v) + 4} textAnchor="end">
                  {yLabels[i]}
                </text>
              </g>
            ))}
          </g>
          <text className="pareto-axis" data-testid="pareto-x-label" x={(MARGIN.left + WIDTH - MARGIN.right) / 2} y={HEIGHT - 8} textAnchor="middle">
            {objectiveLabel(ox)}
          </text>
          <text
            className="pareto-axis"
            data-testid="pareto-y-label"
            transform={`translate(14 ${(MARGIN.top + HEIGHT - MARGIN.bottom) / 2}) rotate(-90)`}
            textAnchor="middle"
          >
            {objectiveLabel(oy)}
          </text>
          {front.length > 1 && (
            <polyline
              className="pareto-line"
              data-testid="pareto-front-line"
              points={front.map((p) => `${sx(p.x)},${sy(p.y)}`).join(" ")}
            />
          )}
          {[...points.filter((p) => !p.onFront), ...front].map((p) => (
            <circle
              key={p.id}
              className={p.onFront ? "pareto-point on-front" : "pareto-point"}
              data-testid="pareto-point"
              data-trial={p.id}
              data-on-front={p.onFront ? "1" : "0"}
              data-x={String(p.x)}
              data-y={String(p.y)}
              cx={sx(p.x)}
              cy={sy(p.y)}
              r={p.onFront ? 6 : 4.5}
              onClick={() => void navigate(`/trials/${p.id}`)}
            >
              <title>{title(p)}</title>
            </circle>
          ))}
        </svg>
      </div>
      <div className="hint">
        {plural(points.length, "trial")}, {front.length} on the front
        {objectives.length > 2 && ` (over all ${objectives.length} metrics; the first two are drawn)`}
        {missing > 0 && `; ${plural(missing, "trial")} without both values not drawn`} · each trial is its final
        validation · hover a point for its trial, click to open it
      </div>
    </Section>
  );
}
