// "Fork" on an experiment's page: its config as editable YAML, submitted as a new
// experiment with the same model definition (the master reads it from the source, which
// the user must be able to read), as `assay experiment fork` does. It starts from scratch.
import { useEffect, useRef, useState } from "react";
import { useNavigate } from "react-router";
import { api, type Experiment } from "../api";
import { toYaml } from "../format";
import { ErrorPanel } from "./ui";

/** What the master shows in place of a secret (master/_secrets.py MASK). */
const MASKED = "********";

export function ForkButton({ experiment }: { experiment: Experiment }) {
  const [open, setOpen] = useState(false);
  return (
    <>
      <button type="button" onClick={() => setOpen(true)} data-testid="fork-experiment">
        Fork
      </button>
      {open && <ForkDialog experiment={experiment} onClose={() => setOpen(false)} />}
    </>
  );
}

function ForkDialog({ experiment, onClose }: { experiment: Experiment; onClose: () => void }) {
  const navigate = useNavigate();
  const [text, setText] = useState(
    () => experiment.config_yaml || (experiment.config ? toYaml(experiment.config) : ""),
  );
  const [paused, setPaused] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  const area = useRef<HTMLTextAreaElement>(null);

  useEffect(() => {
    area.current?.focus();
    const onKey = (e: KeyboardEvent) => e.key === "Escape" && onClose();
    window.addEventListener("keydown", onKey);
    return () => window.removeEventListener("keydown", onKey);
  }, [onClose]);

  const submit = async () => {
    if (text.includes(MASKED)) {
      setError(new Error(`The config holds secrets the master does not show (${MASKED}): type each value in.`));
      return;
    }
    setBusy(true);
    setError(null);
    try {
      const created = await api.forkExperiment(experiment.id, text, !paused);
      navigate(`/experiments/${String(created.experiment.id)}`);
      onClose();
    } catch (e) {
      setError(e);
    } finally {
      setBusy(false);
    }
  };

  return (
    <div className="modal-backdrop" onMouseDown={onClose}>
      <form
        className="modal form modal-wide"
        role="dialog"
        aria-modal="true"
        aria-label={`Fork experiment ${String(experiment.id)}`}
        data-testid="fork-form"
        onMouseDown={(e) => e.stopPropagation()}
        onSubmit={(e) => {
          e.preventDefault();
          void submit();
        }}
      >
        <h3>
          Fork experiment {String(experiment.id)} ({experiment.name})
        </h3>
        <p className="muted small">
          A new experiment with this config and the same model definition, trained from scratch. Edit the
          config below (YAML).
        </p>
        <textarea
          ref={area}
          className="config-editor"
          rows={18}
          spellCheck={false}
          value={text}
          onChange={(e) => setText(e.target.value)}
          data-testid="fork-config"
        />
        <label className="check">
          <input type="checkbox" checked={paused} onChange={(e) => setPaused(e.target.checked)} /> Create it
          paused
        </label>
        {error !== null && <ErrorPanel error={error} title="The fork was refused" />}
        <div className="modal-actions">
          <button type="button" onClick={onClose}>
            Back
          </button>
          <button type="submit" className="primary" disabled={busy} data-testid="fork-submit">
            {busy ? "…" : "Create experiment"}
          </button>
        </div>
      </form>
    </div>
  );
}
