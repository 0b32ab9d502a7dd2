// All access to the master's HTTP API: one fetch wrapper, typed responses, one error type.
//
// The JSON is protobuf's JSON mapping with proto field names (snake_case); int64 fields
// arrive as numbers when they fit in a double, else as strings; doubles may be the strings
// "NaN" / "Infinity"; enums are names (EXPERIMENT_STATE_ACTIVE); timestamps RFC 3339.

export const API_PREFIX = "/api/v1";

/** An int64: a number when it fits in a double, else a string. */
export type Int64 = number | string;
/** A double: a number, or "NaN" / "Infinity" / "-Infinity". */
export type Double = number | string;

export type ExperimentState =
  | "EXPERIMENT_STATE_UNSPECIFIED"
  | "EXPERIMENT_STATE_ACTIVE"
  | "EXPERIMENT_STATE_PAUSED"
  | "EXPERIMENT_STATE_STOPPING_CANCELED"
  | "EXPERIMENT_STATE_STOPPING_KILLED"
  | "EXPERIMENT_STATE_COMPLETED"
  | "EXPERIMENT_STATE_CANCELED"
  | "EXPERIMENT_STATE_ERROR";

export const EXPERIMENT_STATES: ExperimentState[] = [
  "EXPERIMENT_STATE_ACTIVE",
  "EXPERIMENT_STATE_PAUSED",
  "EXPERIMENT_STATE_STOPPING_CANCELED",
  "EXPERIMENT_STATE_STOPPING_KILLED",
  "EXPERIMENT_STATE_COMPLETED",
  "EXPERIMENT_STATE_CANCELED",
  "EXPERIMENT_STATE_ERROR",
];

export type TrialState =
  | "TRIAL_STATE_UNSPECIFIED"
  | "TRIAL_STATE_QUEUED"
  | "TRIAL_STATE_RUNNING"
  | "TRIAL_STATE_PAUSED"
  | "TRIAL_STATE_STOPPING"
  | "TRIAL_STATE_COMPLETED"
  | "TRIAL_STATE_CANCELED"
  | "TRIAL_STATE_ERROR";

export type SlotType = "SLOT_TYPE_UNSPECIFIED" | "SLOT_TYPE_CPU" | "SLOT_TYPE_CUDA";
export type CheckpointState =
  | "CHECKPOINT_STATE_UNSPECIFIED"
  | "CHECKPOINT_STATE_COMPLETED"
  | "CHECKPOINT_STATE_DELETED";

export type JsonValue = null | boolean | number | string | JsonValue[] | { [k: string]: JsonValue };
export type JsonObject = { [k: string]: JsonValue };

export interface MasterInfo {
  version: string;
  cluster_id: string;
  store: string;
  agents: number;
  slots: number;
  free_slots: number;
  queued_trials: number;
}

export interface Experiment {
  id: Int64;
  name: string;
  description: string;
  owner: string;
  state: ExperimentState;
  labels: string[];
  priority: number;
  progress: Double;
  archived: boolean;
  config?: JsonObject;
  searcher: string;
  best_validation?: Double;
  num_trials: number;
  start_time?: string;
  end_time?: string;
}

export interface Trial {
  id: Int64;
  experiment_id: Int64;
  state: TrialState;
  hparams?: JsonObject;
  seed: Int64;
  run_id: number;
  restarts: number;
  total_batches: Int64;
  best_validation?: Double;
  latest_checkpoint: string;
  start_time?: string;
  end_time?: string;
  last_error: string;
}

export interface MetricName {
  group: string;
  name: string;
}

export interface ExperimentDetail {
  experiment: Experiment;
  trials: Trial[];
  /** Present once the master reports it: every (group, name) some trial reported. */
  metric_names?: MetricName[];
}

export interface ExperimentList {
  experiments: Experiment[];
  total: number;
}

export interface Curve {
  trial_id: Int64;
  total_batches: Int64[];
  values: Double[];
}

export interface MetricsReport {
  total_batches: Int64;
  metrics: Record<string, Double>;
}

export interface CheckpointFile {
  name: string;
  size_bytes: Int64;
  sha256: string;
}

export interface Checkpoint {
  uuid: string;
  trial_id: Int64;
  experiment_id: Int64;
  run_id: number;
  total_batches: Int64;
  state: CheckpointState;
  location: string;
  files: CheckpointFile[];
  user_metadata?: JsonObject;
  validation_metrics: Record<string, Double>;
}

export interface Device {
  index: number;
  type: SlotType;
  name: string;
  uuid: string;
  memory_bytes: Int64;
  utilization: Double;
}

export interface Slot {
  agent_id: string;
  index: number;
  type: SlotType;
  enabled: boolean;
  allocation_id: string;
  trial_id: Int64;
}

export interface Agent {
  id: string;
  address: string;
  slot_type: SlotType;
  devices: Device[];
  slots: Slot[];
  connected: boolean;
  enabled: boolean;
  last_heartbeat?: string;
  memory_bytes: Int64;
  memory_used_fraction: Double;
  cpu_utilization: Double;
}

export interface LogLine {
  id: Int64;
  trial_id: Int64;
  run_id: number;
  rank: number;
  stream: string;
  level: string;
  timestamp?: string;
  message: string;
}

export interface QueuedTrial {
  trial_id: Int64;
  experiment_id: Int64;
  experiment_name: string;
  priority: number;
  slots: number;
  slot_type: SlotType;
}

export type ExperimentAction = "pause" | "activate" | "cancel" | "kill" | "archive" | "unarchive";

/** A failed call: `message` is the server's own explanation when it gave one. */
export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly path: string,
  ) {
    super(message);
    this.name = "ApiError";
  }

  get notFound(): boolean {
    return this.status === 404;
  }
}

// -- the one place every request goes through ------------------------------------------

let bearerToken: string | null = null;

/** Set (or clear) the token sent with every request; the login page will call this. */
export function setBearerToken(token: string | null): void {
  bearerToken = token;
}

type Query = Record<string, string | number | boolean | undefined | null | Array<string | number>>;

export function apiUrl(path: string, query?: Query): string {
  const qs = new URLSearchParams();
  for (const [key, value] of Object.entries(query ?? {})) {
    if (value === undefined || value === null || value === "") continue;
    if (Array.isArray(value)) value.forEach((v) => qs.append(key, String(v)));
    else qs.append(key, String(value));
  }
  const s = qs.toString();
  return API_PREFIX + path + (s ? "?" + s : "");
}

async function request<T>(
  method: "GET" | "POST",
  path: string,
  query?: Query,
  signal?: AbortSignal,
): Promise<T> {
  const url = apiUrl(path, query);
  const headers: Record<string, string> = { Accept: "application/json" };
  if (bearerToken) headers["Authorization"] = `Bearer ${bearerToken}`;
  let response: Response;
  try {
    response = await fetch(url, { method, headers, signal, credentials: "same-origin" });
  } catch (e) {
    if (e instanceof DOMException && e.name === "AbortError") throw e;
    throw new ApiError(`cannot reach the master (${String(e)})`, 0, url);
  }
  const text = await response.text();
  if (!response.ok) throw new ApiError(errorMessage(text, response), response.status, url);
  // A poll that brings the same answer returns the same object, so nothing re-renders.
  const last = method === "GET" ? lastAnswers.get(url) : undefined;
  if (last && last.text === text) return last.value as T;
  let value: T;
  try {
    value = JSON.parse(text) as T;
  } catch {
    throw new ApiError(`the master sent a response that is not JSON (${url})`, response.status, url);
  }
  if (method === "GET") {
    lastAnswers.delete(url);
    lastAnswers.set(url, { text, value });
    if (lastAnswers.size > 32) lastAnswers.delete(lastAnswers.keys().next().value!);
  }
  return value;
}

/** The last answer per GET URL (a few, oldest dropped first). */
const lastAnswers = new Map<string, { text: string; value: unknown }>();

function errorMessage(body: string, response: Response): string {
  try {
    const parsed: unknown = JSON.parse(body);
    if (parsed && typeof parsed === "object" && "error" in parsed) {
      const error = (parsed as { error: unknown }).error;
      if (typeof error === "string") return error;
      if (error && typeof error === "object" && "message" in error) {
        return String((error as { message: unknown }).message);
      }
    }
  } catch {
    // not JSON: fall through to the status line
  }
  return `${response.status} ${response.statusText || "error"}`.trim();
}

// -- routes ------------------------------------------------------------------------------

export interface ListExperimentsParams {
  states?: string[];
  name?: string;
  label?: string;
  owner?: string;
  sort_by?: string;
  ascending?: boolean;
  limit?: number;
  offset?: number;
  archived?: boolean;
}

export const api = {
  master: (signal?: AbortSignal) => request<MasterInfo>("GET", "/master", undefined, signal),

  experiments: (params: ListExperimentsParams, signal?: AbortSignal) =>
    request<ExperimentList>("GET", "/experiments", { ...params }, signal),

  experiment: (id: Int64, signal?: AbortSignal) =>
    request<ExperimentDetail>("GET", `/experiments/${id}`, undefined, signal),

  experimentMetrics: (
    id: Int64,
    params: { name: string; group: string; max_points?: number },
    signal?: AbortSignal,
  ) =>
    request<{ curves: Curve[] }>("GET", `/experiments/${id}/metrics`, { ...params }, signal),

  experimentAction: (id: Int64, action: ExperimentAction) =>
    request<Experiment>("POST", `/experiments/${id}/${action}`),

  trial: (id: Int64, signal?: AbortSignal) =>
    request<Trial>("GET", `/trials/${id}`, undefined, signal),

  trialMetrics: (id: Int64, group: string, maxPoints: number, signal?: AbortSignal) =>
    request<{ reports: MetricsReport[] }>(
      "GET",
      `/trials/${id}/metrics`,
      { group, max_points: maxPoints },
      signal,
    ),

  trialLogs: (id: Int64, params: { after_id?: Int64; tail?: number }, signal?: AbortSignal) =>
    request<LogLine[]>("GET", `/trials/${id}/logs`, { ...params }, signal),

  /** The URL of a trial's live log (server-sent events; one JSON LogLine per event). */
  trialLogStreamUrl: (id: Int64, afterId: Int64 | undefined) =>
    apiUrl(`/trials/${id}/logs`, { follow: true, after_id: afterId }),

  checkpoints: (by: { experiment_id: Int64 } | { trial_id: Int64 }, signal?: AbortSignal) =>
    request<{ checkpoints: Checkpoint[] }>("GET", "/checkpoints", { ...by }, signal),

  agents: (signal?: AbortSignal) => request<{ agents: Agent[] }>("GET", "/agents", undefined, signal),

  /** The trials waiting for slots, the first to be placed first. */
  queue: (signal?: AbortSignal) => request<{ trials: QueuedTrial[] }>("GET", "/queue", undefined, signal),

  setAgentEnabled: (id: string, enabled: boolean) =>
    request<Agent>("POST", `/agents/${encodeURIComponent(id)}/${enabled ? "enable" : "disable"}`),

  openapi: (signal?: AbortSignal) =>
    request<{ paths: Record<string, unknown> }>("GET", "/openapi.json", undefined, signal),
};

// -- optional routes ---------------------------------------------------------------------

let routesPromise: Promise<Set<string>> | null = null;

/** The API paths this master serves (from its OpenAPI document), fetched once. */
export function servedRoutes(): Promise<Set<string>> {
  routesPromise ??= api
    .openapi()
    .then((doc) => new Set(Object.keys(doc.paths ?? {})))
    .catch(() => {
      routesPromise = null;
      return new Set<string>();
    });
  return routesPromise;
}

// -- value helpers -----------------------------------------------------------------------

/** An int64 or double field as a number (NaN for "NaN", ±Infinity, or absent). */
export function num(value: Int64 | Double | undefined | null): number {
  if (value === undefined || value === null) return NaN;
  if (typeof value === "number") return value;
  return Number(value);
}
