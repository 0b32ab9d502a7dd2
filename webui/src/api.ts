// All access to the master's HTTP API: one fetch wrapper, typed responses, one error type.
//
// The JSON is protobuf's JSON mapping with proto field names (snake_case); int64 fields
// arrive as numbers when they fit in a double, else as strings; doubles may be the strings
// "NaN" / "Infinity"; enums are names (EXPERIMENT_STATE_ACTIVE); timestamps RFC 3339.

import { endSession, sessionToken, type User } from "./session";
import { follow } from "./sse";

export type { User } from "./session";

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
  resource_pools?: string[];
  default_resource_pool?: string;
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
  /** The config as submitted (order and comments kept, secrets masked); GetExperiment only. */
  config_yaml?: string;
  searcher: string;
  best_validation?: Double;
  num_trials: number;
  start_time?: string;
  end_time?: string;
  workspace?: string;
  project?: string;
  /** Why its queued trials cannot start on the cluster as it is, even idle ("needs 8 CPU
   * slots; the cluster has 2 (1 agent)"); absent when none is stuck. */
  waiting?: string;
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
  /** Queued and unable to start on the cluster as it is: why, with the numbers. */
  waiting?: string;
  /** While it runs: each rank's latest utilisation, from its agent's heartbeat. */
  ranks?: RankUsage[];
  /** A pbt copy: the trial whose checkpoint it started from, and the round that made it. */
  parent_trial_id?: Int64;
  search_round?: number;
}

export interface RankUsage {
  allocation_id: string;
  rank: number;
  agent_id: string;
  slot: number;
  /** CPU time per second of the rank's processes: 1 is one core busy. */
  cpu_utilization: Double;
  memory_rss_bytes: Int64;
  /** The slot's GPU, 0-1 (0 on CPU slots). */
  device_utilization: Double;
  device_memory_used_bytes: Int64;
  device_memory_bytes: Int64;
  time?: string;
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
  /** Slot-seconds its allocations held (running ones up to now); its owner and admins only. */
  slot_seconds?: Double;
  /** A multi-objective search's metrics (searcher.metrics), in order; empty otherwise. */
  objectives?: Objective[];
  /** Each validated trial's final validation vector and its Pareto rank (with objectives). */
  pareto_points?: ParetoPoint[];
}

export interface Objective {
  name: string;
  smaller_is_better: boolean;
}

export interface ParetoPoint {
  trial_id: Int64;
  /** The batch count of the validation the values are from. */
  total_batches: Int64;
  /** In the order of the objectives; "NaN" where the trial did not report one. */
  values: Double[];
  /** Non-domination rank: 0 on the front. */
  rank: number;
  on_front: boolean;
}

export type UsageBy = "user" | "experiment" | "pool" | "agent" | "day";

export interface UsageGroup {
  /** Username, experiment id, pool, agent id, or day (YYYY-MM-DD). */
  key: string;
  name: string;
  /** YYYY-MM-DD with per_day, else "". */
  day: string;
  slot_seconds: Double;
  slot_hours: Double;
}

export interface PoolUsage {
  pool: string;
  used_slot_seconds: Double;
  /** The pool's connected slots now, times the window up to now. */
  capacity_slot_seconds: Double;
  used_ratio: Double;
  idle_ratio: Double;
}

export interface UsageReport {
  since: string;
  until: string;
  by: UsageBy;
  groups: UsageGroup[];
  /** Admins only. */
  pools: PoolUsage[];
  /** False: only the caller's own usage is counted. */
  all_users: boolean;
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
  /** Empty when free, and to a user who may not see the trial on it (`busy` then). */
  allocation_id: string;
  trial_id: Int64;
  busy?: boolean;
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
  resource_pool?: string;
  agent_label?: string;
  /** Disabled with drain: no new trials; its running ones finish. */
  draining?: boolean;
}

export interface PoolSlots {
  slot_type: SlotType;
  total?: number;
  used?: number;
  free?: number;
}

export interface ResourcePool {
  name: string;
  description?: string;
  /** priority | fair_share */
  scheduler: string;
  agents?: string[];
  slots?: PoolSlots[];
  queued_trials?: number;
  default?: boolean;
  /** The workspaces whose experiments may use it; none: every workspace. */
  bindings?: PoolBinding[];
}

export interface PoolBinding {
  workspace: string;
  /** Bound by the master's settings: not removed from here. */
  from_settings?: boolean;
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
  /** Why it cannot start even on the idle cluster; absent when it waits for free slots. */
  reason?: string;
  /** Its place in its pool's queue as the last scheduling round considered it (1 first). */
  position?: number;
  /** too_large | max_slots | quota | share | priority | no_free_slots */
  wait_kind?: string;
  /** Why it waits, in words, with the numbers. */
  waiting?: string;
  resource_pool?: string;
}

export interface Model {
  id: Int64;
  name: string;
  description: string;
  labels: string[];
  metadata?: JsonObject;
  archived: boolean;
  owner: string;
  /** Whose editors may change it, beside its owner and admins (in Default: nobody else). */
  workspace?: string;
  num_versions: number;
  /** 0: none yet. */
  latest_version: number;
  created_at?: string;
  updated_at?: string;
}

export interface ModelVersion {
  model: string;
  version: number;
  checkpoint_uuid: string;
  /** Its experiment, trial, batches, files and validation metrics. */
  checkpoint?: Checkpoint;
  notes: string;
  labels: string[];
  metadata?: JsonObject;
  /** Who registered it. */
  user: string;
  created_at?: string;
  updated_at?: string;
  /** Its checkpoint's owner deleted the checkpoint: nothing to download or load. */
  checkpoint_deleted?: boolean;
  checkpoint_deleted_at?: string;
  /** Who uploaded the code of the checkpoint's experiment (what loading it runs). */
  code_owner?: string;
}

export interface Workspace {
  name: string;
  archived: boolean;
  num_projects: number;
  num_experiments: number;
  /** The caller's role: viewer | editor | admin. */
  role: string;
}

export interface Project {
  workspace: string;
  name: string;
  description: string;
  archived: boolean;
  num_experiments: number;
}

export interface WorkspaceMember {
  username: string;
  role: string;
}

export interface WorkspaceDetail {
  workspace: Workspace;
  projects?: Project[];
  members?: WorkspaceMember[];
}

export interface LoginAnswer {
  token: string;
  expires_at: string;
  user: User;
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

interface SendOptions {
  query?: Query;
  /** Sent as JSON. */
  body?: unknown;
  signal?: AbortSignal;
  headers?: Record<string, string>;
  /** A 401 is the call's own answer (a wrong password), not an ended session. */
  own401?: boolean;
}

/**
 * Send one request with the session's bearer token; a non-2xx answer throws ApiError with
 * the server's message. A 401 means the session is over (expired, revoked, logged out
 * elsewhere): the token is forgotten, which sends the app to the login page.
 */
async function send(method: "GET" | "POST" | "DELETE", path: string, options: SendOptions = {}): Promise<Response> {
  const url = apiUrl(path, options.query);
  const token = sessionToken();
  const headers: Record<string, string> = { Accept: "application/json", ...options.headers };
  if (token) headers["Authorization"] = `Bearer ${token}`;
  const init: RequestInit = { method, headers, credentials: "same-origin" };
  if (options.signal) init.signal = options.signal;
  if (options.body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(options.body);
  }
  let response: Response;
  try {
    response = await fetch(url, init);
  } catch (e) {
    if (e instanceof DOMException && (e.name === "AbortError" || e.name === "TimeoutError")) throw e;
    throw new ApiError(`cannot reach the master (${String(e)})`, 0, url);
  }
  if (response.ok) return response;
  const text = await response.text().catch(() => "");
  // Only the session that sent the request ends: a late answer to an old token must not
  // log out the user who has just logged in again.
  if (response.status === 401 && !options.own401 && token === sessionToken()) {
    lastAnswers.clear();
    endSession("expired");
  }
  throw new ApiError(errorMessage(text, response), response.status, url);
}

async function request<T>(method: "GET" | "POST" | "DELETE", path: string, options: SendOptions = {}): Promise<T> {
  const response = await send(method, path, options);
  const url = apiUrl(path, options.query);
  const text = await response.text();
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
  workspace?: string;
  project?: string;
}

export const api = {
  /** Log in; the token goes to `startSession`. A wrong password is a 401 ApiError. */
  login: (username: string, password: string) =>
    request<LoginAnswer>("POST", "/login", { body: { username, password }, own401: true }),

  /** End the session of `token` on the master (the caller forgets it here). */
  logout: (token: string) =>
    request<unknown>("POST", "/logout", {
      body: {},
      headers: { Authorization: `Bearer ${token}` },
      own401: true,
    }),

  me: (signal?: AbortSignal) => request<User>("GET", "/me", { signal }),

  users: (signal?: AbortSignal) => request<{ users: User[] }>("GET", "/users", { signal }),

  createUser: (username: string, password: string, admin: boolean) =>
    request<User>("POST", "/users", { body: { username, password, admin } }),

  /**
   * Your own password needs `oldPassword`; an admin may reset another's without it. The
   * master ends the user's other sessions (all of them after an admin's reset). A wrong
   * `oldPassword` is a 401 that is the call's own answer, not the end of the session.
   */
  changePassword: (username: string, newPassword: string, oldPassword?: string) =>
    request<User>("POST", `/users/${encodeURIComponent(username)}/password`, {
      body: { old_password: oldPassword ?? "", new_password: newPassword },
      own401: oldPassword !== undefined,
    }),

  setUserActive: (username: string, active: boolean) =>
    request<User>("POST", `/users/${encodeURIComponent(username)}/${active ? "activate" : "deactivate"}`, {
      body: {},
    }),

  master: (signal?: AbortSignal) => request<MasterInfo>("GET", "/master", { signal }),

  experiments: (params: ListExperimentsParams, signal?: AbortSignal) =>
    request<ExperimentList>("GET", "/experiments", { query: { ...params }, signal }),

  experiment: (id: Int64, signal?: AbortSignal) =>
    request<ExperimentDetail>("GET", `/experiments/${id}`, { signal }),

  experimentMetrics: (
    id: Int64,
    params: { name: string; group: string; max_points?: number },
    signal?: AbortSignal,
  ) => request<{ curves: Curve[] }>("GET", `/experiments/${id}/metrics`, { query: { ...params }, signal }),

  experimentAction: (id: Int64, action: ExperimentAction) =>
    request<Experiment>("POST", `/experiments/${id}/${action}`),

  /** Delete an ended experiment with its trials, metrics, logs and checkpoints; `failed`
   * names the checkpoints whose files could not be removed (their records go all the same). */
  deleteExperiment: (id: Int64) =>
    request<{ deleted_checkpoints?: string[]; failed?: Record<string, string> }>("DELETE", `/experiments/${id}`),

  /** A new experiment of `configYaml` with experiment `from`'s model definition (a fork). */
  forkExperiment: (from: Int64, configYaml: string, activate: boolean) =>
    request<{ experiment: Experiment; warnings?: string[] }>("POST", "/experiments", {
      body: { config_yaml: configYaml, model_definition_from: from, activate },
    }),

  trial: (id: Int64, signal?: AbortSignal) => request<Trial>("GET", `/trials/${id}`, { signal }),

  trialMetrics: (id: Int64, group: string, maxPoints: number, signal?: AbortSignal) =>
    request<{ reports: MetricsReport[] }>("GET", `/trials/${id}/metrics`, {
      query: { group, max_points: maxPoints },
      signal,
    }),

  trialLogs: (id: Int64, params: { after_id?: Int64; tail?: number }, signal?: AbortSignal) =>
    request<LogLine[]>("GET", `/trials/${id}/logs`, { query: { ...params }, signal }),

  /**
   * Follow a trial's live log (server-sent events, one JSON LogLine per event) until the
   * trial ends, `signal` aborts, or the stream fails; a dropped connection resumes after
   * the last line received.
   */
  followTrialLogs: (
    id: Int64,
    afterId: Int64 | undefined,
    handlers: {
      onOpen: () => void;
      onLines: (lines: LogLine[]) => void;
      onEnd: () => void;
      onFail: (error: unknown) => void;
      onRetry: () => void;
    },
    signal: AbortSignal,
  ) =>
    follow(
      (lastId, connSignal) =>
        send("GET", `/trials/${id}/logs`, {
          query: { follow: true, after_id: lastId },
          headers: { Accept: "text/event-stream", ...(lastId ? { "Last-Event-ID": lastId } : {}) },
          signal: connSignal,
        }),
      {
        onOpen: handlers.onOpen,
        onEvent: (ev) => {
          try {
            handlers.onLines([JSON.parse(ev.data) as LogLine]);
          } catch {
            // not a log line: skip it
          }
        },
        onEnd: handlers.onEnd,
        onFail: handlers.onFail,
        onRetry: handlers.onRetry,
      },
      signal,
      {
        lastEventId: afterId === undefined ? undefined : String(afterId),
        // Try again after network errors and while the master restarts (5xx); a refusal
        // (401, 403, 404) will not change by asking again.
        retryable: (e) => !(e instanceof ApiError) || e.status === 0 || e.status === 429 || e.status >= 500,
      },
    ),

  checkpoints: (by: { experiment_id: Int64 } | { trial_id: Int64 }, signal?: AbortSignal) =>
    request<{ checkpoints: Checkpoint[] }>("GET", "/checkpoints", { query: { ...by }, signal }),

  agents: (signal?: AbortSignal) => request<{ agents: Agent[] }>("GET", "/agents", { signal }),

  /** The trials waiting for slots, the first to be placed first. */
  queue: (signal?: AbortSignal) => request<{ trials: QueuedTrial[] }>("GET", "/queue", { signal }),

  /** Slot usage in [since, until) (a user's own; everyone's for admins). */
  usage: (params: { by: UsageBy; since?: string; until?: string; per_day?: boolean }, signal?: AbortSignal) =>
    request<UsageReport>("GET", "/usage", { query: { ...params }, signal }),

  setAgentEnabled: (id: string, enabled: boolean) =>
    request<Agent>("POST", `/agents/${encodeURIComponent(id)}/${enabled ? "enable" : "disable"}`),

  /** Place no new trials on the agent; its running ones finish. */
  drainAgent: (id: string) => request<Agent>("POST", `/agents/${encodeURIComponent(id)}/drain`),

  resourcePools: (signal?: AbortSignal) =>
    request<{ pools?: ResourcePool[] }>("GET", "/resource-pools", { signal }),

  /** Bind a pool to a workspace, or remove a binding (admins). */
  bindPool: (pool: string, workspace: string, bind: boolean) =>
    request<{ bindings?: PoolBinding[] }>(
      "POST",
      `/resource-pools/${encodeURIComponent(pool)}/${bind ? "bind" : "unbind"}`,
      { body: { workspace } },
    ),

  models: (params: { name?: string; label?: string; archived?: boolean }, signal?: AbortSignal) =>
    request<{ models?: Model[] }>("GET", "/models", { query: { ...params }, signal }),

  model: (name: string, signal?: AbortSignal) =>
    request<Model>("GET", `/models/${encodeURIComponent(name)}`, { signal }),

  createModel: (name: string, description: string, workspace = "") =>
    request<Model>("POST", "/models", { body: { name, description, workspace } }),

  modelVersions: (name: string, signal?: AbortSignal) =>
    request<{ versions?: ModelVersion[] }>("GET", `/models/${encodeURIComponent(name)}/versions`, { signal }),

  /** The checkpoint becomes the model's next version (and is kept from deletion). */
  registerVersion: (name: string, checkpointUuid: string, notes: string) =>
    request<ModelVersion>("POST", `/models/${encodeURIComponent(name)}/versions`, {
      body: { checkpoint_uuid: checkpointUuid, notes },
    }),

  setModelArchived: (name: string, archived: boolean) =>
    request<Model>("POST", `/models/${encodeURIComponent(name)}/${archived ? "archive" : "unarchive"}`),

  workspaces: (signal?: AbortSignal) => request<{ workspaces?: Workspace[] }>("GET", "/workspaces", { signal }),

  workspace: (name: string, signal?: AbortSignal) =>
    request<WorkspaceDetail>("GET", `/workspaces/${encodeURIComponent(name)}`, { signal }),

  createWorkspace: (name: string) => request<Workspace>("POST", "/workspaces", { body: { name } }),

  project: (workspace: string, name: string, signal?: AbortSignal) =>
    request<Project>("GET", `/workspaces/${encodeURIComponent(workspace)}/projects/${encodeURIComponent(name)}`, {
      signal,
    }),

  createProject: (workspace: string, name: string, description: string) =>
    request<Project>("POST", `/workspaces/${encodeURIComponent(workspace)}/projects`, { body: { name, description } }),

  openapi: (signal?: AbortSignal) =>
    request<{ paths: Record<string, unknown> }>("GET", "/openapi.json", { signal }),
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
