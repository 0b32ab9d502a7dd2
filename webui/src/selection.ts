// The runs picked for comparison: trial and experiment ids, kept in localStorage so that
// picks on several pages (and tabs) add up; the compare page itself reads its URL only.
import { useSyncExternalStore } from "react";

const KEY = "assay.compare";

export interface Selection {
  trials: string[];
  experiments: string[];
}

const EMPTY: Selection = { trials: [], experiments: [] };
let cached: { raw: string | null; value: Selection } = { raw: null, value: EMPTY };
const listeners = new Set<() => void>();

function ids(v: unknown): string[] {
  return Array.isArray(v) ? v.filter((x) => typeof x === "string" && /^\d+$/.test(x)) : [];
}

function read(): Selection {
  let raw: string | null = null;
  try {
    raw = window.localStorage.getItem(KEY);
  } catch {
    raw = null;
  }
  if (raw === cached.raw) return cached.value;
  let value = EMPTY;
  try {
    const parsed = raw ? (JSON.parse(raw) as Partial<Selection>) : null;
    if (parsed) value = { trials: ids(parsed.trials), experiments: ids(parsed.experiments) };
  } catch {
    value = EMPTY; // not ours or damaged: start empty
  }
  cached = { raw, value };
  return value;
}

function write(next: Selection): void {
  try {
    if (next.trials.length === 0 && next.experiments.length === 0) window.localStorage.removeItem(KEY);
    else window.localStorage.setItem(KEY, JSON.stringify(next));
  } catch {
    // storage full or refused: the selection lives as long as the page
  }
  listeners.forEach((l) => l());
}

function subscribe(listener: () => void): () => void {
  listeners.add(listener);
  const onStorage = (e: StorageEvent) => {
    if (e.key === KEY || e.key === null) listener();
  };
  window.addEventListener("storage", onStorage);
  return () => {
    listeners.delete(listener);
    window.removeEventListener("storage", onStorage);
  };
}

export function useSelection(): Selection {
  return useSyncExternalStore(subscribe, read);
}

export function toggleSelected(kind: keyof Selection, id: string, on: boolean): void {
  const s = read();
  const list = s[kind].filter((x) => x !== id);
  if (on) list.push(id);
  write({ ...s, [kind]: list });
}

export function clearSelection(): void {
  write(EMPTY);
}

/** The compare page's address for these runs: `/compare?trials=3,9&experiments=2`. */
export function comparePath(s: Selection): string {
  const q = new URLSearchParams();
  if (s.trials.length) q.set("trials", s.trials.join(","));
  if (s.experiments.length) q.set("experiments", s.experiments.join(","));
  return `/compare?${q.toString().replace(/%2C/g, ",")}`;
}

/** Ids from a comma-separated query value, in order, without repeats or junk. */
export function parseIds(value: string | null): string[] {
  const out: string[] = [];
  for (const part of (value ?? "").split(",")) {
    const id = part.trim();
    if (/^\d+$/.test(id) && !out.includes(id)) out.push(id);
  }
  return out;
}
