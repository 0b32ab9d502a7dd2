// `/`: the experiments, filtered, sorted and paged (by the server, or here for a column it
// cannot sort by: hyperparameters, metrics); all of it in the URL, the columns in localStorage.
import { useCallback, useEffect, useMemo, useState, type ReactNode } from "react";
import { Link, useSearchParams } from "react-router";
import {
  api,
  num,
  type Experiment,
  type JsonObject,
  type JsonValue,
  type ListExperimentsParams,
} from "../api";
import { Filters, queryStates } from "../components/ExperimentFilters";
import { ErrorPanel, ExperimentActions, Loading, Progress, StateBadge, WaitingNote } from "../components/ui";
import { fmtDuration, fmtNumber, fmtTime, fmtValue, plural, searcherInfo } from "../format";
import { POLL_MS, usePoll } from "../hooks";
import { toggleSelected, useSelection } from "../selection";

const PAGE_SIZES = [25, 50, 100];
const DEFAULT_LIMIT = 50;
/** Sorting by a column the master cannot sort by: this many experiments are sorted here. */
const CLIENT_SORT_LIMIT = 1000;
const COLUMNS_KEY = "assay.experimentColumns";

interface Column {
  id: string;
  title: string;
  /** The master's sort_by key; without it the page sorts (by `value`). */
  serverSort?: string;
  /** What sorts the column in the page (undefined: last). */
  value?: (e: Experiment) => number | string | undefined;
  className?: string;
  /** Always shown. */
  fixed?: boolean;
  cell: (e: Experiment) => ReactNode;
}

function bestCell(e: Experiment): ReactNode {
  const { metric } = searcherInfo(e.config);
  const best = num(e.best_validation);
  return (
    <>
      {Number.isFinite(best) ? fmtNumber(best) : "–"}
      {Number.isFinite(best) && metric && <span className="unit"> {metric}</span>}
    </>
  );
}

function finite(v: number): number | undefined {
  return Number.isFinite(v) ? v : undefined;
}

const BASE_COLUMNS: Column[] = [
  { id: "id", title: "ID", serverSort: "id", className: "num", fixed: true, cell: (e) => <Link to={`/experiments/${e.id}`}>{String(e.id)}</Link> },
  { id: "name", title: "Name", serverSort: "name", fixed: true, cell: (e) => <NameCell e={e} /> },
  {
    id: "project",
    title: "Project",
    value: (e) => (e.project ? `${e.workspace ?? ""}/${e.project}` : undefined),
    cell: (e) =>
      e.project ? (
        <Link to={projectPath(e.workspace ?? "", e.project)} className="muted-link">
          {e.workspace}/{e.project}
        </Link>
      ) : (
        "–"
      ),
  },
  {
    id: "state",
    title: "State",
    serverSort: "state",
    cell: (e) => (
      <>
        <StateBadge state={e.state} testId="experiment-state" />
        {e.waiting && <WaitingNote why={e.waiting} testId="experiment-waiting" />}
      </>
    ),
  },
  { id: "searcher", title: "Searcher", value: (e) => e.searcher || undefined, cell: (e) => e.searcher || "–" },
  { id: "progress", title: "Progress", serverSort: "progress", cell: (e) => <Progress value={num(e.progress)} /> },
  {
    id: "best",
    title: "Best metric",
    className: "num",
    value: (e) => finite(num(e.best_validation)),
    cell: bestCell,
  },
  { id: "trials", title: "Trials", className: "num", value: (e) => e.num_trials, cell: (e) => e.num_trials },
  { id: "owner", title: "Owner", serverSort: "owner", cell: (e) => e.owner || "–" },
  { id: "start", title: "Start", serverSort: "start_time", className: "nowrap", cell: (e) => fmtTime(e.start_time) },
  {
    id: "duration",
    title: "Duration",
    className: "nowrap",
    value: (e) => {
      if (!e.start_time) return undefined;
      const end = e.end_time ? Date.parse(e.end_time) : Date.now();
      return end - Date.parse(e.start_time);
    },
    cell: (e) => fmtDuration(e.start_time, e.end_time),
  },
];

function asObject(v: JsonValue | undefined): JsonObject | undefined {
  return v && typeof v === "object" && !Array.isArray(v) ? v : undefined;
}

/** An experiment's hyperparameter as its config states it: a value, or the searched range. */
function hparamOf(e: Experiment, name: string): { text: string; sort?: number | string } | undefined {
  const hps = asObject(e.config?.["hyperparameters"]);
  if (!hps || !(name in hps)) return undefined;
  const raw = hps[name];
  const h = asObject(raw);
  const type = typeof h?.["type"] === "string" ? h["type"] : undefined;
  const n = (v: JsonValue | undefined) => (typeof v === "number" ? v : NaN);
  if (!h || type === undefined) {
    return { text: fmtValue(raw), sort: typeof raw === "number" ? raw : fmtValue(raw) };
  }
  if (type === "const") return { text: fmtValue(h["val"]), sort: typeof h["val"] === "number" ? h["val"] : fmtValue(h["val"]) };
  if (type === "log") {
    const base = typeof h["base"] === "number" ? h["base"] : 10;
    const lo = base ** n(h["minval"]);
    const hi = base ** n(h["maxval"]);
    return { text: `log ${fmtNumber(lo)} – ${fmtNumber(hi)}`, sort: finite(lo) };
  }
  if (type === "int" || type === "double") {
    return { text: `${fmtNumber(n(h["minval"]))} – ${fmtNumber(n(h["maxval"]))}`, sort: finite(n(h["minval"])) };
  }
  if (type === "categorical" && Array.isArray(h["vals"])) {
    return { text: `{${h["vals"].map((v) => fmtValue(v)).join(", ")}}`, sort: fmtValue(h["vals"][0]) };
  }
  return { text: fmtValue(raw) };
}

function hparamColumn(name: string): Column {
  return {
    id: `hp:${name}`,
    title: name,
    className: "num hp-col",
    value: (e) => hparamOf(e, name)?.sort,
    cell: (e) => hparamOf(e, name)?.text ?? "–",
  };
}

function metricColumn(name: string): Column {
  const of = (e: Experiment) => (searcherInfo(e.config).metric === name ? finite(num(e.best_validation)) : undefined);
  return {
    id: `metric:${name}`,
    title: `${name} (best)`,
    className: "num",
    value: of,
    cell: (e) => {
      const v = of(e);
      return v === undefined ? "–" : fmtNumber(v);
    },
  };
}

/** The hyperparameter and metric columns these experiments offer. */
function extraColumns(experiments: Experiment[], shown: string[]): Column[] {
  const hps = new Set<string>();
  const metrics = new Set<string>();
  for (const e of experiments) {
    Object.keys(asObject(e.config?.["hyperparameters"]) ?? {}).forEach((k) => hps.add(k));
    const m = searcherInfo(e.config).metric;
    if (m) metrics.add(m);
  }
  // A chosen column stays offered while no experiment on this page has it.
  for (const id of shown) {
    if (id.startsWith("hp:")) hps.add(id.slice(3));
    if (id.startsWith("metric:")) metrics.add(id.slice(7));
  }
  return [...[...metrics].sort().map(metricColumn), ...[...hps].sort().map(hparamColumn)];
}

interface ColumnChoice {
  /** Base columns hidden. */
  hidden: string[];
  /** Hyperparameter and metric columns shown, in the order chosen. */
  shown: string[];
}

function readChoice(): ColumnChoice {
  try {
    const parsed = JSON.parse(window.localStorage.getItem(COLUMNS_KEY) ?? "{}") as Partial<ColumnChoice>;
    const strings = (v: unknown) => (Array.isArray(v) ? v.filter((x): x is string => typeof x === "string") : []);
    return { hidden: strings(parsed.hidden), shown: strings(parsed.shown) };
  } catch {
    return { hidden: [], shown: [] };
  }
}

function useColumnChoice(): [ColumnChoice, (c: ColumnChoice) => void] {
  const [choice, setChoice] = useState<ColumnChoice>(readChoice);
  const save = useCallback((c: ColumnChoice) => {
    setChoice(c);
    try {
      window.localStorage.setItem(COLUMNS_KEY, JSON.stringify(c));
    } catch {
      // not saved: the choice lasts while the page is open
    }
  }, []);
  return [choice, save];
}

function compareValues(a: number | string | undefined, b: number | string | undefined, asc: boolean): number {
  // Experiments without a value go last either way.
  if (a === undefined || b === undefined) return a === b ? 0 : a === undefined ? 1 : -1;
  let c: number;
  if (typeof a === "number" && typeof b === "number") c = a - b;
  else if (typeof a === "number") c = -1;
  else if (typeof b === "number") c = 1;
  else c = a.localeCompare(b);
  return asc ? c : -c;
}

export function projectPath(workspace: string, project: string): string {
  return `/workspaces/${encodeURIComponent(workspace)}/projects/${encodeURIComponent(project)}`;
}

/** The experiments of one project (its page), or of every project the user sees. */
export interface ListScope {
  workspace?: string;
  project?: string;
}

function listParams(q: URLSearchParams, serverSort: boolean, scope: ListScope): ListExperimentsParams {
  const limit = Number(q.get("limit")) || DEFAULT_LIMIT;
  const page = Math.max(1, Number(q.get("page")) || 1);
  const archived = q.get("archived");
  const sort = q.get("sort") ?? "id";
  return {
    states: queryStates(q.getAll("state")),
    name: q.get("name") ?? undefined,
    label: q.get("label") ?? undefined,
    owner: q.get("owner") ?? undefined,
    // Sorting in the page: the newest CLIENT_SORT_LIMIT experiments that match.
    sort_by: serverSort ? sort : "id",
    ascending: serverSort ? q.get("order") === "asc" : false,
    limit: serverSort ? limit : CLIENT_SORT_LIMIT,
    offset: serverSort ? (page - 1) * limit : 0,
    archived: archived === "all" ? undefined : archived === "only",
    workspace: scope.workspace,
    project: scope.project,
  };
}

export function ExperimentListPage({ scope = {}, title = "Experiments" }: { scope?: ListScope; title?: string }) {
  const [q, setQ] = useSearchParams();
  const sortId = q.get("sort") ?? "id";
  const asc = q.get("order") === "asc";
  const baseSort = BASE_COLUMNS.find((c) => c.id === sortId || c.serverSort === sortId);
  const serverSort = !!baseSort?.serverSort;
  const params = listParams(q, serverSort, scope);
  const key = JSON.stringify(params);
  // Sorting here reads up to CLIENT_SORT_LIMIT experiments: less often, and never faster
  // than a few times the time that takes.
  const list = usePoll(key, (signal) => api.experiments(params, signal), {
    intervalMs: serverSort ? POLL_MS : 10_000,
    backoff: serverSort ? 0 : 5,
  });
  const [actionError, setActionError] = useState<unknown>(null);
  const [updated, setUpdated] = useState<Record<string, Experiment>>({});
  const [choice, setChoice] = useColumnChoice();
  const picked = useSelection();

  useEffect(() => {
    document.title = `${title} · Assay`;
  }, [title]);
  // A fresh list supersedes rows updated by an action.
  useEffect(() => setUpdated({}), [list.data]);

  const update = (changes: Record<string, string | string[] | null>, resetPage = true) => {
    const next = new URLSearchParams(q);
    for (const [k, v] of Object.entries(changes)) {
      next.delete(k);
      if (Array.isArray(v)) v.forEach((x) => next.append(k, x));
      else if (v !== null && v !== "") next.set(k, v);
    }
    if (resetPage) next.delete("page");
    setQ(next, { replace: true });
  };

  const fetched = useMemo(
    () => (list.data?.experiments ?? []).map((e) => updated[String(e.id)] ?? e),
    [list.data, updated],
  );
  const extras = useMemo(() => extraColumns(fetched, choice.shown), [fetched, choice.shown]);
  const columns = useMemo(() => {
    const base = BASE_COLUMNS.filter((c) => c.fixed || !choice.hidden.includes(c.id));
    const chosen = choice.shown.map((id) => extras.find((c) => c.id === id)).filter((c): c is Column => !!c);
    return [...base, ...chosen];
  }, [choice, extras]);
  const sortColumn = baseSort ?? extras.find((c) => c.id === sortId);
  const sortKey = sortColumn?.serverSort ?? sortColumn?.id ?? sortId;

  const onSort = (col: Column) => {
    const key = col.serverSort ?? col.id;
    const nextAsc = sortKey === key ? !asc : col.id === "name" || col.id === "owner";
    update({ sort: key, order: nextAsc ? "asc" : "desc" }, false);
  };

  const total = list.data?.total ?? 0;
  const limit = Number(q.get("limit")) || DEFAULT_LIMIT;
  const page = serverSort ? Math.floor((params.offset ?? 0) / limit) + 1 : Math.max(1, Number(q.get("page")) || 1);
  const sortable = serverSort ? total : Math.min(total, CLIENT_SORT_LIMIT);
  const pages = Math.max(1, Math.ceil(sortable / limit));
  const rows = useMemo(() => {
    if (serverSort) return fetched;
    const value = sortColumn?.value;
    const sorted = value
      ? [...fetched].sort((a, b) => compareValues(value(a), value(b), asc) || num(b.id) - num(a.id))
      : fetched;
    return sorted.slice((page - 1) * limit, page * limit);
  }, [serverSort, fetched, sortColumn, asc, page, limit]);

  return (
    <div className={scope.project ? "project-experiments" : "page"}>
      {!scope.project && (
        <div className="page-title">
          <h1>{title}</h1>
          <span className="muted">{list.data ? `${total} in all` : ""}</span>
        </div>
      )}
      {scope.project && <div className="muted">{list.data ? plural(total, "experiment") : ""}</div>}
      <div className="list-tools">
        <Filters q={q} update={update} />
        <ColumnMenu choice={choice} setChoice={setChoice} extras={extras} />
      </div>
      {actionError !== null && <ErrorPanel error={actionError} title="The action failed" />}
      {list.error && <ErrorPanel error={list.error} title="Cannot list experiments" />}
      {list.loading && !list.error && <Loading what="experiments" />}
      {!serverSort && total > CLIENT_SORT_LIMIT && (
        <div className="notice" data-testid="sort-limited">
          Sorted by {sortColumn?.title ?? sortId} among the newest {CLIENT_SORT_LIMIT} of {total} experiments.
        </div>
      )}
      {list.data && (
        <>
          <div className="table-wrap">
            <table className="table" data-testid="experiments">
              <thead>
                <tr>
                  <th className="pick" />
                  {columns.map((c) => {
                    const key = c.serverSort ?? c.id;
                    const sorted = sortKey === key;
                    return (
                      <th
                        key={c.id}
                        data-column={c.id}
                        className={[c.className, "sortable", sorted ? "sorted" : ""].join(" ")}
                        onClick={() => onSort(c)}
                        aria-sort={sorted ? (asc ? "ascending" : "descending") : undefined}
                      >
                        {c.title}
                        {sorted && <span className="sort-arrow">{asc ? "▲" : "▼"}</span>}
                      </th>
                    );
                  })}
                  <th>Actions</th>
                </tr>
              </thead>
              <tbody>
                {rows.map((e) => (
                  <ExperimentRow
                    key={String(e.id)}
                    e={e}
                    columns={columns}
                    picked={picked.experiments.includes(String(e.id))}
                    onDone={(u, err) => {
                      setActionError(err ?? null);
                      if (u) setUpdated((m) => ({ ...m, [String(u.id)]: u }));
                      list.reload();
                    }}
                  />
                ))}
                {rows.length === 0 && (
                  <tr>
                    <td colSpan={columns.length + 2} className="empty">
                      No experiments match these filters.
                    </td>
                  </tr>
                )}
              </tbody>
            </table>
          </div>
          <div className="pager">
            <button type="button" disabled={page <= 1} onClick={() => update({ page: String(page - 1) }, false)}>
              ‹ Previous
            </button>
            <span>
              Page {page} of {pages}
            </span>
            <button type="button" disabled={page >= pages} onClick={() => update({ page: String(page + 1) }, false)}>
              Next ›
            </button>
            <label>
              Rows per page{" "}
              <select value={limit} onChange={(e) => update({ limit: e.target.value })}>
                {PAGE_SIZES.map((n) => (
                  <option key={n} value={n}>
                    {n}
                  </option>
                ))}
              </select>
            </label>
          </div>
        </>
      )}
    </div>
  );
}

function ColumnMenu({
  choice,
  setChoice,
  extras,
}: {
  choice: ColumnChoice;
  setChoice: (c: ColumnChoice) => void;
  extras: Column[];
}) {
  const [open, setOpen] = useState(false);
  const toggle = (c: Column, on: boolean) => {
    if (BASE_COLUMNS.includes(c)) {
      const hidden = choice.hidden.filter((x) => x !== c.id);
      setChoice({ ...choice, hidden: on ? hidden : [...hidden, c.id] });
    } else {
      const shown = choice.shown.filter((x) => x !== c.id);
      setChoice({ ...choice, shown: on ? [...shown, c.id] : shown });
    }
  };
  const box = (c: Column, on: boolean) => (
    <label key={c.id} className="column-choice">
      <input
        type="checkbox"
        checked={on}
        onChange={(e) => toggle(c, e.target.checked)}
        data-testid="column-toggle"
        data-column={c.id}
      />{" "}
      {c.title}
    </label>
  );
  const metrics = extras.filter((c) => c.id.startsWith("metric:"));
  const hps = extras.filter((c) => c.id.startsWith("hp:"));
  return (
    <div className="column-menu">
      <button type="button" onClick={() => setOpen(!open)} aria-expanded={open} data-testid="columns-button">
        Columns {open ? "▴" : "▾"}
      </button>
      {open && (
        <div className="column-panel" data-testid="columns-menu">
          <div>
            <strong>Columns</strong>
            {BASE_COLUMNS.filter((c) => !c.fixed).map((c) => box(c, !choice.hidden.includes(c.id)))}
          </div>
          <div>
            <strong>Metrics (best validation)</strong>
            {metrics.length === 0 && <span className="muted">none on this page</span>}
            {metrics.map((c) => box(c, choice.shown.includes(c.id)))}
          </div>
          <div>
            <strong>Hyperparameters</strong>
            {hps.length === 0 && <span className="muted">none on this page</span>}
            {hps.map((c) => box(c, choice.shown.includes(c.id)))}
          </div>
          <button type="button" className="link" onClick={() => setChoice({ hidden: [], shown: [] })}>
            Reset columns
          </button>
        </div>
      )}
    </div>
  );
}

function NameCell({ e }: { e: Experiment }) {
  return (
    <>
      <Link to={`/experiments/${e.id}`}>{e.name}</Link>
      {e.labels.map((l) => (
        <span key={l} className="chip">
          {l}
        </span>
      ))}
      {e.archived && <span className="chip chip-muted">archived</span>}
    </>
  );
}

function ExperimentRow({
  e,
  columns,
  picked,
  onDone,
}: {
  e: Experiment;
  columns: Column[];
  picked: boolean;
  onDone: (u: Experiment | null, err?: unknown) => void;
}) {
  return (
    <tr data-testid="experiment-row" data-id={String(e.id)} className={e.archived ? "archived" : undefined}>
      <td className="pick">
        <input
          type="checkbox"
          title="Pick its trials to compare"
          aria-label={`Pick experiment ${String(e.id)} to compare`}
          checked={picked}
          onChange={(ev) => toggleSelected("experiments", String(e.id), ev.target.checked)}
          data-testid="pick-experiment"
        />
      </td>
      {columns.map((c) => (
        <td key={c.id} data-column={c.id} className={[c.className, c.id === "name" ? "name-cell" : ""].join(" ")}>
          {c.cell(e)}
        </td>
      ))}
      <td>
        <ExperimentActions experiment={e} onDone={onDone} compact />
      </td>
    </tr>
  );
}
