// Small shared pieces: state badges, error panel, confirm dialog, actions, copy boxes.
import { useEffect, useRef, useState, type ReactNode } from "react";
import { ApiError, api, type Experiment, type ExperimentAction } from "../api";
import { allowedActions, stateLabel, stateTone } from "../format";

export function StateBadge({ state, testId }: { state: string; testId?: string }) {
  return (
    <span className={`state state-${stateTone(state)}`} data-testid={testId} data-state={state}>
      {stateLabel(state)}
    </span>
  );
}

/** Why an experiment's (or a trial's) trials cannot start on the cluster as it is: the
 * master's reason, the one `assay experiment describe` gives. */
export function WaitingNote({ why, testId }: { why: string; testId?: string }) {
  return (
    <div className="waiting-note" data-testid={testId} title="Its trials wait until agents that can hold them connect or are enabled">
      waiting: {why}
    </div>
  );
}

export function ErrorPanel({ error, title }: { error: unknown; title?: string }) {
  const message = error instanceof Error ? error.message : String(error);
  const status = error instanceof ApiError && error.status ? ` (HTTP ${error.status})` : "";
  return (
    <div className="error-panel" data-testid="error" role="alert">
      <strong>{title ?? "Something went wrong"}</strong>
      <div>
        {message}
        {status}
      </div>
    </div>
  );
}

export function Progress({ value }: { value: number }) {
  const v = Number.isFinite(value) ? Math.min(1, Math.max(0, value)) : 0;
  return (
    <span className="progress" title={`${Math.round(v * 100)}%`} data-testid="progress">
      <span className="progress-bar" style={{ width: `${v * 100}%` }} />
      <span className="progress-text">{Math.round(v * 100)}%</span>
    </span>
  );
}

export function Meter({ value, label }: { value: number; label?: string }) {
  const v = Number.isFinite(value) ? Math.min(1, Math.max(0, value)) : 0;
  const tone = v > 0.85 ? "hot" : v > 0.5 ? "warm" : "cool";
  return (
    <span className="meter" title={label ?? `${Math.round(v * 100)}%`}>
      <span className={`meter-bar meter-${tone}`} style={{ width: `${v * 100}%` }} />
      <span className="meter-text">{label ?? `${Math.round(v * 100)}%`}</span>
    </span>
  );
}

export function ConfirmDialog({
  title,
  body,
  confirmLabel,
  danger,
  onConfirm,
  onClose,
}: {
  title: string;
  body: ReactNode;
  confirmLabel: string;
  danger?: boolean;
  onConfirm: () => void;
  onClose: () => void;
}) {
  const ok = useRef<HTMLButtonElement>(null);
  useEffect(() => {
    ok.current?.focus();
    const onKey = (e: KeyboardEvent) => e.key === "Escape" && onClose();
    window.addEventListener("keydown", onKey);
    return () => window.removeEventListener("keydown", onKey);
  }, [onClose]);
  return (
    <div className="modal-backdrop" onMouseDown={onClose}>
      <div
        className="modal"
        role="dialog"
        aria-modal="true"
        aria-label={title}
        onMouseDown={(e) => e.stopPropagation()}
      >
        <h3>{title}</h3>
        <div className="modal-body">{body}</div>
        <div className="modal-actions">
          <button type="button" onClick={onClose} data-testid="confirm-cancel">
            Back
          </button>
          <button
            type="button"
            ref={ok}
            className={danger ? "danger" : "primary"}
            data-testid="confirm-ok"
            onClick={() => {
              onConfirm();
              onClose();
            }}
          >
            {confirmLabel}
          </button>
        </div>
      </div>
    </div>
  );
}

const ACTION_LABEL: Record<ExperimentAction, string> = {
  pause: "Pause",
  activate: "Activate",
  cancel: "Cancel",
  kill: "Kill",
  archive: "Archive",
  unarchive: "Unarchive",
};

const CONFIRM: Partial<Record<ExperimentAction, string>> = {
  cancel: "Its running trials stop at their next checkpoint and no new trials start. This cannot be undone.",
  kill: "Its running trials are stopped now, without a final checkpoint. This cannot be undone.",
};

/** The buttons of the actions an experiment accepts now; cancel and kill ask first. */
export function ExperimentActions({
  experiment,
  onDone,
  compact,
}: {
  experiment: Experiment;
  onDone: (updated: Experiment | null, error?: unknown) => void;
  compact?: boolean;
}) {
  const [pending, setPending] = useState<ExperimentAction | null>(null);
  const [asking, setAsking] = useState<ExperimentAction | null>(null);
  const run = async (action: ExperimentAction) => {
    setPending(action);
    try {
      onDone(await api.experimentAction(experiment.id, action));
    } catch (e) {
      onDone(null, e);
    } finally {
      setPending(null);
    }
  };
  const actions = allowedActions(experiment);
  return (
    <span className={compact ? "actions compact" : "actions"}>
      {actions.map((a) => (
        <button
          key={a}
          type="button"
          className={a === "kill" || a === "cancel" ? "danger-outline" : undefined}
          data-testid={`action-${a}`}
          disabled={pending !== null}
          onClick={(e) => {
            e.stopPropagation();
            if (CONFIRM[a]) setAsking(a);
            else void run(a);
          }}
        >
          {pending === a ? "…" : ACTION_LABEL[a]}
        </button>
      ))}
      {asking && (
        <ConfirmDialog
          title={`${ACTION_LABEL[asking]} experiment ${experiment.id} (${experiment.name})?`}
          body={CONFIRM[asking]}
          confirmLabel={ACTION_LABEL[asking]}
          danger
          onConfirm={() => void run(asking)}
          onClose={() => setAsking(null)}
        />
      )}
    </span>
  );
}

/** A command in a box with a button that copies it. */
/** A command to copy: shown with a Copy button; `compact` (a table's cell): the button
 * alone, the command in its tooltip. */
export function CopyCommand({ command, compact = false }: { command: string; compact?: boolean }) {
  const [copied, setCopied] = useState(false);
  const copy = async () => {
    try {
      await navigator.clipboard.writeText(command);
    } catch {
      // Non-secure origins (http:// on another host) have no clipboard API.
      const t = document.createElement("textarea");
      t.value = command;
      document.body.appendChild(t);
      t.select();
      document.execCommand("copy");
      t.remove();
    }
    setCopied(true);
    window.setTimeout(() => setCopied(false), 1200);
  };
  if (compact) {
    return (
      <button type="button" className="copy-compact" onClick={() => void copy()} title={command} data-testid="copy">
        {copied ? "Copied" : "Copy command"}
      </button>
    );
  }
  return (
    <span className="copy-command">
      <code title={command}>{command}</code>
      <button type="button" onClick={() => void copy()} title="Copy to clipboard" data-testid="copy">
        {copied ? "Copied" : "Copy"}
      </button>
    </span>
  );
}

export function downloadCommand(uuid: string): string {
  return `assay checkpoint download ${uuid} ./checkpoint-${uuid.slice(0, 8)}`;
}

export function Section({ title, right, children }: { title: string; right?: ReactNode; children: ReactNode }) {
  return (
    <section className="panel">
      <header className="panel-header">
        <h2>{title}</h2>
        {right && <div className="panel-tools">{right}</div>}
      </header>
      <div className="panel-body">{children}</div>
    </section>
  );
}

export function Loading({ what }: { what?: string }) {
  return <div className="loading">Loading{what ? ` ${what}` : ""}…</div>;
}
