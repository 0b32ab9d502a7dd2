// `/users`: the master's users for administrators: create, deactivate or activate, and
// reset passwords. Other users get a panel saying that only administrators manage users.
import { useEffect, useRef, useState, type FormEvent } from "react";
import { Link } from "react-router";
import { api, type User } from "../api";
import { Field, MIN_PASSWORD, newPasswordProblem, Notice } from "../components/forms";
import { ConfirmDialog, ErrorPanel, Loading, Section } from "../components/ui";
import { usePoll, useSession } from "../hooks";

export function UsersPage() {
  const { user } = useSession();
  useEffect(() => {
    document.title = "Users · Assay";
  }, []);
  // The top bar asks the master who the token belongs to; until then nothing is decided.
  if (!user) {
    return (
      <div className="page">
        <Loading what="your account" />
      </div>
    );
  }
  if (!user.admin) return <AdminsOnly />;
  return <UserAdmin me={user.username} />;
}

function AdminsOnly() {
  return (
    <div className="page">
      <div className="callout" data-testid="users-admins-only">
        <h1>Users</h1>
        <p>Only administrators manage users. Ask one to create an account, reset a password, or deactivate a user.</p>
        <p>
          <Link to="/account">Change your own password</Link>
        </p>
      </div>
    </div>
  );
}

type Outcome = { notice: string; error?: undefined } | { error: unknown; title: string; notice?: undefined };

function UserAdmin({ me }: { me: string }) {
  const users = usePoll("users", (s) => api.users(s));
  const [outcome, setOutcome] = useState<Outcome | null>(null);
  const [busy, setBusy] = useState<string | null>(null);
  const [confirming, setConfirming] = useState<User | null>(null);
  const [resetting, setResetting] = useState<User | null>(null);

  const setActive = async (u: User, active: boolean) => {
    setBusy(u.username);
    try {
      await api.setUserActive(u.username, active);
      setOutcome({
        notice: active
          ? `${u.username} can log in again.`
          : `${u.username} is deactivated: their sessions have ended and they cannot log in.`,
      });
    } catch (e) {
      setOutcome({ error: e, title: `Cannot ${active ? "activate" : "deactivate"} ${u.username}` });
    } finally {
      setBusy(null);
      users.reload();
    }
  };

  const list = users.data?.users ?? [];
  // The master refuses to deactivate the last active admin who can log in: not offered.
  const admins = list.filter((u) => u.admin && u.active && u.has_password);
  const lastAdmin = admins.length === 1 ? admins[0]?.username : undefined;
  return (
    <div className="page">
      <div className="page-title">
        <h1>Users</h1>
        {users.data && <span className="muted">{list.length} in all</span>}
      </div>
      {outcome?.notice !== undefined && <Notice testId="users-message">{outcome.notice}</Notice>}
      {outcome?.error !== undefined && <ErrorPanel error={outcome.error} title={outcome.title} />}
      {users.error && <ErrorPanel error={users.error} title="Cannot list users" />}
      <Section title="Users">
        {users.loading && !users.error && <Loading what="users" />}
        {users.data && (
          <div className="table-wrap">
            <table className="table" data-testid="users">
              <thead>
                <tr>
                  <th>User</th>
                  <th>Role</th>
                  <th>Status</th>
                  <th />
                </tr>
              </thead>
              <tbody>
                {list.map((u) => (
                  <tr
                    key={u.username}
                    data-testid="user-row"
                    data-username={u.username}
                    className={u.active ? undefined : "dim"}
                  >
                    <td>
                      <span className="strong">{u.username}</span>
                      {u.username === me && <span className="chip">you</span>}
                    </td>
                    <td>
                      {u.admin ? (
                        <span className="state state-active" data-testid="user-admin">
                          admin
                        </span>
                      ) : (
                        <span className="muted">user</span>
                      )}
                    </td>
                    <td>
                      <span className={`state ${u.active ? "state-done" : "state-failed"}`} data-testid="user-status">
                        {u.active ? "active" : "deactivated"}
                      </span>
                      {!u.has_password && (
                        <span
                          className="chip chip-muted"
                          title="Recorded as an experiment's owner, without an account: create a user of this name to let them log in"
                        >
                          no password
                        </span>
                      )}
                    </td>
                    <td className="row-actions">
                      <span className="actions compact">
                        {u.username === lastAdmin ? (
                          <span
                            className="muted small"
                            title="Make another user an admin first: the cluster needs an admin who can log in"
                            data-testid="user-last-admin"
                          >
                            the only admin
                          </span>
                        ) : u.active ? (
                          <button
                            type="button"
                            className="danger-outline"
                            disabled={busy === u.username}
                            onClick={() => setConfirming(u)}
                            data-testid="user-deactivate"
                          >
                            Deactivate
                          </button>
                        ) : (
                          <button
                            type="button"
                            disabled={busy === u.username}
                            onClick={() => void setActive(u, true)}
                            data-testid="user-activate"
                          >
                            Activate
                          </button>
                        )}
                        {u.username === me ? (
                          // Your own password needs the current one: that is the account page.
                          <Link to="/account" className="button-link">
                            Change password
                          </Link>
                        ) : (
                          <button type="button" onClick={() => setResetting(u)} data-testid="user-reset">
                            Reset password
                          </button>
                        )}
                      </span>
                    </td>
                  </tr>
                ))}
                {list.length === 0 && (
                  <tr>
                    <td colSpan={4} className="empty">
                      No users.
                    </td>
                  </tr>
                )}
              </tbody>
            </table>
          </div>
        )}
      </Section>
      <NewUserForm onCreated={() => users.reload()} />
      {confirming && (
        <ConfirmDialog
          title={`Deactivate ${confirming.username}?`}
          body={
            confirming.username === me
              ? "This is you: your sessions end now, and you cannot log in until another administrator activates you."
              : `${confirming.username}'s sessions end now, and they cannot log in until activated again. Their experiments stay.`
          }
          confirmLabel="Deactivate"
          danger
          onConfirm={() => void setActive(confirming, false)}
          onClose={() => setConfirming(null)}
        />
      )}
      {resetting && (
        <ResetPasswordDialog
          user={resetting}
          onDone={() => {
            setOutcome({
              notice: `Set a new password for ${resetting.username}; their sessions have ended.`,
            });
            setResetting(null);
          }}
          onClose={() => setResetting(null)}
        />
      )}
    </div>
  );
}

function NewUserForm({ onCreated }: { onCreated: (user: User) => void }) {
  const [username, setUsername] = useState("");
  const [password, setPassword] = useState("");
  const [again, setAgain] = useState("");
  const [admin, setAdmin] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const [created, setCreated] = useState<User | null>(null);
  const [busy, setBusy] = useState(false);

  const submit = async (e: FormEvent) => {
    e.preventDefault();
    if (busy) return;
    const name = username.trim();
    const problem = name ? newPasswordProblem(password, again) : "Enter a user name.";
    setCreated(null);
    if (problem) {
      setError(problem);
      return;
    }
    setBusy(true);
    setError(null);
    try {
      const user = await api.createUser(name, password, admin);
      setUsername("");
      setPassword("");
      setAgain("");
      setAdmin(false);
      setCreated(user);
      onCreated(user);
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };

  return (
    <Section title="New user">
      <form className="form" onSubmit={(e) => void submit(e)} noValidate data-testid="user-new">
        <div className="form-row">
          <Field
            label="User name"
            testId="user-new-name"
            type="text"
            autoComplete="off"
            autoCapitalize="off"
            spellCheck={false}
            value={username}
            onChange={(e) => setUsername(e.target.value)}
          />
          <Field
            label="Password"
            testId="user-new-password"
            type="password"
            autoComplete="new-password"
            value={password}
            onChange={(e) => setPassword(e.target.value)}
          />
          <Field
            label="Password again"
            testId="user-new-password2"
            type="password"
            autoComplete="new-password"
            value={again}
            onChange={(e) => setAgain(e.target.value)}
          />
          <label className="check">
            <input
              type="checkbox"
              checked={admin}
              onChange={(e) => setAdmin(e.target.checked)}
              data-testid="user-new-admin"
            />
            Administrator
          </label>
          <button type="submit" className="primary" disabled={busy} data-testid="user-new-submit">
            {busy ? "Creating…" : "Create user"}
          </button>
        </div>
        <div className="hint">
          Letters, digits, “_”, “.” and “-” in the name; at least {MIN_PASSWORD} characters in the password.
          Administrators may act on every experiment and manage users and agents.
        </div>
        {created && (
          <Notice testId="user-new-message">
            Created {created.admin ? "administrator" : "user"} {created.username}; they can log in now.
          </Notice>
        )}
        {error !== null && <ErrorPanel error={error} title="Cannot create the user" />}
      </form>
    </Section>
  );
}

function ResetPasswordDialog({ user, onDone, onClose }: { user: User; onDone: () => void; onClose: () => void }) {
  const [password, setPassword] = useState("");
  const [again, setAgain] = useState("");
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  const first = useRef<HTMLInputElement>(null);
  const close = useRef(onClose);
  close.current = onClose;

  // Once, not per render: typing in the second field must not move the focus back.
  useEffect(() => {
    first.current?.focus();
    const onKey = (e: KeyboardEvent) => e.key === "Escape" && close.current();
    window.addEventListener("keydown", onKey);
    return () => window.removeEventListener("keydown", onKey);
  }, []);

  const submit = async (e: FormEvent) => {
    e.preventDefault();
    if (busy) return;
    const problem = newPasswordProblem(password, again);
    if (problem) {
      setError(problem);
      return;
    }
    setBusy(true);
    setError(null);
    try {
      await api.changePassword(user.username, password);
      onDone();
    } catch (err) {
      setError(err);
      setBusy(false);
    }
  };

  return (
    <div className="modal-backdrop" onMouseDown={onClose}>
      <form
        className="modal"
        role="dialog"
        aria-modal="true"
        aria-label={`Reset ${user.username}'s password`}
        onMouseDown={(e) => e.stopPropagation()}
        onSubmit={(e) => void submit(e)}
        noValidate
        data-testid="user-reset-form"
      >
        <h3>Reset {user.username}’s password</h3>
        <div className="modal-body form">
          <p>Every session of {user.username} ends; they log in with the new password.</p>
          <label className="field">
            <span>New password</span>
            <input
              ref={first}
              type="password"
              autoComplete="new-password"
              value={password}
              onChange={(e) => setPassword(e.target.value)}
              data-testid="user-reset-password"
            />
          </label>
          <Field
            label="New password again"
            testId="user-reset-password2"
            type="password"
            autoComplete="new-password"
            value={again}
            onChange={(e) => setAgain(e.target.value)}
          />
          {error !== null && <ErrorPanel error={error} title="Cannot reset the password" />}
        </div>
        <div className="modal-actions">
          <button type="button" onClick={onClose} data-testid="user-reset-cancel">
            Back
          </button>
          <button type="submit" className="primary" disabled={busy} data-testid="user-reset-submit">
            {busy ? "Saving…" : "Set password"}
          </button>
        </div>
      </form>
    </div>
  );
}
