// "Delete" on an experiment's page, as `assay experiment delete` does: an ended experiment
// goes with its trials' metrics and logs and its checkpoints. The master refuses while it
// runs, while a registered model version keeps one of its checkpoints, or to a user who
// is neither its owner nor an editor of its workspace; the dialog shows its reason.
import { useEffect, useRef, useState } from "react";
import { useNavigate } from "react-router";
import { api, type Experiment } from "../api";
import { isTerminal } from "../format";
import { useSession } from "../hooks";
import { projectPath } from "../pages/ExperimentListPage";
import { ErrorPanel } from "./ui";

/** Workspace roles that may delete its experiments (the master's EDITOR or above). */
const EDITS = new Set(["editor", "admin"]);
/** The workspace every user shares: there an editor deletes only their own experiments. */
const SHARED = "Default";

/** Whether the logged-in user may delete `experiment`: an admin, its owner, or an editor
 * of its workspace other than Default (asked of the master; unknown until it answers,
 * then hidden). */
function useMayDelete(experiment: Experiment): boolean {
  const { user } = useSession();
  const direct = user !== null && (user.admin || user.username === experiment.owner);
  const workspace = experiment.workspace ?? "";
  // The caller's role, with the workspace it is for: a role answered for the previous
  // experiment's workspace never shows Delete on this one.
  const [role, setRole] = useState<{ workspace: string; role: string } | null>(null);
  useEffect(() => {
    if (direct || !workspace) return;
    const controller = new AbortController();
    api
      .workspace(workspace, controller.signal)
      .then((d) => setRole({ workspace, role: d.workspace.role }))
      .catch(() => setRole(null));
    return () => controller.abort();
  }, [direct, workspace]);
  const edits = role !== null && role.workspace === workspace && EDITS.has(role.role);
  return direct || (edits && (workspace !== SHARED || role?.role === "admin"));
}

export function DeleteExperimentButton({ experiment }: { experiment: Experiment }) {
  const [open, setOpen] = useState(false);
  const mayDelete = useMayDelete(experiment);
  if (!mayDelete) return null;
  const ended = isTerminal(experiment.state);
  return (
    <>
      <span title={ended ? undefined : "Only an ended experiment can be deleted: kill it or wait for its end"}>
        <button
          type="button"
          className="danger-outline"
          disabled={!ended}
          onClick={() => setOpen(true)}
          data-testid="delete-experiment"
        >
          Delete
        </button>
      </span>
      {open && <DeleteExperimentDialog experiment={experiment} onClose={() => setOpen(false)} />}
    </>
  );
}

function DeleteExperimentDialog({ experiment, onClose }: { experiment: Experiment; onClose: () => void }) {
  const navigate = useNavigate();
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  const cancel = useRef<HTMLButtonElement>(null);
  const id = String(experiment.id);

  useEffect(() => {
    cancel.current?.focus();
    const onKey = (e: KeyboardEvent) => e.key === "Escape" && onClose();
    window.addEventListener("keydown", onKey);
    return () => window.removeEventListener("keydown", onKey);
  }, [onClose]);

  const submit = async () => {
    setBusy(true);
    setError(null);
    try {
      await api.deleteExperiment(experiment.id);
      onClose();
      navigate(experiment.project ? projectPath(experiment.workspace ?? "", experiment.project) : "/", {
        replace: true,
      });
    } catch (e) {
      setError(e);
      setBusy(false);
    }
  };

  return (
    <div className="modal-backdrop" onMouseDown={onClose}>
      <form
        className="modal form"
        role="dialog"
        aria-modal="true"
        aria-label={`Delete experiment ${id}`}
        data-testid="delete-form"
        onMouseDown={(e) => e.stopPropagation()}
        onSubmit={(e) => {
          e.preventDefault();
          void submit();
        }}
      >
        <h3>
          Delete experiment {id} ({experiment.name})?
        </h3>
        <p>
          The experiment goes, with{" "}
          {experiment.num_trials === 1 ? "its trial's" : `its ${experiment.num_trials} trials'`}{" "}
          metrics and logs and all its checkpoints (their files too). This cannot be undone.
        </p>
        {error !== null && <ErrorPanel error={error} title="The master refused to delete it" />}
        <div className="modal-actions">
          <button type="button" ref={cancel} onClick={onClose} data-testid="delete-cancel">
            Cancel
          </button>
          <button type="submit" className="danger" disabled={busy} data-testid="delete-submit">
            {busy ? "…" : "Delete"}
          </button>
        </div>
      </form>
    </div>
  );
}
