// "Register" on a checkpoint: a small dialog (model name, notes) that makes the checkpoint
// the model's next version, creating the model first when there is none of that name.
import { useEffect, useRef, useState } from "react";
import { Link } from "react-router";
import { ApiError, api, type ModelVersion } from "../api";
import { ErrorPanel } from "./ui";

export function RegisterCheckpoint({ uuid }: { uuid: string }) {
  const [open, setOpen] = useState(false);
  const [done, setDone] = useState<ModelVersion | null>(null);
  return (
    <span className="register">
      <button type="button" onClick={() => setOpen(true)} data-testid="register-checkpoint">
        Register
      </button>
      {done && (
        <span className="register-done" data-testid="register-done">
          {" "}
          <Link to={`/models/${encodeURIComponent(done.model)}`}>
            {done.model} v{done.version}
          </Link>
        </span>
      )}
      {open && (
        <RegisterDialog
          uuid={uuid}
          onClose={() => setOpen(false)}
          onDone={(v) => {
            setDone(v);
            setOpen(false);
          }}
        />
      )}
    </span>
  );
}

function RegisterDialog({ uuid, onClose, onDone }: { uuid: string; onClose: () => void; onDone: (v: ModelVersion) => void }) {
  const [name, setName] = useState("");
  const [notes, setNotes] = useState("");
  const [names, setNames] = useState<string[]>([]);
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  const first = useRef<HTMLInputElement>(null);

  useEffect(() => {
    first.current?.focus();
    const controller = new AbortController();
    api
      .models({ archived: false }, controller.signal)
      .then((m) => setNames((m.models ?? []).map((x) => x.name)))
      .catch(() => undefined); // only suggestions
    const onKey = (e: KeyboardEvent) => e.key === "Escape" && onClose();
    window.addEventListener("keydown", onKey);
    return () => {
      controller.abort();
      window.removeEventListener("keydown", onKey);
    };
  }, [onClose]);

  const submit = async () => {
    const model = name.trim();
    if (!model) {
      setError(new Error("Enter the name of a model (a new name creates the model)."));
      return;
    }
    setBusy(true);
    setError(null);
    try {
      try {
        await api.model(model);
      } catch (e) {
        if (!(e instanceof ApiError && e.notFound)) throw e;
        await api.createModel(model, "");
      }
      onDone(await api.registerVersion(model, uuid, notes));
    } catch (e) {
      setError(e);
    } finally {
      setBusy(false);
    }
  };

  return (
    <div className="modal-backdrop" onMouseDown={onClose}>
      <form
        className="modal form"
        role="dialog"
        aria-modal="true"
        aria-label="Register this checkpoint"
        data-testid="register-form"
        onMouseDown={(e) => e.stopPropagation()}
        onSubmit={(e) => {
          e.preventDefault();
          void submit();
        }}
      >
        <h3>Register checkpoint {uuid.slice(0, 8)}</h3>
        <p className="muted small">
          It becomes the model's next version, and is kept from deletion while registered. A name
          that is not a model yet creates one.
        </p>
        <label className="field">
          <span>Model</span>
          <input
            ref={first}
            list="register-model-names"
            value={name}
            onChange={(e) => setName(e.target.value)}
            placeholder="e.g. digits-cnn"
            data-testid="register-model"
          />
          <datalist id="register-model-names">
            {names.map((n) => (
              <option key={n} value={n} />
            ))}
          </datalist>
        </label>
        <label className="field">
          <span>Notes</span>
          <textarea rows={3} value={notes} onChange={(e) => setNotes(e.target.value)} data-testid="register-notes" />
        </label>
        {error !== null && <ErrorPanel error={error} title="Not registered" />}
        <div className="modal-actions">
          <button type="button" onClick={onClose} data-testid="register-cancel">
            Cancel
          </button>
          <button type="submit" className="primary" disabled={busy} data-testid="register-submit">
            {busy ? "Registering…" : "Register"}
          </button>
        </div>
      </form>
    </div>
  );
}
