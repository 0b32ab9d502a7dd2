// A trial's log: the last lines, then live (server-sent events, read with fetch) while
// following; search, level / stream filter, and a DOM capped to the last N matching lines.
import { memo, useCallback, useEffect, useLayoutEffect, useMemo, useRef, useState, type ReactNode } from "react";
import { api, num, type LogLine } from "../api";
import { plural } from "../format";
import { ErrorPanel } from "./ui";

/** Lines fetched when the page opens (the log's tail). */
const TAIL = 5000;
/** Lines kept in memory; older ones are dropped while following a long log. */
const KEEP = 100_000;
/** Matching lines in the DOM at first; "show earlier" adds this many more. */
const WINDOW = 1000;

type Status = "loading" | "idle" | "following" | "ended" | "reconnecting";

export function LogViewer({ trialId, live }: { trialId: string; live: boolean }) {
  const [lines, setLines] = useState<LogLine[]>([]);
  const [truncated, setTruncated] = useState(false);
  const [follow, setFollow] = useState(live);
  const [status, setStatus] = useState<Status>("loading");
  const [error, setError] = useState<unknown>(null);
  const [search, setSearch] = useState("");
  const [filter, setFilter] = useState("");
  const [shown, setShown] = useState(WINDOW);
  const [ready, setReady] = useState(false); // the tail has loaded
  const lastId = useRef<number | undefined>(undefined);

  const append = useCallback((more: LogLine[]) => {
    if (more.length === 0) return;
    const last = more[more.length - 1]!;
    lastId.current = num(last.id);
    setLines((old) => {
      const next = old.concat(more);
      if (next.length > KEEP) {
        setTruncated(true);
        return next.slice(next.length - KEEP);
      }
      return next;
    });
  }, []);

  // The tail first.
  useEffect(() => {
    const controller = new AbortController();
    setLines([]);
    lastId.current = undefined;
    setReady(false);
    setStatus("loading");
    api
      .trialLogs(trialId, { tail: TAIL }, controller.signal)
      .then((got) => {
        setTruncated(got.length >= TAIL);
        append(got);
        setReady(true);
        setStatus("idle");
      })
      .catch((e: unknown) => {
        if (e instanceof DOMException && e.name === "AbortError") return;
        setError(e);
        setStatus("idle");
      });
    return () => controller.abort();
  }, [trialId, append]);

  // Then, while following, new lines as they come; batched per animation frame.
  useEffect(() => {
    if (!follow || !ready) return;
    let buffer: LogLine[] = [];
    let frame = 0;
    const flush = () => {
      frame = 0;
      const b = buffer;
      buffer = [];
      append(b);
    };
    const controller = new AbortController();
    setStatus("following");
    void api.followTrialLogs(
      trialId,
      lastId.current,
      {
        onOpen: () => setStatus("following"),
        onLines: (more) => {
          for (const line of more) buffer.push(line);
          if (!frame) frame = requestAnimationFrame(flush);
        },
        onEnd: () => {
          if (frame) cancelAnimationFrame(frame);
          flush();
          setStatus("ended");
          setFollow(false);
        },
        onFail: (e) => {
          // The server's `event: error`, or a refused connection: asking again won't help.
          setError(e);
          setFollow(false);
          setStatus("idle");
        },
        // A dropped connection: tried again shortly, resuming after the last line.
        onRetry: () => setStatus("reconnecting"),
      },
      controller.signal,
    );
    return () => {
      controller.abort();
      if (frame) cancelAnimationFrame(frame);
      if (buffer.length) append(buffer);
      setStatus((s) => (s === "ended" ? s : "idle"));
    };
  }, [follow, ready, trialId, append]);

  const loadAll = async () => {
    try {
      const all = await api.trialLogs(trialId, {});
      const known = new Set(lines.map((l) => String(l.id)));
      setLines((old) => {
        const missing = all.filter((l) => !known.has(String(l.id)));
        return missing.concat(old).sort((a, b) => num(a.id) - num(b.id));
      });
      setTruncated(false);
      setShown((n) => Math.max(n, all.length));
    } catch (e) {
      setError(e);
    }
  };

  const { levels, streams } = useMemo(() => {
    const lv = new Set<string>();
    const st = new Set<string>();
    for (const l of lines) {
      lv.add(l.level || "");
      if (l.stream) st.add(l.stream);
    }
    return { levels: [...lv].sort(levelOrder), streams: [...st].sort() };
  }, [lines]);

  const matching = useMemo(() => {
    const needle = search.trim().toLowerCase();
    const [kind, value] = filter ? (filter.split(":", 2) as [string, string]) : ["", ""];
    if (!needle && !kind) return lines;
    return lines.filter(
      (l) =>
        (!kind || (kind === "level" ? (l.level || "") === value : l.stream === value)) &&
        (!needle || l.message.toLowerCase().includes(needle)),
    );
  }, [lines, search, filter]);
  const start = Math.max(0, matching.length - shown);
  const visible = matching.slice(start);

  // Keep the newest line in view while following, unless the user scrolled up.
  const box = useRef<HTMLDivElement>(null);
  const stick = useRef(true);
  const onScroll = () => {
    const el = box.current;
    if (el) stick.current = el.scrollTop + el.clientHeight >= el.scrollHeight - 8;
  };
  useLayoutEffect(() => {
    const el = box.current;
    if (el && stick.current) el.scrollTop = el.scrollHeight;
  }, [visible.length, lines]);

  const needle = search.trim();
  return (
    <div className="log-viewer">
      <div className="log-toolbar">
        <label className="check">
          <input
            type="checkbox"
            checked={follow}
            onChange={(e) => {
              setFollow(e.target.checked);
              if (e.target.checked) stick.current = true;
            }}
            data-testid="log-follow"
          />{" "}
          Follow
        </label>
        <input
          type="search"
          placeholder="Search the log…"
          value={search}
          onChange={(e) => setSearch(e.target.value)}
          data-testid="log-search"
          aria-label="Search the log"
        />
        <select value={filter} onChange={(e) => setFilter(e.target.value)} data-testid="log-level" aria-label="Level or stream">
          <option value="">All levels</option>
          {levels.map((l) => (
            <option key={`level:${l}`} value={`level:${l}`}>
              {l || "(no level)"}
            </option>
          ))}
          {streams.length > 0 && (
            <optgroup label="Stream">
              {streams.map((s) => (
                <option key={`stream:${s}`} value={`stream:${s}`}>
                  {s}
                </option>
              ))}
            </optgroup>
          )}
        </select>
        <span className="muted small log-status" data-testid="log-status">
          {statusText(status)} · {matching.length === lines.length ? plural(lines.length, "line") : `${matching.length} of ${plural(lines.length, "line")}`}
        </span>
      </div>
      {error !== null && <ErrorPanel error={error} title="Log" />}
      <div className="log-lines" ref={box} onScroll={onScroll} data-testid="log">
        {(start > 0 || truncated) && (
          <div className="log-more">
            {start > 0 && (
              <button type="button" onClick={() => setShown((n) => n + WINDOW)}>
                Show {plural(Math.min(WINDOW, start), "earlier line")} ({start} hidden)
              </button>
            )}
            {start === 0 && truncated && (
              <button type="button" onClick={() => void loadAll()}>
                Load the whole log (only the last {plural(lines.length, "line")} {lines.length === 1 ? "is" : "are"} loaded)
              </button>
            )}
          </div>
        )}
        {visible.map((l) => (
          <LogRow key={String(l.id)} line={l} needle={needle} />
        ))}
        {lines.length === 0 && status !== "loading" && <div className="log-empty">No log lines{follow ? " yet" : ""}.</div>}
      </div>
    </div>
  );
}

function statusText(s: Status): string {
  switch (s) {
    case "loading":
      return "loading";
    case "following":
      return "following";
    case "reconnecting":
      return "reconnecting…";
    case "ended":
      return "the trial has ended";
    default:
      return "not following";
  }
}

const LEVEL_RANK: Record<string, number> = { DEBUG: 0, INFO: 1, WARNING: 2, WARN: 2, ERROR: 3, CRITICAL: 4, FATAL: 4 };
function levelOrder(a: string, b: string): number {
  return (LEVEL_RANK[a] ?? 5) - (LEVEL_RANK[b] ?? 5) || a.localeCompare(b);
}

function time(iso?: string): string {
  if (!iso) return "";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return "";
  const p = (n: number, w = 2) => String(n).padStart(w, "0");
  return `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`;
}

const LogRow = memo(function LogRow({ line, needle }: { line: LogLine; needle: string }) {
  const level = (line.level || "").toUpperCase();
  return (
    <div
      className={`log-line lv-${level.toLowerCase() || "none"}${line.stream === "stderr" ? " stderr" : ""}`}
      data-testid="log-line"
      data-level={line.level}
      data-stream={line.stream}
    >
      <span className="log-time">{time(line.timestamp)}</span>
      <span className="log-rank">[{line.rank}]</span>
      {/* Blank for a line that names no level (most of what a program prints). */}
      <span className="log-level">{level}</span>
      <span className="log-msg">{highlight(line.message, needle)}</span>
    </div>
  );
});

function highlight(text: string, needle: string) {
  if (!needle) return text;
  const lower = text.toLowerCase();
  const n = needle.toLowerCase();
  const parts: ReactNode[] = [];
  let at = 0;
  let i = lower.indexOf(n);
  while (i >= 0) {
    parts.push(text.slice(at, i));
    parts.push(<mark key={i}>{text.slice(i, i + n.length)}</mark>);
    at = i + n.length;
    i = lower.indexOf(n, at);
  }
  parts.push(text.slice(at));
  return parts;
}
