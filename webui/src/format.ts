// Display helpers: states, numbers, times, and reading the experiment config.
import type { Experiment, ExperimentAction, ExperimentState, JsonObject, JsonValue, TrialState } from "./api";

export function stateLabel(state: ExperimentState | TrialState | string): string {
  return state
    .replace(/^(EXPERIMENT|TRIAL|CHECKPOINT)_STATE_/, "")
    .replace(/_/g, " ")
    .toLowerCase();
}

/** A CSS class for a state's colour: active, paused, done, failed, stopped, queued. */
export function stateTone(state: string): string {
  const s = stateLabel(state);
  if (s === "active" || s === "running") return "active";
  if (s === "paused") return "paused";
  if (s === "completed") return "done";
  if (s === "error") return "failed";
  if (s === "queued") return "queued";
  return "stopped";
}

const TERMINAL = new Set<ExperimentState>([
  "EXPERIMENT_STATE_COMPLETED",
  "EXPERIMENT_STATE_CANCELED",
  "EXPERIMENT_STATE_ERROR",
]);

export function isTerminal(state: ExperimentState): boolean {
  return TERMINAL.has(state);
}

export function isTrialTerminal(state: TrialState): boolean {
  return (
    state === "TRIAL_STATE_COMPLETED" ||
    state === "TRIAL_STATE_CANCELED" ||
    state === "TRIAL_STATE_ERROR"
  );
}

/** The actions an experiment in this state accepts, in display order. */
export function allowedActions(e: Pick<Experiment, "state" | "archived">): ExperimentAction[] {
  const out: ExperimentAction[] = [];
  switch (e.state) {
    case "EXPERIMENT_STATE_ACTIVE":
      out.push("pause", "cancel", "kill");
      break;
    case "EXPERIMENT_STATE_PAUSED":
      out.push("activate", "cancel", "kill");
      break;
    case "EXPERIMENT_STATE_STOPPING_CANCELED":
      out.push("kill");
      break;
    default:
      break;
  }
  if (isTerminal(e.state)) out.push(e.archived ? "unarchive" : "archive");
  return out;
}

// One formatter for all: toLocaleString() builds a new one per call (slow in big tables).
const INT = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });

export function fmtNumber(v: number, digits = 4): string {
  if (!Number.isFinite(v)) return Number.isNaN(v) ? "–" : String(v);
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e6 || a < 1e-3) return v.toExponential(2);
  if (Number.isInteger(v)) return INT.format(v);
  return Number(v.toPrecision(digits)).toString();
}

/** "1 checkpoint", "2 checkpoints": a count and its noun, singular for exactly one. */
export function plural(n: number, word: string, words = `${word}s`): string {
  return `${n} ${n === 1 ? word : words}`;
}

export function fmtInt(v: number): string {
  return Number.isFinite(v) ? INT.format(Math.round(v)) : "–";
}

export function fmtBytes(v: number): string {
  if (!Number.isFinite(v) || v <= 0) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v < 10 && i > 0 ? v.toFixed(1) : Math.round(v)} ${units[i]}`;
}

export function fmtPercent(fraction: number): string {
  return Number.isFinite(fraction) ? `${Math.round(fraction * 100)}%` : "–";
}

export function fmtTime(iso?: string): string {
  if (!iso) return "–";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return "–";
  const now = new Date();
  const sameDay = d.toDateString() === now.toDateString();
  const pad = (n: number) => String(n).padStart(2, "0");
  const time = `${pad(d.getHours())}:${pad(d.getMinutes())}`;
  if (sameDay) return time;
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${time}`;
}

export function fmtDuration(start?: string, end?: string): string {
  if (!start) return "–";
  const t0 = Date.parse(start);
  const t1 = end ? Date.parse(end) : Date.now();
  if (!Number.isFinite(t0) || !Number.isFinite(t1)) return "–";
  let s = Math.max(0, Math.round((t1 - t0) / 1000));
  const d = Math.floor(s / 86400);
  s -= d * 86400;
  const h = Math.floor(s / 3600);
  s -= h * 3600;
  const m = Math.floor(s / 60);
  s -= m * 60;
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${m}m`;
  if (m) return `${m}m ${s}s`;
  return `${s}s`;
}

export function fmtValue(v: JsonValue | undefined): string {
  if (v === undefined || v === null) return "–";
  if (typeof v === "number") return fmtNumber(v);
  if (typeof v === "string") return v;
  if (typeof v === "boolean") return String(v);
  return JSON.stringify(v);
}

// -- the experiment config ---------------------------------------------------------------

function asObject(v: JsonValue | undefined): JsonObject | undefined {
  return v && typeof v === "object" && !Array.isArray(v) ? v : undefined;
}

function asNumber(v: JsonValue | undefined): number | undefined {
  return typeof v === "number" && Number.isFinite(v) ? v : undefined;
}

export interface SearcherInfo {
  metric: string;
  smallerIsBetter: boolean;
}

export function searcherInfo(config: JsonObject | undefined): SearcherInfo {
  const s = asObject(config?.["searcher"]);
  // A multi-objective search: its first metric serves where one is needed (a bare name is
  // smaller-is-better).
  const first = Array.isArray(s?.["metrics"]) ? s["metrics"][0] : undefined;
  if (typeof s?.["metric"] !== "string" && first !== undefined) {
    const named = asObject(first);
    return {
      metric: typeof first === "string" ? first : typeof named?.["name"] === "string" ? named["name"] : "",
      smallerIsBetter: named?.["smaller_is_better"] !== false,
    };
  }
  return {
    metric: typeof s?.["metric"] === "string" ? s["metric"] : "",
    smallerIsBetter: s?.["smaller_is_better"] !== false,
  };
}

/** Batches per epoch when the config says both the global batch size and the records per
 * epoch; undefined otherwise (then only batches can be shown). */
export function batchesPerEpoch(config: JsonObject | undefined): number | undefined {
  if (!config) return undefined;
  const data = asObject(config["data"]);
  const records = asNumber(config["records_per_epoch"]) ?? asNumber(data?.["records_per_epoch"]);
  const hp = asObject(config["hyperparameters"])?.["global_batch_size"];
  const gbs = asNumber(hp) ?? asNumber(asObject(hp)?.["val"]);
  if (!records || !gbs) return undefined;
  return records / gbs;
}

export type HparamKind = "log" | "int" | "double" | "categorical" | "const";

export interface HparamSpec {
  name: string;
  kind: HparamKind;
  min?: number;
  max?: number;
  base?: number;
  values?: JsonValue[];
}

/** The searched hyperparameters (not the constant ones) from the config. */
export function hparamSpecs(config: JsonObject | undefined): HparamSpec[] {
  const hps = asObject(config?.["hyperparameters"]);
  if (!hps) return [];
  const out: HparamSpec[] = [];
  for (const [name, raw] of Object.entries(hps)) {
    const h = asObject(raw);
    const type = typeof h?.["type"] === "string" ? h["type"] : "const";
    if (type === "log") {
      const base = asNumber(h?.["base"]) ?? 10;
      out.push({
        name,
        kind: "log",
        base,
        min: base ** (asNumber(h?.["minval"]) ?? 0),
        max: base ** (asNumber(h?.["maxval"]) ?? 0),
      });
    } else if (type === "int" || type === "double") {
      out.push({ name, kind: type, min: asNumber(h?.["minval"]), max: asNumber(h?.["maxval"]) });
    } else if (type === "categorical") {
      const vals = h?.["vals"];
      out.push({ name, kind: "categorical", values: Array.isArray(vals) ? vals : [] });
    }
  }
  return out;
}

/** The config as YAML text (block style; strings quoted only where YAML needs it). */
export function toYaml(value: JsonValue, indent = 0): string {
  const pad = "  ".repeat(indent);
  if (Array.isArray(value)) {
    if (value.length === 0) return "[]";
    return value
      .map((v) => {
        const inner = toYaml(v, indent + 1);
        return isBlock(v) ? `${pad}-\n${inner}` : `${pad}- ${inner}`;
      })
      .join("\n");
  }
  if (value && typeof value === "object") {
    const entries = Object.entries(value);
    if (entries.length === 0) return "{}";
    return entries
      .map(([k, v]) => {
        const key = yamlScalar(k);
        return isBlock(v) ? `${pad}${key}:\n${toYaml(v, indent + 1)}` : `${pad}${key}: ${toYaml(v, indent + 1)}`;
      })
      .join("\n");
  }
  return yamlScalar(value);
}

function isBlock(v: JsonValue): boolean {
  return !!v && typeof v === "object" && (Array.isArray(v) ? v.length > 0 : Object.keys(v).length > 0);
}

function yamlScalar(v: JsonValue): string {
  if (v === null) return "null";
  if (typeof v === "number" || typeof v === "boolean") return String(v);
  if (typeof v !== "string") return JSON.stringify(v);
  const plain =
    v !== "" &&
    /^[A-Za-z0-9_./][A-Za-z0-9_ ./:@-]*$/.test(v) &&
    !/: |\s$/.test(v) &&
    !/^(true|false|null|yes|no|on|off|~)$/i.test(v) &&
    Number.isNaN(Number(v));
  return plain ? v : JSON.stringify(v);
}
