// Server-sent events read with fetch(), which (unlike EventSource) can send the
// Authorization header. The parser follows the HTML event-stream format; `follow` adds
// what EventSource did by itself: reconnect after a dropped connection, resuming after the
// last event id.

export interface SseEvent {
  /** The event's `id:`, when it had one. */
  id?: string;
  /** `event:`; "message" when absent. */
  event: string;
  /** The `data:` lines, joined with "\n". */
  data: string;
}

/** Turns text chunks (split anywhere) into events; comment lines (`:`) are dropped. */
export class SseParser {
  private rest = "";
  private pendingCr = false;
  private id: string | undefined;
  private event = "";
  private data: string[] = [];

  push(chunk: string): SseEvent[] {
    let text = chunk;
    // A "\r\n" split between chunks: the "\r" already ended the line.
    if (this.pendingCr && text.startsWith("\n")) text = text.slice(1);
    this.pendingCr = false;
    text = this.rest + text;
    const out: SseEvent[] = [];
    let start = 0;
    for (let i = 0; i < text.length; i++) {
      const c = text.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      this.line(text.slice(start, i), out);
      if (c === 13) {
        if (i + 1 < text.length) {
          if (text.charCodeAt(i + 1) === 10) i++;
        } else {
          this.pendingCr = true;
        }
      }
      start = i + 1;
    }
    this.rest = text.slice(start);
    return out;
  }

  private line(line: string, out: SseEvent[]): void {
    if (line === "") {
      if (this.data.length > 0) {
        const ev: SseEvent = { event: this.event || "message", data: this.data.join("\n") };
        if (this.id !== undefined) ev.id = this.id;
        out.push(ev);
      }
      this.id = undefined;
      this.event = "";
      this.data = [];
      return;
    }
    if (line.startsWith(":")) return; // a comment: the server's keep-alive
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.event = value;
    else if (field === "id" && !value.includes("\0")) this.id = value;
    // "retry" and unknown fields are ignored: the backoff is ours.
  }
}

export interface FollowHandlers {
  /** A connection is open and reading. */
  onOpen?: () => void;
  /** An ordinary event ("message", or any name other than end / error). */
  onEvent: (ev: SseEvent) => void;
  /** The server's `event: end`: nothing more will come. */
  onEnd: () => void;
  /** The stream cannot go on: the server's `event: error`, or a refused (re)connection. */
  onFail: (error: unknown) => void;
  /** The connection dropped; another try follows after `delayMs`. */
  onRetry?: (delayMs: number, cause: unknown) => void;
}

export interface FollowOptions {
  /** Resume after this id on the first connection. */
  lastEventId?: string;
  /** The first wait after a drop; doubles on each failure up to `maxDelayMs`. */
  delayMs?: number;
  maxDelayMs?: number;
  /** No bytes for this long (the server sends keep-alives) counts as a dropped connection. */
  idleMs?: number;
  /** Whether a failed connection may be tried again (network errors, 5xx) or not (4xx). */
  retryable?: (error: unknown) => boolean;
}

/**
 * Read the event stream that `open(lastEventId, signal)` answers, reconnecting after drops
 * until `end`, a fatal error, or `signal` aborts. `open` must throw for a response that is
 * not a 2xx; the caller sends `lastEventId` as the `Last-Event-ID` header or its own
 * query parameter.
 */
export async function follow(
  open: (lastEventId: string | undefined, signal: AbortSignal) => Promise<Response>,
  handlers: FollowHandlers,
  signal: AbortSignal,
  options: FollowOptions = {},
): Promise<void> {
  const { delayMs = 1000, maxDelayMs = 15_000, idleMs = 45_000, retryable = () => true } = options;
  let lastEventId = options.lastEventId;
  let delay = delayMs;
  while (!signal.aborted) {
    // One connection: its own controller, so that an idle one can be cut and retried.
    const conn = new AbortController();
    const stop = () => conn.abort();
    signal.addEventListener("abort", stop);
    let idle = 0;
    const watch = () => {
      window.clearTimeout(idle);
      idle = window.setTimeout(() => conn.abort(new DOMException("no data", "TimeoutError")), idleMs);
    };
    let cause: unknown = new Error("the connection closed");
    try {
      watch();
      const response = await open(lastEventId, conn.signal);
      if (!response.body) throw new Error("the response has no body to read");
      handlers.onOpen?.();
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      const parser = new SseParser();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        watch();
        for (const ev of parser.push(decoder.decode(value, { stream: true }))) {
          if (ev.id !== undefined) lastEventId = ev.id;
          if (ev.event === "end") {
            void reader.cancel();
            handlers.onEnd();
            return;
          }
          if (ev.event === "error") {
            void reader.cancel();
            handlers.onFail(new Error(serverError(ev.data)));
            return;
          }
          handlers.onEvent(ev);
          delay = delayMs; // data flowed: the next drop starts the backoff afresh
        }
      }
    } catch (e) {
      if (signal.aborted) return;
      if (!conn.signal.aborted && !retryable(e)) {
        handlers.onFail(e);
        return;
      }
      cause = e;
    } finally {
      window.clearTimeout(idle);
      signal.removeEventListener("abort", stop);
    }
    if (signal.aborted) return;
    handlers.onRetry?.(delay, cause);
    if (!(await sleep(delay, signal))) return;
    delay = Math.min(delay * 2, maxDelayMs);
  }
}

function serverError(data: string): string {
  try {
    const body = JSON.parse(data) as { error?: unknown };
    if (typeof body.error === "string") return body.error;
  } catch {
    // not JSON: show it as it came
  }
  return data || "the stream failed";
}

/** Wait `ms`; false when `signal` aborted first. */
function sleep(ms: number, signal: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve(false);
    const done = (ok: boolean) => {
      window.clearTimeout(timer);
      signal.removeEventListener("abort", onAbort);
      resolve(ok);
    };
    const onAbort = () => done(false);
    const timer = window.setTimeout(() => done(true), ms);
    signal.addEventListener("abort", onAbort);
  });
}
