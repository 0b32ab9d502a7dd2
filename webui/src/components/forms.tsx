// Form pieces shared by the users and account pages: a labelled field, the check of a
// new password typed twice, and the green note that says an action worked.
import type { InputHTMLAttributes, ReactNode } from "react";

/** The master's rule, for the hint; the master checks it (and more) and says what is wrong. */
export const MIN_PASSWORD = 8;

export function Field({
  label,
  testId,
  ...input
}: { label: string; testId: string } & InputHTMLAttributes<HTMLInputElement>) {
  return (
    <label className="field">
      <span>{label}</span>
      <input {...input} data-testid={testId} />
    </label>
  );
}

/**
 * Why a new password typed twice cannot be sent, or null when it can. Only what the
 * master cannot know is checked here; its own rules (length, not the user name) come
 * back in its answer.
 */
export function newPasswordProblem(password: string, again: string): string | null {
  if (!password) return "Enter the new password.";
  if (password !== again) return "The two passwords differ; type the same one twice.";
  return null;
}

export function Notice({ testId, children }: { testId: string; children: ReactNode }) {
  return (
    <div className="notice" role="status" data-testid={testId}>
      {children}
    </div>
  );
}
