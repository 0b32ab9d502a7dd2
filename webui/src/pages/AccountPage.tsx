// `/account`: who is logged in, and changing one's own password (the current one first).
import { useEffect, useState, type FormEvent } from "react";
import { api } from "../api";
import { Field, MIN_PASSWORD, newPasswordProblem, Notice } from "../components/forms";
import { ErrorPanel, Loading, Section } from "../components/ui";
import { useSession } from "../hooks";

export function AccountPage() {
  const { user } = useSession();
  useEffect(() => {
    document.title = "Account · Assay";
  }, []);
  return (
    <div className="page">
      <div className="page-title">
        <h1>Account</h1>
        {user && (
          <span className="muted">
            {user.username} · {user.admin ? "administrator" : "user"}
          </span>
        )}
      </div>
      {user ? <ChangePasswordForm username={user.username} /> : <Loading what="your account" />}
    </div>
  );
}

function ChangePasswordForm({ username }: { username: string }) {
  const [old, setOld] = useState("");
  const [password, setPassword] = useState("");
  const [again, setAgain] = useState("");
  const [error, setError] = useState<unknown>(null);
  const [done, setDone] = useState(false);
  const [busy, setBusy] = useState(false);

  const submit = async (e: FormEvent) => {
    e.preventDefault();
    if (busy) return;
    const problem = old ? newPasswordProblem(password, again) : "Enter your current password.";
    setDone(false);
    if (problem) {
      setError(problem);
      return;
    }
    setBusy(true);
    setError(null);
    try {
      await api.changePassword(username, password, old);
      setOld("");
      setPassword("");
      setAgain("");
      setDone(true);
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };

  return (
    <Section title="Change password">
      <form className="form narrow" onSubmit={(e) => void submit(e)} noValidate data-testid="account-form">
        {/* For password managers: the account whose password changes. */}
        <input type="text" name="username" autoComplete="username" value={username} readOnly hidden />
        <Field
          label="Current password"
          testId="account-old"
          type="password"
          autoComplete="current-password"
          value={old}
          onChange={(e) => setOld(e.target.value)}
        />
        <Field
          label="New password"
          testId="account-new"
          type="password"
          autoComplete="new-password"
          value={password}
          onChange={(e) => setPassword(e.target.value)}
        />
        <Field
          label="New password again"
          testId="account-new2"
          type="password"
          autoComplete="new-password"
          value={again}
          onChange={(e) => setAgain(e.target.value)}
        />
        <div className="hint">
          At least {MIN_PASSWORD} characters, not your user name. Your other sessions (other browsers, the
          command line) end; this one stays logged in.
        </div>
        <div>
          <button type="submit" className="primary" disabled={busy} data-testid="account-submit">
            {busy ? "Changing…" : "Change password"}
          </button>
        </div>
        {done && (
          <Notice testId="account-message">
            Your password is changed. Your other sessions have ended; this one stays logged in.
          </Notice>
        )}
        {error !== null && <ErrorPanel error={error} title="Cannot change the password" />}
      </form>
    </Section>
  );
}
