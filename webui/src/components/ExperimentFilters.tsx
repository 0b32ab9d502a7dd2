// The experiment list's filters: name, label, state and archived, all kept in the URL.
import { useEffect, useState } from "react";
import type { ExperimentState } from "../api";
import { stateLabel } from "../format";

/** A state filter: the state an experiment rests or ends in, with the passing states
 * that lead to it. A cancel and a kill both end as canceled, so "canceled" takes
 * "stopping canceled" and "stopping killed" too. */
export interface StateFilter {
  /** Its name in the URL (`?state=canceled`) and on its button. */
  name: string;
  states: ExperimentState[];
}

export const STATE_FILTERS: StateFilter[] = [
  { name: "active", states: ["EXPERIMENT_STATE_ACTIVE"] },
  { name: "paused", states: ["EXPERIMENT_STATE_PAUSED"] },
  { name: "completed", states: ["EXPERIMENT_STATE_COMPLETED"] },
  {
    name: "canceled",
    states: ["EXPERIMENT_STATE_CANCELED", "EXPERIMENT_STATE_STOPPING_CANCELED", "EXPERIMENT_STATE_STOPPING_KILLED"],
  },
  { name: "error", states: ["EXPERIMENT_STATE_ERROR"] },
];

/** A state as the master's `states` query names it: "stopping_canceled". */
function queryName(state: ExperimentState): string {
  return stateLabel(state).replace(/ /g, "_");
}

/** The states to ask the master for: each chosen filter's, and a state named by itself
 * (an address from before the filters were grouped: `?state=stopping_canceled`). */
export function queryStates(chosen: readonly string[]): string[] {
  const out = new Set<string>();
  for (const name of chosen) {
    const filter = STATE_FILTERS.find((f) => f.name === name);
    if (filter) filter.states.forEach((s) => out.add(queryName(s)));
    else out.add(name);
  }
  return [...out];
}

export function Filters({
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
        {STATE_FILTERS.map((f) => {
          const on = states.includes(f.name);
          return (
            <button
              type="button"
              key={f.name}
              className={on ? "toggle on" : "toggle"}
              aria-pressed={on}
              data-state={f.name}
              title={f.states.length > 1 ? f.states.map(stateLabel).join(", ") : undefined}
              onClick={() => update({ state: on ? states.filter((x) => x !== f.name) : [...states, f.name] })}
            >
              {f.name}
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
