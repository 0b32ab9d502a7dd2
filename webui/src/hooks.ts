// Data loading: fetch once, then poll every few seconds while the tab is visible.
import { useCallback, useEffect, useRef, useState, useSyncExternalStore } from "react";
import { useSearchParams } from "react-router";
import { ApiError } from "./api";
import { currentSession, subscribeSession, type Session } from "./session";

export const POLL_MS = 3000;

export interface Polled<T> {
  data: T | undefined;
  error: ApiError | Error | undefined;
  /** True until the first answer (or failure) for the current key. */
  loading: boolean;
  /** Fetch again now (e.g. after an action). */
  reload: () => void;
}

/**
 * `load` for `key` now, then again every `intervalMs` while the page is visible and
 * `active` is true. The last good data stays while a refresh runs or fails, so a poll never resets
 * what is shown; a new `key` starts over. Requests never overlap.
 */
export function usePoll<T>(
  key: string,
  load: (signal: AbortSignal) => Promise<T>,
  {
    active = true,
    intervalMs = POLL_MS,
    backoff = 0,
  }: {
    active?: boolean;
    intervalMs?: number;
    /** Wait at least this many times the last request's duration before the next one, so
     * that heavy requests (curves of many trials) do not keep the master busy. */
    backoff?: number;
  } = {},
): Polled<T> {
  const [state, setState] = useState<{ key: string; data?: T; error?: ApiError | Error }>({ key });
  const loadRef = useRef(load);
  loadRef.current = load;
  const kick = useRef<() => void>(() => undefined);
  const resume = useRef<() => void>(() => undefined);
  const activeRef = useRef(active);
  activeRef.current = active;

  useEffect(() => {
    let stopped = false;
    let timer: number | undefined;
    let inFlight: AbortController | null = null;
    let again = false;
    let lastMs = 0;
    setState((s) => (s.key === key ? s : { key }));

    const run = async () => {
      if (stopped) return;
      if (inFlight) {
        again = true; // asked for while a request runs: its answer may be older
        return;
      }
      window.clearTimeout(timer);
      const controller = new AbortController();
      inFlight = controller;
      const started = performance.now();
      try {
        const data = await loadRef.current(controller.signal);
        lastMs = performance.now() - started;
        if (!stopped) setState((s) => (s.key === key && s.data === data && !s.error ? s : { key, data }));
      } catch (e) {
        if (stopped || (e instanceof DOMException && e.name === "AbortError")) return;
        const error = e instanceof Error ? e : new Error(String(e));
        // A missing object stays an error; a failed refresh keeps the last data shown.
        const gone = error instanceof ApiError && error.notFound;
        setState((s) => ({ key, data: gone || s.key !== key ? undefined : s.data, error }));
        if (gone) return; // no point asking again for what does not exist
      } finally {
        if (inFlight === controller) inFlight = null;
      }
      if (again && !stopped) {
        again = false;
        void run();
        return;
      }
      schedule();
    };
    const schedule = () => {
      window.clearTimeout(timer);
      if (!stopped && activeRef.current && document.visibilityState === "visible") {
        timer = window.setTimeout(run, Math.max(intervalMs, backoff * lastMs));
      }
    };
    const onVisibility = () => {
      if (document.visibilityState === "visible") void run();
      else window.clearTimeout(timer);
    };
    kick.current = () => void run();
    resume.current = () => {
      if (!inFlight) schedule();
    };
    void run();
    document.addEventListener("visibilitychange", onVisibility);
    return () => {
      stopped = true;
      window.clearTimeout(timer);
      inFlight?.abort();
      document.removeEventListener("visibilitychange", onVisibility);
    };
  }, [key, intervalMs, backoff]);

  // Turning polling back on schedules the next poll; turning it off lets the current
  // timer lapse (one last refresh), without refetching now.
  useEffect(() => {
    if (active) resume.current();
  }, [active]);

  const reload = useCallback(() => kick.current(), []);
  const current = state.key === key;
  return {
    data: current ? state.data : undefined,
    error: current ? state.error : undefined,
    loading: !current || (state.data === undefined && state.error === undefined),
    reload,
  };
}

/** The login session; re-renders when it starts or ends (here or in another tab). */
export function useSession(): Session {
  return useSyncExternalStore(subscribeSession, currentSession);
}

/** A value that updates every `ms` (for durations of running things). */
export function useNow(ms = 1000): number {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    const t = window.setInterval(() => setNow(Date.now()), ms);
    return () => window.clearInterval(t);
  }, [ms]);
  return now;
}

/**
 * The URL's query parameters as view state: `set` shows the change at once and writes
 * it to the URL (replacing the history entry); the router applies URL changes in a
 * transition, so a control that read only the URL would flick back until then.
 */
export function useQueryState(): [(key: string) => string | null, (changes: Record<string, string | null>) => void] {
  const [q, setQ] = useSearchParams();
  const [pending, setPending] = useState<{ base: URLSearchParams; changes: Record<string, string | null> }>({
    base: q,
    changes: {},
  });
  const changes = pending.base === q ? pending.changes : {};
  const get = (key: string) => (key in changes ? changes[key]! : q.get(key));
  const set = useCallback(
    (more: Record<string, string | null>) => {
      setPending((p) => ({ base: q, changes: { ...(p.base === q ? p.changes : {}), ...more } }));
      setQ(
        (prev) => {
          const next = new URLSearchParams(prev);
          for (const [k, v] of Object.entries(more)) {
            if (v === null) next.delete(k);
            else next.set(k, v);
          }
          return next;
        },
        { replace: true },
      );
    },
    [q, setQ],
  );
  return [get, set];
}
