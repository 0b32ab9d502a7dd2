// The login session: the bearer token and its user, kept in localStorage so that a reload
// (or another tab) stays logged in. Components subscribe to changes; api.ts reads the
// token for every request and clears it when the master answers 401.

/** Where the token lives; tools (benchmarks, tests) may set it before loading the app. */
export const TOKEN_KEY = "assay.token";
/** The logged-in user as the master described it (a display cache; /me is the truth). */
export const USER_KEY = "assay.user";

export interface User {
  username: string;
  admin: boolean;
  active: boolean;
  has_password: boolean;
}

/** Why the last session ended: a logout goes to a plain /login, an expiry returns after. */
export type EndReason = "logout" | "expired";

let endReason: EndReason = "expired";
const listeners = new Set<() => void>();

function read(key: string): string | null {
  try {
    return window.localStorage.getItem(key);
  } catch {
    return null; // storage disabled: every load starts logged out
  }
}

function write(key: string, value: string | null): void {
  try {
    if (value === null) window.localStorage.removeItem(key);
    else window.localStorage.setItem(key, value);
  } catch {
    // storage full or disabled: the session lasts until the page is left
  }
}

function notify(): void {
  for (const listener of [...listeners]) listener();
}

/** The token to send, or null when logged out. */
export function sessionToken(): string | null {
  return read(TOKEN_KEY) || null;
}

/** The stored user, if it belongs to the current token's login. */
export function storedUser(): User | null {
  return currentSession().user;
}

export interface Session {
  token: string | null;
  user: User | null;
}

let snapshot: { token: string | null; raw: string | null; value: Session } | null = null;

/** The token and user now; the same object until either changes (for useSyncExternalStore). */
export function currentSession(): Session {
  const token = sessionToken();
  const raw = token ? read(USER_KEY) : null;
  if (snapshot && snapshot.token === token && snapshot.raw === raw) return snapshot.value;
  snapshot = { token, raw, value: { token, user: parseUser(raw) } };
  return snapshot.value;
}

function parseUser(raw: string | null): User | null {
  if (!raw) return null;
  try {
    const user = JSON.parse(raw) as Partial<User> | null;
    return user && typeof user.username === "string" ? (user as User) : null;
  } catch {
    return null;
  }
}

export function startSession(token: string, user: User | null): void {
  endReason = "expired";
  write(TOKEN_KEY, token);
  write(USER_KEY, user ? JSON.stringify(user) : null);
  notify();
}

export function rememberUser(user: User): void {
  if (!sessionToken()) return;
  const json = JSON.stringify(user);
  if (read(USER_KEY) === json) return;
  write(USER_KEY, json);
  notify();
}

/** Forget the token (and its user); `reason` decides where the app goes next. */
export function endSession(reason: EndReason): void {
  endReason = reason;
  const had = read(TOKEN_KEY) !== null || read(USER_KEY) !== null;
  write(TOKEN_KEY, null);
  write(USER_KEY, null);
  if (had) notify();
}

export function lastEndReason(): EndReason {
  return endReason;
}

/** Call `listener` when the session changes here or in another tab; returns the unsubscribe. */
export function subscribeSession(listener: () => void): () => void {
  listeners.add(listener);
  const onStorage = (e: StorageEvent) => {
    if (e.key === null || e.key === TOKEN_KEY || e.key === USER_KEY) listener();
  };
  window.addEventListener("storage", onStorage);
  return () => {
    listeners.delete(listener);
    window.removeEventListener("storage", onStorage);
  };
}

/**
 * A safe place to return to after logging in: a path on this site (never another origin,
 * never the login page itself, which would loop), else the experiment list.
 */
export function safeNext(next: string | null): string {
  // Control characters and backslashes are refused outright: browsers drop or rewrite
  // them, which could turn "/\t/host" into "//host" (another origin).
  if (!next || !next.startsWith("/") || /[\u0000-\u001f\u007f\\]/.test(next)) return "/";
  let parsed: URL;
  try {
    parsed = new URL(next, window.location.origin);
  } catch {
    return "/";
  }
  if (parsed.origin !== window.location.origin) return "/";
  const path = parsed.pathname + parsed.search + parsed.hash;
  if (path === "/login" || path.startsWith("/login?") || path.startsWith("/login/")) return "/";
  return path;
}

/** The login page's address that returns to `here` (a path with its query). */
export function loginPath(here: string): string {
  const next = safeNext(here);
  return next === "/" ? "/login" : `/login?next=${encodeURIComponent(next)}`;
}
