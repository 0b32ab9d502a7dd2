// `/models` and `/models/:name`: the model registry. The list (filter by name, archived,
// a form for a new model) and a model's page with its versions: each one's checkpoint,
// the experiment and trial it came from, the validation metrics at that checkpoint, notes,
// who registered it and whose code loading it runs; a version whose checkpoint its owner
// deleted says so.
import { useEffect, useState } from "react";
import { Link, useParams, useSearchParams } from "react-router";
import { api, num, type Model, type ModelVersion } from "../api";
import { Field, Notice } from "../components/forms";
import { CopyCommand, ErrorPanel, Loading, Section } from "../components/ui";
import { fmtInt, fmtNumber, fmtTime } from "../format";
import { usePoll } from "../hooks";

function modelPath(name: string): string {
  return `/models/${encodeURIComponent(name)}`;
}

export function ModelsPage() {
  const [q, setQ] = useSearchParams();
  const name = q.get("name") ?? "";
  const archived = q.get("archived"); // null: not archived; "all"; "only"
  const params = { name: name || undefined, archived: archived === "all" ? undefined : archived === "only" };
  const list = usePoll(`models:${JSON.stringify(params)}`, (signal) => api.models(params, signal), { intervalMs: 10_000 });
  const [typed, setTyped] = useState(name);

  useEffect(() => {
    document.title = "Models · Assay";
  }, []);
  useEffect(() => {
    if (typed === name) return;
    const t = window.setTimeout(() => {
      const next = new URLSearchParams(q);
      if (typed) next.set("name", typed);
      else next.delete("name");
      setQ(next, { replace: true });
    }, 300);
    return () => window.clearTimeout(t);
  }, [typed, name, q, setQ]);

  const models = list.data?.models ?? [];
  return (
    <div className="page">
      <div className="page-title">
        <h1>Models</h1>
        <span className="muted">{list.data ? `${models.length} shown` : ""}</span>
      </div>
      <div className="filters">
        <input
          type="search"
          placeholder="Name contains…"
          value={typed}
          onChange={(e) => setTyped(e.target.value)}
          aria-label="Filter by name"
          data-testid="models-filter-name"
        />
        <select
          value={archived ?? "hide"}
          onChange={(e) => {
            const next = new URLSearchParams(q);
            if (e.target.value === "hide") next.delete("archived");
            else next.set("archived", e.target.value);
            setQ(next, { replace: true });
          }}
          aria-label="Archived models"
          data-testid="models-filter-archived"
        >
          <option value="hide">Not archived</option>
          <option value="all">Archived too</option>
          <option value="only">Archived only</option>
        </select>
      </div>
      {list.error && <ErrorPanel error={list.error} title="Cannot list models" />}
      {list.loading && !list.error && <Loading what="models" />}
      {list.data && (
        <div className="table-wrap">
          <table className="table" data-testid="models">
            <thead>
              <tr>
                <th>Name</th>
                <th>Description</th>
                <th className="num">Versions</th>
                <th className="num">Latest</th>
                <th>Owner</th>
                <th>Workspace</th>
                <th>Updated</th>
              </tr>
            </thead>
            <tbody>
              {models.map((m) => (
                <tr key={m.name} data-testid="model-row" data-name={m.name} className={m.archived ? "archived" : undefined}>
                  <td className="name-cell">
                    <Link to={modelPath(m.name)}>{m.name}</Link>
                    {m.labels.map((l) => (
                      <span key={l} className="chip">
                        {l}
                      </span>
                    ))}
                    {m.archived && <span className="chip chip-muted">archived</span>}
                  </td>
                  <td>{m.description || "–"}</td>
                  <td className="num" data-testid="model-versions">
                    {m.num_versions}
                  </td>
                  <td className="num">{m.latest_version ? `v${m.latest_version}` : "–"}</td>
                  <td>{m.owner || "–"}</td>
                  <td>{m.workspace || "–"}</td>
                  <td className="nowrap">{fmtTime(m.updated_at)}</td>
                </tr>
              ))}
              {models.length === 0 && (
                <tr>
                  <td colSpan={7} className="empty">
                    {name || archived
                      ? "No models match these filters."
                      : "No models yet. Register a checkpoint from a trial's page, or create a model here."}
                  </td>
                </tr>
              )}
            </tbody>
          </table>
        </div>
      )}
      <NewModel onCreated={list.reload} />
    </div>
  );
}

function NewModel({ onCreated }: { onCreated: () => void }) {
  const [name, setName] = useState("");
  const [description, setDescription] = useState("");
  const [workspace, setWorkspace] = useState("");
  const [error, setError] = useState<unknown>(null);
  const [created, setCreated] = useState<Model | null>(null);
  const [busy, setBusy] = useState(false);
  const submit = async () => {
    setError(null);
    setCreated(null);
    if (!name.trim()) {
      setError(new Error("Enter the new model's name."));
      return;
    }
    setBusy(true);
    try {
      setCreated(await api.createModel(name.trim(), description, workspace.trim()));
      setName("");
      setDescription("");
      onCreated();
    } catch (e) {
      setError(e);
    } finally {
      setBusy(false);
    }
  };
  return (
    <Section title="New model">
      <form
        className="form"
        data-testid="model-new"
        onSubmit={(e) => {
          e.preventDefault();
          void submit();
        }}
      >
        <div className="form-row">
          <Field label="Name" testId="model-new-name" value={name} onChange={(e) => setName(e.target.value)} />
          <Field
            label="Description"
            testId="model-new-description"
            value={description}
            onChange={(e) => setDescription(e.target.value)}
          />
          <Field
            label="Workspace"
            testId="model-new-workspace"
            value={workspace}
            placeholder="Default"
            title="Its editors may change the model too; in Default only you and admins may"
            onChange={(e) => setWorkspace(e.target.value)}
          />
          <button type="submit" className="primary" disabled={busy} data-testid="model-new-submit">
            Create
          </button>
        </div>
        {error !== null && <ErrorPanel error={error} title="Not created" />}
        {created && (
          <Notice testId="model-new-message">
            Created <Link to={modelPath(created.name)}>{created.name}</Link>.
          </Notice>
        )}
      </form>
    </Section>
  );
}

export function ModelPage() {
  const { name = "" } = useParams();
  const model = usePoll(`model:${name}`, (signal) => api.model(name, signal), { intervalMs: 10_000 });
  const versions = usePoll(`model-versions:${name}`, (signal) => api.modelVersions(name, signal), { intervalMs: 10_000 });
  const [actionError, setActionError] = useState<unknown>(null);

  useEffect(() => {
    document.title = `${name} · Models · Assay`;
  }, [name]);

  if (model.error && !model.data) {
    return (
      <div className="page">
        <ErrorPanel error={model.error} title={`Cannot show model ${name}`} />
        <p>
          <Link to="/models">Back to the models</Link>
        </p>
      </div>
    );
  }
  const m = model.data;
  if (!m) {
    return (
      <div className="page">
        <Loading what={`model ${name}`} />
      </div>
    );
  }
  const archive = async () => {
    setActionError(null);
    try {
      await api.setModelArchived(m.name, !m.archived);
      model.reload();
    } catch (e) {
      setActionError(e);
    }
  };
  const list = [...(versions.data?.versions ?? [])].sort((a, b) => b.version - a.version);
  return (
    <div className="page">
      <div className="page-title">
        <h1 data-testid="model-name">{m.name}</h1>
        {m.archived && <span className="chip chip-muted">archived</span>}
        {m.labels.map((l) => (
          <span key={l} className="chip">
            {l}
          </span>
        ))}
        <span className="spacer" />
        <button type="button" onClick={() => void archive()} data-testid={m.archived ? "model-unarchive" : "model-archive"}>
          {m.archived ? "Unarchive" : "Archive"}
        </button>
      </div>
      {actionError !== null && <ErrorPanel error={actionError} title="The action failed" />}
      <p className="muted" data-testid="model-about">
        {m.description || "No description."} Owner {m.owner || "–"}, workspace {m.workspace || "–"}, created{" "}
        {fmtTime(m.created_at)}. Its owner, {m.workspace === "Default" ? "" : "editors of its workspace, "}and admins
        may change it.
      </p>
      <Section title={`Versions (${m.num_versions})`}>
        {versions.error && <ErrorPanel error={versions.error} title="Cannot list the versions" />}
        {versions.loading && !versions.error && <Loading what="versions" />}
        {versions.data && (
          <div className="table-wrap">
            <table className="table" data-testid="model-versions-table">
              <thead>
                <tr>
                  <th className="num">Version</th>
                  <th>Checkpoint</th>
                  <th>From</th>
                  <th className="num">Batches</th>
                  <th>Metrics at the checkpoint</th>
                  <th>Notes</th>
                  <th>Registered by</th>
                  <th title="Who uploaded the code that loading the version runs">Code by</th>
                  <th>Download</th>
                </tr>
              </thead>
              <tbody>
                {list.map((v) => (
                  <VersionRow key={v.version} v={v} />
                ))}
                {list.length === 0 && (
                  <tr>
                    <td colSpan={9} className="empty">
                      No versions yet: "Register" on a trial's checkpoint adds one.
                    </td>
                  </tr>
                )}
              </tbody>
            </table>
          </div>
        )}
      </Section>
    </div>
  );
}

function VersionRow({ v }: { v: ModelVersion }) {
  const c = v.checkpoint;
  const metrics = Object.entries(c?.validation_metrics ?? {});
  const gone = Boolean(v.checkpoint_deleted);
  return (
    <tr data-testid="version-row" data-version={v.version} className={gone ? "archived" : undefined}>
      <td className="num">v{v.version}</td>
      <td className="mono small" title={v.checkpoint_uuid}>
        {v.checkpoint_uuid.slice(0, 8)}
        {gone && (
          <span
            className="chip chip-muted"
            data-testid="version-deleted"
            title={`Checkpoint ${v.checkpoint_uuid} of version ${v.version} was deleted by its owner${
              v.checkpoint_deleted_at ? ` (${fmtTime(v.checkpoint_deleted_at)})` : ""
            }: nothing to download or load`}
          >
            deleted by its owner
          </span>
        )}
      </td>
      <td data-testid="version-from">
        {c ? (
          <>
            <Link to={`/experiments/${c.experiment_id}`}>experiment {String(c.experiment_id)}</Link> ·{" "}
            <Link to={`/trials/${c.trial_id}`}>trial {String(c.trial_id)}</Link>
          </>
        ) : (
          "–"
        )}
      </td>
      <td className="num">{c ? fmtInt(num(c.total_batches)) : "–"}</td>
      <td className="small" data-testid="version-metrics">
        {metrics.length ? metrics.map(([k, x]) => `${k} ${fmtNumber(num(x))}`).join(", ") : "–"}
      </td>
      <td className="notes" data-testid="version-notes">
        {v.notes || "–"}
      </td>
      <td className="nowrap" data-testid="version-registered-by">
        {v.user || "–"}, {fmtTime(v.created_at)}
      </td>
      <td data-testid="version-code-owner">{v.code_owner || "–"}</td>
      <td>
        {gone ? (
          "–"
        ) : (
          <CopyCommand command={`assay model download ${v.model} ${v.version} ./${v.model}-v${v.version}`} />
        )}
      </td>
    </tr>
  );
}
