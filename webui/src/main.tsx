import { StrictMode } from "react";
import { createRoot } from "react-dom/client";
import { BrowserRouter, Link, NavLink, Route, Routes, useLocation } from "react-router";
import { api } from "./api";
import { usePoll } from "./hooks";
import { ClusterPage } from "./pages/ClusterPage";
import { ExperimentListPage } from "./pages/ExperimentListPage";
import { ExperimentPage } from "./pages/ExperimentPage";
import { TrialPage } from "./pages/TrialPage";
import "./styles.css";

function TopBar() {
  const master = usePoll("master", (signal) => api.master(signal), { intervalMs: 10_000 });
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
        <NavLink to="/cluster">Cluster</NavLink>
      </nav>
      <div className="topbar-info">
        {m && (
          <>
            <span title="free slots / all slots">
              {m.free_slots}/{m.slots} slots free
            </span>
            {m.queued_trials > 0 && <span>{m.queued_trials} queued</span>}
            <span className="version" data-testid="master-version">
              master {m.version}
            </span>
          </>
        )}
        {master.error && !m && <span className="offline">master unreachable</span>}
      </div>
    </header>
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
      <TopBar />
      <main>
        <Routes>
          <Route path="/" element={<ExperimentListPage />} />
          <Route path="/experiments/:id" element={<ExperimentPage />} />
          <Route path="/trials/:id" element={<TrialPage />} />
          <Route path="/cluster" element={<ClusterPage />} />
          <Route path="*" element={<NotFound />} />
        </Routes>
      </main>
    </BrowserRouter>
  );
}

createRoot(document.getElementById("root")!).render(
  <StrictMode>
    <App />
  </StrictMode>,
);
