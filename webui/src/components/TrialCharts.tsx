// A trial's metrics: one small chart per metric name, training and validation together.
import { useCallback, useMemo, useRef } from "react";
import type uPlot from "uplot";
import { alignCurves, singlePoint, toXY, type XY } from "../align";
import { num, type MetricsReport } from "../api";
import { linearRange, valueRange } from "../axes";
import { fmtNumber } from "../format";
import { AXIS_STYLE, Plot, legendValue, markYRange } from "./Plot";

const GROUP_COLORS: Record<string, string> = { training: "#1f77b4", validation: "#ff7f0e" };

interface ChartSpec {
  name: string;
  groups: string[];
  data: uPlot.AlignedData;
  withPoints: number;
  /** Per group: whether it has a single point (drawn as a marker). */
  single: boolean[];
}

function columns(reports: MetricsReport[], name: string): XY {
  const xs: number[] = [];
  const ys: number[] = [];
  for (const r of reports) {
    const v = r.metrics[name];
    if (v === undefined) continue;
    xs.push(num(r.total_batches));
    ys.push(num(v));
  }
  return toXY(xs, ys);
}

export function TrialCharts({ byGroup }: { byGroup: Record<string, MetricsReport[]> }) {
  const box = useRef<HTMLDivElement>(null);
  const charts = useMemo<ChartSpec[]>(() => {
    const names = new Map<string, Set<string>>();
    for (const [group, reports] of Object.entries(byGroup)) {
      for (const r of reports) {
        for (const name of Object.keys(r.metrics)) {
          if (!names.has(name)) names.set(name, new Set());
          names.get(name)!.add(group);
        }
      }
    }
    return [...names.keys()].sort().map((name) => {
      const groups = [...names.get(name)!].sort((a, b) => b.localeCompare(a));
      const xy = groups.map((g) => columns(byGroup[g] ?? [], name));
      // A group with one point so far (one validation) is drawn as a marker.
      const single = xy.map(singlePoint);
      return { name, groups, data: alignCurves(xy), withPoints: xy.filter((c) => c.x.length > 0).length, single };
    });
  }, [byGroup]);

  // data-drawn: the series with points, once every chart has drawn.
  const drawn = useRef(new Map<string, number>());
  const total = charts.length;
  const onDrawn = useCallback(
    (name: string, n: number) => {
      drawn.current.set(name, n);
      const el = box.current;
      if (el && drawn.current.size >= total) {
        let sum = 0;
        for (const c of charts) sum += drawn.current.get(c.name) ?? 0;
        el.dataset["drawn"] = String(sum);
      }
    },
    [charts, total],
  );

  if (charts.length === 0) {
    return (
      <div className="chart-placeholder" data-testid="trial-charts" data-drawn="0">
        This trial has reported no metrics yet.
      </div>
    );
  }
  return (
    <div className="trial-charts" data-testid="trial-charts" ref={box}>
      {charts.map((c) => (
        <MetricChart key={c.name} spec={c} onDrawn={onDrawn} />
      ))}
    </div>
  );
}

function MetricChart({ spec, onDrawn }: { spec: ChartSpec; onDrawn: (name: string, n: number) => void }) {
  const box = useRef<HTMLDivElement>(null);
  const live = useRef({ spec, onDrawn });
  live.current = { spec, onDrawn };
  const options = useCallback(
    (width: number, height: number): uPlot.Options => ({
      width,
      height,
      title: spec.name,
      cursor: { drag: { x: true, y: false } },
      // With markers, a margin so that those at either end are drawn whole.
      scales: {
        x: {
          time: false,
          range: (_u, lo, hi) =>
            live.current.spec.single.some(Boolean) || lo === hi ? linearRange(lo, hi, 0.015) : [lo, hi],
        },
        // A single value (one validation) gets a margin around it, not an axis from 0 to twice it.
        y: { range: (_u, lo, hi) => valueRange(lo, hi) },
      },
      // Not hovering: each series' latest value.
      legend: { live: true },
      axes: [
        { ...AXIS_STYLE, label: "batches", labelSize: 18 },
        { ...AXIS_STYLE, size: 56 },
      ],
      series: [
        { label: "batches", value: legendValue(fmtNumber) },
        ...spec.groups.map((g) => ({
          label: g,
          value: legendValue(fmtNumber),
          stroke: GROUP_COLORS[g] ?? "#7f7f7f",
          width: 1.5,
          spanGaps: true,
          points: {
            show: (_u: uPlot, s: number) => live.current.spec.single[s - 1] === true,
            size: 7,
            fill: GROUP_COLORS[g] ?? "#7f7f7f",
          },
        })),
      ],
      hooks: {
        draw: [
          (u: uPlot) => {
            markYRange(box.current, u);
            if (u.data[0].length > 0) live.current.onDrawn(live.current.spec.name, live.current.spec.withPoints);
          },
        ],
      },
    }),
    // A chart per metric and set of groups; new points update it in place.
    [spec.name, spec.groups.join(",")],
  );
  return (
    <div className="metric-chart" ref={box} data-testid="metric-chart" data-metric={spec.name}>
      <Plot options={options} data={spec.data} structure={`${spec.name}|${spec.groups.join(",")}`} height={220} />
    </div>
  );
}
