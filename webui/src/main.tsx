import { StrictMode, useEffect } from "react";
import { createRoot } from "react-dom/client";
import { BrowserRouter, Link, Navigate, NavLink, Outlet, Route, Routes, useLocation } from "react-router";
import { api } from "./api";
import { plural } from "./format";
import { usePoll, useSession } from "./hooks";
import { AccountPage } from "./pages/AccountPage";
import { ClusterPage } from "./pages/ClusterPage";
import { ComparePage } from "./pages/ComparePage";
import { ExperimentListPage } from "./pages/ExperimentListPage";
import { ExperimentPage } from "./pages/ExperimentPage";
import { LoginPage } from "./pages/LoginPage";
import { ModelPage, ModelsPage } from "./pages/ModelsPage";
import { TrialPage } from "./pages/TrialPage";
import { UsagePage } from "./pages/UsagePage";
import { UsersPage } from "./pages/UsersPage";
import { ProjectPage, WorkspacePage, WorkspacesPage } from "./pages/WorkspacesPage";
import { clearSelection, comparePath, useSelection } from "./selection";
import { endSession, lastEndReason, loginPath, rememberUser } from "./session";
import "./styles.css";

function TopBar() {
  const master = usePoll("master", (signal) => api.master(signal), { intervalMs: 10_000 });
  const { user } = useSession();
  const m = master.data;
  return (
    <header className="topbar">
      <Link to="/" className="brand">
        <span className="brand-mark" aria-hidden="true" />
        Assay
      </Link>
      <nav>
        <NavLink to="/" end>
          Experiments
        </NavLink>
        <NavLink to="/workspaces" data-testid="nav-workspaces">
          Workspaces
        </NavLink>
        <NavLink to="/models" data-testid="nav-models">
          Models
        </NavLink>
        <NavLink to="/compare" data-testid="nav-compare">
          Compare
        </NavLink>
        <NavLink to="/cluster">Cluster</NavLink>
        <NavLink to="/usage" data-testid="nav-usage">
          Usage
        </NavLink>
        {/* The master refuses others anyway; the link is for those who can use the page. */}
        {user?.admin && (
          <NavLink to="/users" data-testid="nav-users">
            Users
          </NavLink>
        )}
      </nav>
      <div className="topbar-info">
        {m && (
          <>
            <span title="free slots / all slots" data-testid="slots-free">
              {m.free_slots}/{plural(m.slots, "slot")} free
            </span>
            {m.queued_trials > 0 && <span>{m.queued_trials} queued</span>}
            <span className="version" data-testid="master-version">
              master {m.version}
            </span>
          </>
        )}
        {master.error && !m && <span className="offline">master unreachable</span>}
      </div>
      <CurrentUser />
    </header>
  );
}

function CurrentUser() {
  const { token, user } = useSession();
  // Who the token belongs to: also a token set from outside (a test) gets its name.
  useEffect(() => {
    if (!token) return;
    const controller = new AbortController();
    api
      .me(controller.signal)
      .then(rememberUser)
      .catch(() => undefined); // a 401 ends the session by itself; others: keep what is shown
    return () => controller.abort();
  }, [token]);

  const logout = () => {
    if (!token) return;
    // Sent with the token before it is forgotten here; an error (already ended on the
    // master, or unreachable) changes nothing: the token is gone from this browser.
    void api.logout(token).catch(() => undefined);
    endSession("logout");
  };

  return (
    <div className="topbar-user">
      {user && (
        <NavLink to="/account" className="user-name" title="Your account: change your password" data-testid="account-link">
          <span data-testid="current-user">{user.username}</span>
          {user.admin && <span className="admin-badge">admin</span>}
        </NavLink>
      )}
      <button type="button" className="logout" onClick={logout} data-testid="logout">
        Log out
      </button>
    </div>
  );
}

/** The pages behind the login: without a session, the login page (returning here after). */
function LoggedIn() {
  const { token } = useSession();
  const { pathname, search } = useLocation();
  if (!token) {
    const to = lastEndReason() === "logout" ? "/login" : loginPath(pathname + search);
    return <Navigate to={to} replace />;
  }
  return (
    <>
      <TopBar />
      <main>
        <Outlet />
      </main>
      <CompareBar />
    </>
  );
}

/** What is picked for comparison (on any page but the compare page): open or forget it. */
function CompareBar() {
  const selection = useSelection();
  const { pathname } = useLocation();
  const n = selection.trials.length;
  const m = selection.experiments.length;
  if (n + m === 0 || pathname === "/compare") return null;
  const parts = [n ? plural(n, "trial") : "", m ? plural(m, "experiment") : ""].filter(Boolean);
  return (
    <div className="compare-bar" data-testid="compare-bar">
      <span data-testid="compare-picked">Picked to compare: {parts.join(" and ")}</span>
      <Link to={comparePath(selection)} className="button primary" data-testid="compare-open">
        Compare
      </Link>
      <button type="button" onClick={clearSelection} data-testid="compare-clear">
        Clear
      </button>
    </div>
  );
}

function NotFound() {
  const { pathname } = useLocation();
  return (
    <div className="page">
      <div className="not-found" data-testid="not-found">
        <h1>Page not found</h1>
        <p>
          There is no page at <code>{pathname}</code>.
        </p>
        <p>
          <Link to="/">Back to the experiments</Link>
        </p>
      </div>
    </div>
  );
}

function App() {
  return (
    <BrowserRouter>
      <Routes>
        <Route path="/login" element={<LoginPage />} />
        <Route element={<LoggedIn />}>
          <Route path="/" element={<ExperimentListPage />} />
          <Route path="/experiments/:id" element={<ExperimentPage />} />
          <Route path="/trials/:id" element={<TrialPage />} />
          <Route path="/compare" element={<ComparePage />} />
          <Route path="/workspaces" element={<WorkspacesPage />} />
          <Route path="/workspaces/:name" element={<WorkspacePage />} />
          <Route path="/workspaces/:workspace/projects/:name" element={<ProjectPage />} />
          <Route path="/models" element={<ModelsPage />} />
          <Route path="/models/:name" element={<ModelPage />} />
          <Route path="/cluster" element={<ClusterPage />} />
          <Route path="/usage" element={<UsagePage />} />
          <Route path="/users" element={<UsersPage />} />
          <Route path="/account" element={<AccountPage />} />
          <Route path="*" element={<NotFound />} />
        </Route>
      </Routes>
    </BrowserRouter>
  );
}

createRoot(document.getElementById("root")!).render(
  <StrictMode>
    <App />
  </StrictMode>,
);
