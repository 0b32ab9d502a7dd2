// The login page: user name and password; afterwards back to `?next=` (or the list).
import { useEffect, useRef, useState, type FormEvent } from "react";
import { useNavigate, useSearchParams } from "react-router";
import { ApiError, api } from "../api";
import { safeNext, startSession, storedUser } from "../session";

export function LoginPage() {
  const [params] = useSearchParams();
  const next = safeNext(params.get("next"));
  const navigate = useNavigate();
  const [known] = useState(() => storedUser()?.username ?? "");
  const [username, setUsername] = useState(known);
  const [password, setPassword] = useState("");
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const second = useRef<HTMLInputElement>(null);

  useEffect(() => {
    document.title = "Log in · Assay";
  }, []);

  const submit = async (e: FormEvent) => {
    e.preventDefault();
    if (busy) return;
    if (!username.trim() || !password) {
      setError("Enter your user name and password.");
      return;
    }
    setBusy(true);
    setError(null);
    try {
      const answer = await api.login(username.trim(), password);
      startSession(answer.token, answer.user);
      navigate(next, { replace: true });
    } catch (err) {
      setError(loginError(err));
      setPassword("");
      second.current?.focus();
      setBusy(false);
    }
  };

  return (
    <div className="login-screen">
      <form className="login-card" onSubmit={(e) => void submit(e)} noValidate>
        <div className="login-brand">
          <span className="brand-mark" aria-hidden="true" />
          Assay
        </div>
        <h1>Log in</h1>
        <label className="login-field">
          <span>User name</span>
          <input
            type="text"
            autoFocus={!known}
            name="username"
            autoComplete="username"
            autoCapitalize="off"
            spellCheck={false}
            required
            value={username}
            onChange={(e) => setUsername(e.target.value)}
            data-testid="login-username"
          />
        </label>
        <label className="login-field">
          <span>Password</span>
          <input
            ref={second}
            type="password"
            autoFocus={!!known}
            name="password"
            autoComplete="current-password"
            required
            value={password}
            onChange={(e) => setPassword(e.target.value)}
            data-testid="login-password"
          />
        </label>
        {error !== null && (
          <div className="login-error" role="alert" data-testid="login-error">
            {error}
          </div>
        )}
        <button
          type="submit"
          className="primary"
          disabled={busy}
          data-testid="login-submit"
        >
          {busy ? "Logging in…" : "Log in"}
        </button>
      </form>
    </div>
  );
}

function loginError(err: unknown): string {
  if (err instanceof ApiError) {
    if (err.status === 0) return err.message; // cannot reach the master
    // The master's own words: "wrong username or password", "too many failed logins; …".
    return err.message || `login failed (HTTP ${err.status})`;
  }
  return err instanceof Error ? err.message : String(err);
}
