// `/`: the experiments, filtered, sorted and paged by the server; all of it in the URL.
import { useEffect, useState } from "react";
import { Link, useSearchParams } from "react-router";
import { EXPERIMENT_STATES, api, num, type Experiment, type ListExperimentsParams } from "../api";
import { ErrorPanel, ExperimentActions, Loading, Progress, StateBadge } from "../components/ui";
import { fmtDuration, fmtNumber, fmtTime, searcherInfo, stateLabel } from "../format";
import { usePoll } from "../hooks";

const PAGE_SIZES = [25, 50, 100];
const DEFAULT_LIMIT = 50;

interface Column {
  title: string;
  sort?: string; // the server's sort_by key
  className?: string;
}

const COLUMNS: Column[] = [
  { title: "ID", sort: "id", className: "num" },
  { title: "Name", sort: "name" },
  { title: "State", sort: "state" },
  { title: "Searcher" },
  { title: "Progress", sort: "progress" },
  { title: "Best metric", className: "num" },
  { title: "Trials", className: "num" },
  { title: "Owner", sort: "owner" },
  { title: "Start", sort: "start_time" },
  { title: "Duration" },
  { title: "Actions" },
];

function listParams(q: URLSearchParams): ListExperimentsParams {
  const limit = Number(q.get("limit")) || DEFAULT_LIMIT;
  const page = Math.max(1, Number(q.get("page")) || 1);
  const archived = q.get("archived");
  return {
    states: q.getAll("state"),
    name: q.get("name") ?? undefined,
    label: q.get("label") ?? undefined,
    owner: q.get("owner") ?? undefined,
    sort_by: q.get("sort") ?? "id",
    ascending: q.get("order") === "asc",
    limit,
    offset: (page - 1) * limit,
    archived: archived === "all" ? undefined : archived === "only",
  };
}

export function ExperimentListPage() {
  const [q, setQ] = useSearchParams();
  const params = listParams(q);
  const key = JSON.stringify(params);
  const list = usePoll(key, (signal) => api.experiments(params, signal));
  const [actionError, setActionError] = useState<unknown>(null);
  const [updated, setUpdated] = useState<Record<string, Experiment>>({});

  useEffect(() => {
    document.title = "Experiments · Assay";
  }, []);
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

  const sortBy = params.sort_by ?? "id";
  const onSort = (col: Column) => {
    if (!col.sort) return;
    const asc = sortBy === col.sort ? !params.ascending : col.sort === "name" || col.sort === "owner";
    update({ sort: col.sort, order: asc ? "asc" : "desc" }, false);
  };

  const total = list.data?.total ?? 0;
  const limit = params.limit ?? DEFAULT_LIMIT;
  const page = Math.floor((params.offset ?? 0) / limit) + 1;
  const pages = Math.max(1, Math.ceil(total / limit));
  const rows = (list.data?.experiments ?? []).map((e) => updated[String(e.id)] ?? e);

  return (
    <div className="page">
      <div className="page-title">
        <h1>Experiments</h1>
        <span className="muted">{list.data ? `${total} in all` : ""}</span>
      </div>
      <Filters q={q} update={update} />
      {actionError !== null && <ErrorPanel error={actionError} title="The action failed" />}
      {list.error && <ErrorPanel error={list.error} title="Cannot list experiments" />}
      {list.loading && !list.error && <Loading what="experiments" />}
      {list.data && (
        <>
          <div className="table-wrap">
            <table className="table" data-testid="experiments">
              <thead>
                <tr>
                  {COLUMNS.map((c) => (
                    <th
                      key={c.title}
                      className={[c.className, c.sort ? "sortable" : "", sortBy === c.sort ? "sorted" : ""].join(" ")}
                      onClick={() => onSort(c)}
                      aria-sort={sortBy === c.sort ? (params.ascending ? "ascending" : "descending") : undefined}
                    >
                      {c.title}
                      {sortBy === c.sort && <span className="sort-arrow">{params.ascending ? "▲" : "▼"}</span>}
                    </th>
                  ))}
                </tr>
              </thead>
              <tbody>
                {rows.map((e) => (
                  <ExperimentRow
                    key={String(e.id)}
                    e={e}
                    onDone={(u, err) => {
                      setActionError(err ?? null);
                      if (u) setUpdated((m) => ({ ...m, [String(u.id)]: u }));
                      list.reload();
                    }}
                  />
                ))}
                {rows.length === 0 && (
                  <tr>
                    <td colSpan={COLUMNS.length} className="empty">
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

function ExperimentRow({ e, onDone }: { e: Experiment; onDone: (u: Experiment | null, err?: unknown) => void }) {
  const { metric } = searcherInfo(e.config);
  const best = num(e.best_validation);
  return (
    <tr data-testid="experiment-row" data-id={String(e.id)} className={e.archived ? "archived" : undefined}>
      <td className="num">
        <Link to={`/experiments/${e.id}`}>{String(e.id)}</Link>
      </td>
      <td className="name-cell">
        <Link to={`/experiments/${e.id}`}>{e.name}</Link>
        {e.labels.map((l) => (
          <span key={l} className="chip">
            {l}
          </span>
        ))}
        {e.archived && <span className="chip chip-muted">archived</span>}
      </td>
      <td>
        <StateBadge state={e.state} testId="experiment-state" />
      </td>
      <td>{e.searcher || "–"}</td>
      <td>
        <Progress value={num(e.progress)} />
      </td>
      <td className="num" title={metric}>
        {Number.isFinite(best) ? fmtNumber(best) : "–"}
        {Number.isFinite(best) && metric && <span className="unit"> {metric}</span>}
      </td>
      <td className="num">{e.num_trials}</td>
      <td>{e.owner || "–"}</td>
      <td className="nowrap">{fmtTime(e.start_time)}</td>
      <td className="nowrap">{fmtDuration(e.start_time, e.end_time)}</td>
      <td>
        <ExperimentActions experiment={e} onDone={onDone} compact />
      </td>
    </tr>
  );
}

function Filters({
  q,
  update,
}: {
  q: URLSearchParams;
  update: (changes: Record<string, string | string[] | null>) => void;
}) {
  // Text boxes update the URL shortly after typing stops.
  const [name, setName] = useState(q.get("name") ?? "");
  const [label, setLabel] = useState(q.get("label") ?? "");
  const urlName = q.get("name") ?? "";
  const urlLabel = q.get("label") ?? "";
  useEffect(() => setName(urlName), [urlName]);
  useEffect(() => setLabel(urlLabel), [urlLabel]);
  useEffect(() => {
    if (name === urlName && label === urlLabel) return;
    const t = window.setTimeout(() => update({ name, label }), 300);
    return () => window.clearTimeout(t);
  }, [name, label, urlName, urlLabel, update]);

  const states = q.getAll("state");
  const archived = q.get("archived");
  return (
    <div className="filters">
      <input
        type="search"
        placeholder="Name contains…"
        value={name}
        onChange={(e) => setName(e.target.value)}
        data-testid="filter-name"
        aria-label="Filter by name"
      />
      <input
        type="search"
        placeholder="Label"
        value={label}
        onChange={(e) => setLabel(e.target.value)}
        data-testid="filter-label"
        aria-label="Filter by label"
      />
      <div className="state-filter" data-testid="filter-state">
        {EXPERIMENT_STATES.map((s) => {
          const short = stateLabel(s).replace(/ /g, "_");
          const on = states.includes(short);
          return (
            <button
              type="button"
              key={s}
              className={on ? "toggle on" : "toggle"}
              aria-pressed={on}
              data-state={short}
              onClick={() => update({ state: on ? states.filter((x) => x !== short) : [...states, short] })}
            >
              {stateLabel(s)}
            </button>
          );
        })}
      </div>
      <select
        value={archived ?? "hide"}
        onChange={(e) => update({ archived: e.target.value === "hide" ? null : e.target.value })}
        aria-label="Archived experiments"
        data-testid="filter-archived"
      >
        <option value="hide">Not archived</option>
        <option value="all">Archived too</option>
        <option value="only">Archived only</option>
      </select>
      {(states.length > 0 || urlName || urlLabel || archived) && (
        <button type="button" className="link" onClick={() => update({ state: [], name: null, label: null, archived: null })}>
          Clear filters
        </button>
      )}
    </div>
  );
}
