// `/workspaces`, `/workspaces/:name` and `/workspaces/:ws/projects/:name`: the workspaces
// the user belongs to, a workspace's projects and members, and a project's experiments
// (the experiment list, limited to the project).
import { useEffect, useState } from "react";
import { Link, useParams } from "react-router";
import { api } from "../api";
import { Field, Notice } from "../components/forms";
import { ErrorPanel, Loading, Section } from "../components/ui";
import { usePoll } from "../hooks";
import { ExperimentListPage, projectPath } from "./ExperimentListPage";

function workspacePath(name: string): string {
  return `/workspaces/${encodeURIComponent(name)}`;
}

export function WorkspacesPage() {
  const list = usePoll("workspaces", (signal) => api.workspaces(signal), { intervalMs: 10_000 });
  useEffect(() => {
    document.title = "Workspaces · Assay";
  }, []);
  const workspaces = list.data?.workspaces ?? [];
  return (
    <div className="page">
      <div className="page-title">
        <h1>Workspaces</h1>
      </div>
      {list.error && <ErrorPanel error={list.error} title="Cannot list workspaces" />}
      {list.loading && !list.error && <Loading what="workspaces" />}
      {list.data && (
        <div className="table-wrap">
          <table className="table" data-testid="workspaces">
            <thead>
              <tr>
                <th>Name</th>
                <th>Your role</th>
                <th className="num">Projects</th>
                <th className="num">Experiments</th>
              </tr>
            </thead>
            <tbody>
              {workspaces.map((w) => (
                <tr key={w.name} data-testid="workspace-row" data-name={w.name} className={w.archived ? "archived" : undefined}>
                  <td className="name-cell">
                    <Link to={workspacePath(w.name)}>{w.name}</Link>
                    {w.archived && <span className="chip chip-muted">archived</span>}
                  </td>
                  <td data-testid="workspace-role">{w.role || "–"}</td>
                  <td className="num">{w.num_projects}</td>
                  <td className="num" data-testid="workspace-experiments">
                    {w.num_experiments}
                  </td>
                </tr>
              ))}
              {workspaces.length === 0 && (
                <tr>
                  <td colSpan={4} className="empty">
                    You belong to no workspace yet.
                  </td>
                </tr>
              )}
            </tbody>
          </table>
        </div>
      )}
      <NewThing
        title="New workspace"
        testId="workspace-new"
        withDescription={false}
        create={async (name) => {
          const w = await api.createWorkspace(name);
          list.reload();
          return { name: w.name, path: workspacePath(w.name) };
        }}
      />
    </div>
  );
}

export function WorkspacePage() {
  const { name = "" } = useParams();
  const ws = usePoll(`workspace:${name}`, (signal) => api.workspace(name, signal), { intervalMs: 10_000 });
  useEffect(() => {
    document.title = `${name} · Workspaces · Assay`;
  }, [name]);
  if (ws.error && !ws.data) {
    return (
      <div className="page">
        <ErrorPanel error={ws.error} title={`Cannot show workspace ${name}`} />
        <p>
          <Link to="/workspaces">Back to the workspaces</Link>
        </p>
      </div>
    );
  }
  const d = ws.data;
  if (!d) {
    return (
      <div className="page">
        <Loading what={`workspace ${name}`} />
      </div>
    );
  }
  const projects = d.projects ?? [];
  const members = d.members ?? [];
  return (
    <div className="page">
      <div className="page-title">
        <h1 data-testid="workspace-name">{d.workspace.name}</h1>
        {d.workspace.archived && <span className="chip chip-muted">archived</span>}
        <span className="muted">your role: {d.workspace.role || "–"}</span>
      </div>
      <Section title={`Projects (${projects.length})`}>
        <div className="table-wrap">
          <table className="table" data-testid="projects">
            <thead>
              <tr>
                <th>Name</th>
                <th>Description</th>
                <th className="num">Experiments</th>
              </tr>
            </thead>
            <tbody>
              {projects.map((p) => (
                <tr key={p.name} data-testid="project-row" data-name={p.name} className={p.archived ? "archived" : undefined}>
                  <td className="name-cell">
                    <Link to={projectPath(p.workspace || d.workspace.name, p.name)}>{p.name}</Link>
                    {p.archived && <span className="chip chip-muted">archived</span>}
                  </td>
                  <td>{p.description || "–"}</td>
                  <td className="num" data-testid="project-experiments">
                    {p.num_experiments}
                  </td>
                </tr>
              ))}
              {projects.length === 0 && (
                <tr>
                  <td colSpan={3} className="empty">
                    No projects yet.
                  </td>
                </tr>
              )}
            </tbody>
          </table>
        </div>
      </Section>
      <Section title={`Members (${members.length})`}>
        <table className="table" data-testid="members">
          <thead>
            <tr>
              <th>User</th>
              <th>Role</th>
            </tr>
          </thead>
          <tbody>
            {members.map((m) => (
              <tr key={m.username} data-testid="member-row" data-username={m.username}>
                <td>{m.username}</td>
                <td>{m.role}</td>
              </tr>
            ))}
          </tbody>
        </table>
        <p className="muted small">
          Members and roles are managed with <code>assay workspace add-member</code> and{" "}
          <code>remove-member</code>.
        </p>
      </Section>
      <NewThing
        title="New project"
        testId="project-new"
        withDescription
        create={async (project, description) => {
          const p = await api.createProject(d.workspace.name, project, description);
          ws.reload();
          return { name: p.name, path: projectPath(d.workspace.name, p.name) };
        }}
      />
    </div>
  );
}

export function ProjectPage() {
  const { workspace = "", name = "" } = useParams();
  const project = usePoll(`project:${workspace}/${name}`, (signal) => api.project(workspace, name, signal), {
    intervalMs: 10_000,
  });
  if (project.error && !project.data) {
    return (
      <div className="page">
        <ErrorPanel error={project.error} title={`Cannot show project ${workspace}/${name}`} />
        <p>
          <Link to={workspacePath(workspace)}>Back to workspace {workspace}</Link>
        </p>
      </div>
    );
  }
  const p = project.data;
  return (
    <div className="page">
      <div className="page-title">
        <h1 data-testid="project-name">
          <Link to={workspacePath(workspace)} className="muted-link">
            {workspace}
          </Link>{" "}
          / {name}
        </h1>
        {p?.archived && <span className="chip chip-muted">archived</span>}
      </div>
      {p?.description && <p className="muted">{p.description}</p>}
      <ExperimentListPage scope={{ workspace, project: name }} title={`${workspace}/${name}`} />
    </div>
  );
}

function NewThing({
  title,
  testId,
  withDescription,
  create,
}: {
  title: string;
  testId: string;
  withDescription: boolean;
  create: (name: string, description: string) => Promise<{ name: string; path: string }>;
}) {
  const [name, setName] = useState("");
  const [description, setDescription] = useState("");
  const [error, setError] = useState<unknown>(null);
  const [created, setCreated] = useState<{ name: string; path: string } | null>(null);
  const [busy, setBusy] = useState(false);
  const submit = async () => {
    setError(null);
    setCreated(null);
    if (!name.trim()) {
      setError(new Error("Enter a name."));
      return;
    }
    setBusy(true);
    try {
      setCreated(await create(name.trim(), description));
      setName("");
      setDescription("");
    } catch (e) {
      setError(e);
    } finally {
      setBusy(false);
    }
  };
  return (
    <Section title={title}>
      <form
        className="form"
        data-testid={testId}
        onSubmit={(e) => {
          e.preventDefault();
          void submit();
        }}
      >
        <div className="form-row">
          <Field label="Name" testId={`${testId}-name`} value={name} onChange={(e) => setName(e.target.value)} />
          {withDescription && (
            <Field
              label="Description"
              testId={`${testId}-description`}
              value={description}
              onChange={(e) => setDescription(e.target.value)}
            />
          )}
          <button type="submit" className="primary" disabled={busy} data-testid={`${testId}-submit`}>
            Create
          </button>
        </div>
        {error !== null && <ErrorPanel error={error} title="Not created" />}
        {created && (
          <Notice testId={`${testId}-message`}>
            Created <Link to={created.path}>{created.name}</Link>.
          </Notice>
        )}
      </form>
    </Section>
  );
}
