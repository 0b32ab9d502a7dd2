"""Metric reports: stored once per (trial, run, group, batch, metric), fenced by run.

A report is a batch of values at batch counts, written in one transaction with its
rollups (_rollups.py). Writes are idempotent: a value already stored identically is
skipped and a different one refused. Only the trial's current run may report; a restore
supersedes what the failed run reported past its checkpoint (kept, hidden from curves).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any, cast

from sqlalchemy import Engine, Table, and_, case, not_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from assay.config import MAX_METRIC_NAME_CHARS, METRIC_NAMES_PER_TRIAL, name_problem
from assay.master.errors import (
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    StaleRunError,
)
from assay.master.store._base import StoreBase
from assay.master.store._curves import read_curve, read_curves
from assay.master.store._metric_names import MetricNameCap
from assay.master.store._models import Experiment, Metric, MetricRollup, Trial
from assay.master.store._records import MetricReport, MetricsReported
from assay.master.store._rollups import Row, live_best, merge_rollups

TRIALS = cast(Table, Trial.__table__)
VALIDATION = "validation"  # the group whose searcher metric ranks trials
MAX_GROUP_LEN = 64
MAX_BATCHES = 2**63 - 1
MAX_NAME_LEN = MAX_METRIC_NAME_CHARS


class MetricQueries(StoreBase):
    """Metric reports, curves and metric names."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self._name_cap = MetricNameCap()

    def report_metrics(
        self,
        trial_id: int,
        run_id: int,
        group: str,
        reports: Sequence[MetricReport],
        *,
        max_names: int = METRIC_NAMES_PER_TRIAL,
    ) -> int:
        """Store a batch of reports in one transaction; return how many values were new.

        `report_metrics_and_progress` without a searcher metric, less what it returns.
        """
        return self.report_metrics_and_progress(
            trial_id, run_id, group, reports, max_names=max_names
        ).stored

    def report_metrics_and_progress(
        self,
        trial_id: int,
        run_id: int,
        group: str,
        reports: Sequence[MetricReport],
        *,
        searcher_metric: str | None = None,
        smaller_is_better: bool = True,
        max_names: int = METRIC_NAMES_PER_TRIAL,
    ) -> MetricsReported:
        """Store a batch of reports and the trial's progress, all in one transaction.

        The trial's `total_batches` rises to the largest batch count reported. In the
        validation group, its `best_validation` moves to the best finite value of
        `searcher_metric` reported, where that is better than the stored one. Neither
        ever goes back: a report racing another cannot lower them. What is returned is
        the trial's row after the report, for the master to update its memory with.

        Idempotent: values already stored identically are skipped, and a retry leaves the
        trial's progress as it was; a different value for a stored (trial, run, group,
        batch, metric) is refused with `ConflictError`. A report from an older run than
        the trial's current one raises `StaleRunError`, and writes nothing. A report that
        would take the trial past `max_names` distinct metric names (0: no limit) raises
        `ResourceExhaustedError`, and writes nothing (see _metric_names.py).
        """
        check_group(group)
        rows, names = flatten_reports(reports)
        latest = max((r.total_batches for r in reports), default=0)
        best = None
        if group == VALIDATION and searcher_metric is not None:
            best = best_value(rows, searcher_metric, smaller_is_better)
        for attempt in range(3):
            admitted = False
            try:
                with self.write() as s:
                    check_run(s, trial_id, run_id)
                    admitted = self._name_cap.admit(s, trial_id, group, names, max_names)
                    stored = insert_metrics(s, trial_id, run_id, group, rows)
                    total, best_validation = advance_trial(
                        s, trial_id, latest, best, smaller_is_better
                    )
                    done = MetricsReported(stored, total, best_validation)
            except BaseException as e:
                if admitted:  # the names it counted were not stored
                    self._name_cap.forget(trial_id)
                # A concurrent identical report won the race; the retry sees its rows.
                if not isinstance(e, IntegrityError) or attempt == 2:
                    raise
            else:
                return done
        raise AssertionError("unreachable")

    def best_validation_through(
        self, trial_id: int, through_batches: int, metric: str, smaller_is_better: bool
    ) -> float | None:
        """The best finite live validation value of `metric` the trial reported at or
        before `through_batches`: its `best_validation` once a run restored from a
        checkpoint there has superseded the rest (`WriteBatch.supersede_metrics`), known
        before that batch is written."""
        with self.read() as s:
            return live_best(s, trial_id, metric, smaller_is_better, through_batches)

    def trial_curve(
        self, trial_id: int, name: str, *, group: str = "validation", max_points: int = 1000
    ) -> list[tuple[int, float]]:
        """One metric's live curve, downsampled to at most `max_points` (extremes kept)."""
        with self._trial_read(trial_id, max_points) as s:
            return read_curve(s, trial_id, group, name, max_points)

    @contextlib.contextmanager
    def _trial_read(self, trial_id: int, max_points: int) -> Iterator[Session]:
        """A read of an existing trial's curves of at most `max_points` points each."""
        if not 2 <= max_points <= 100_000:
            raise InvalidArgumentError(f"max_points must be 2-100000, got {max_points}")
        with self.read() as s:
            if s.get(Trial, trial_id) is None:
                raise NotFoundError(f"trial {trial_id} does not exist")
            yield s

    def trial_curves(
        self, trial_id: int, *, group: str = "validation", max_points: int = 1000
    ) -> dict[str, list[tuple[int, float]]]:
        """Every metric's live curve in `group`, each as `trial_curve` gives it."""
        with self._trial_read(trial_id, max_points) as s:
            return read_curves(s, trial_id, group, max_points)

    def experiment_curves(
        self, experiment_id: int, name: str, *, group: str = "validation", max_points: int = 1000
    ) -> dict[int, list[tuple[int, float]]]:
        """Every trial's curve of one metric, each downsampled to at most `max_points`."""
        if not 2 <= max_points <= 100_000:
            raise InvalidArgumentError(f"max_points must be 2-100000, got {max_points}")
        with self.read() as s:
            if s.get(Experiment, experiment_id) is None:
                raise NotFoundError(f"experiment {experiment_id} does not exist")
            ids = s.execute(
                select(Trial.id).where(Trial.experiment_id == experiment_id).order_by(Trial.id)
            ).scalars()
            return {t: read_curve(s, t, group, name, max_points) for t in ids}

    def metric_names(self, trial_id: int) -> dict[str, list[str]]:
        """Group -> metric names that the trial has reported."""
        with self.read() as s:
            rows = s.execute(
                select(MetricRollup.group, MetricRollup.name)
                .where(MetricRollup.trial_id == trial_id, MetricRollup.level == 1)
                .distinct()
                .order_by(MetricRollup.group, MetricRollup.name)
            )
            out: dict[str, list[str]] = {}
            for group, name in rows:
                out.setdefault(group, []).append(name)
            return out

    def experiment_metric_names(self, experiment_id: int) -> list[tuple[str, str]]:
        """(group, name) of every metric some trial of the experiment has reported."""
        with self.read() as s:
            rows = s.execute(
                select(MetricRollup.group, MetricRollup.name)
                .join(Trial, Trial.id == MetricRollup.trial_id)
                .where(Trial.experiment_id == experiment_id, MetricRollup.level == 1)
                .distinct()
                .order_by(MetricRollup.group, MetricRollup.name)
            )
            return [(str(group), str(name)) for group, name in rows]


def flatten_reports(reports: Sequence[MetricReport]) -> tuple[list[Row], set[str]]:
    """Check a batch of reports and flatten it to rows (NaN becomes None); and the names
    in it."""
    rows: dict[tuple[int, str], float | None] = {}
    checked: set[str] = set()
    for report in reports:
        batches = report.total_batches
        if (
            isinstance(batches, bool)
            or not isinstance(batches, int)
            or not 0 <= batches <= MAX_BATCHES
        ):
            raise InvalidArgumentError(
                f"total_batches must be an integer from 0 to {MAX_BATCHES}: {batches!r}"
            )
        for name, raw in report.values.items():
            if name not in checked:
                if not isinstance(name, str) or not name or len(name) > MAX_NAME_LEN:
                    raise InvalidArgumentError(
                        f"metric names must be 1-{MAX_NAME_LEN} characters: {name!r}"
                    )
                problem = name_problem(name)
                if problem is not None:
                    raise InvalidArgumentError(f"metric name {name!r} {problem}")
                checked.add(name)
            if type(raw) is float:
                value: float | None = None if raw != raw else raw  # NaN != NaN
            else:
                value = _value(name, raw)
            key = (batches, name)
            if key in rows and not _same(rows[key], value):
                raise ConflictError(
                    f"metric {name!r} at batch {batches} is reported twice with different "
                    "values in one request"
                )
            rows[key] = value
    return [(b, n, v) for (b, n), v in rows.items()], checked


def _value(name: str, raw: Any) -> float | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise InvalidArgumentError(f"metric {name!r} must be a number, got {raw!r}")
    try:
        value = float(raw)
    except OverflowError:
        raise InvalidArgumentError(f"metric {name!r} is too large for a float: {raw!r}") from None
    return None if math.isnan(value) else value


def _same(a: float | None, b: float | None) -> bool:
    return a == b or (a is None and b is None)


def check_group(group: str) -> None:
    if not group or len(group) > MAX_GROUP_LEN:
        raise InvalidArgumentError(f"metric group must be 1-{MAX_GROUP_LEN} characters: {group!r}")
    problem = name_problem(group)
    if problem is not None:
        raise InvalidArgumentError(f"metric group {group!r} {problem}")


def best_value(rows: Sequence[Row], metric: str, smaller_is_better: bool) -> float | None:
    """The best finite value of `metric` among `rows`, or None."""
    values = [v for _, name, v in rows if name == metric and v is not None and math.isfinite(v)]
    if not values:
        return None
    return min(values) if smaller_is_better else max(values)


def check_run(session: Session, trial_id: int, run_id: int) -> None:
    """Fence: only the trial's current run may write. Locks the trial's row."""
    # FOR NO KEY UPDATE (PostgreSQL): a restart that moves the trial to a new run waits
    # for this transaction, so a report that passed the fence is superseded, never left
    # live; and reports of one trial take turns at raising its progress. (The metric
    # rows' foreign keys take KEY SHARE locks, which do not wait for it.)
    current = session.execute(
        select(Trial.run_id).where(Trial.id == trial_id).with_for_update(key_share=True)
    ).scalar()
    if current is None:
        raise NotFoundError(f"trial {trial_id} does not exist")
    if run_id < current:
        raise StaleRunError(
            f"trial {trial_id} is on run {current}; a report from run {run_id} comes from a "
            "process that was replaced and is refused"
        )
    if run_id > current:
        raise ConflictError(f"trial {trial_id} has no run {run_id} (current run: {current})")


def advance_trial(
    session: Session,
    trial_id: int,
    latest: int,
    best: float | None,
    smaller_is_better: bool,
) -> tuple[int, float | None]:
    """Raise the trial's total_batches to `latest` and move its best_validation to `best`
    where that is better (or where the stored one is missing or not finite); return both
    as they are now. Each is computed in the UPDATE itself, so it never goes back."""
    t = TRIALS.c
    values: dict[str, Any] = {
        "total_batches": case((t.total_batches < latest, latest), else_=t.total_batches)
    }
    if best is not None:
        # Not NULL, infinite or NaN (which PostgreSQL sorts above infinity).
        usable = and_(t.best_validation > -math.inf, t.best_validation < math.inf)
        better = t.best_validation > best if smaller_is_better else t.best_validation < best
        values["best_validation"] = case(
            (and_(usable, not_(better)), t.best_validation), else_=best
        )
    row = session.execute(
        update(TRIALS)
        .where(t.id == trial_id)
        .values(values)
        .returning(t.total_batches, t.best_validation)
    ).one()
    return int(row[0]), None if row[1] is None else float(row[1])


def insert_metrics(
    session: Session, trial_id: int, run_id: int, group: str, rows: Sequence[Row]
) -> int:
    """Insert the rows not already stored; identical re-sends are no-ops. Returns the count.

    The caller has checked the group and fenced the run (`check_run`).
    """
    if not rows:
        return 0
    # Most reports are new: insert them all under a savepoint, and compare with what is
    # stored only when the unique key says part of the report is already there.
    try:
        with session.begin_nested():
            _insert(session, trial_id, run_id, group, rows)
    except IntegrityError:
        pass
    else:
        merge_rollups(session, trial_id, group, rows)
        return len(rows)
    stored = _stored(session, trial_id, run_id, group, rows)
    new: list[Row] = []
    for batches, name, value in rows:
        key = (batches, name)
        if key not in stored:
            new.append((batches, name, value))
        elif not _same(stored[key], value):
            raise ConflictError(
                f"trial {trial_id} run {run_id} already reported {group} metric {name!r} at "
                f"batch {batches} as {stored[key]!r}; a different value ({value!r}) is refused"
            )
    if not new:
        return 0
    _insert(session, trial_id, run_id, group, new)
    merge_rollups(session, trial_id, group, new)
    return len(new)


_INSERT_COLUMNS = '(trial_id, run_id, "group", name, total_batches, value, superseded)'


def _insert(session: Session, trial_id: int, run_id: int, group: str, rows: Sequence[Row]) -> None:
    # Straight to the driver's executemany: per-row parameter processing in SQLAlchemy
    # costs more than the insert itself for thousands of rows of plain numbers.
    connection = session.connection()
    mark = "?" if connection.dialect.paramstyle == "qmark" else "%s"
    marks = ", ".join([mark] * 7)
    connection.exec_driver_sql(
        f"INSERT INTO metrics {_INSERT_COLUMNS} VALUES ({marks})",
        [(trial_id, run_id, group, name, batches, value, False) for batches, name, value in rows],
    )


def _stored(
    session: Session, trial_id: int, run_id: int, group: str, rows: Sequence[Row]
) -> dict[tuple[int, str], float | None]:
    names = sorted({name for _, name, _ in rows})
    lo = min(b for b, _, _ in rows)
    hi = max(b for b, _, _ in rows)
    found = session.execute(
        select(Metric.total_batches, Metric.name, Metric.value).where(
            Metric.trial_id == trial_id,
            Metric.group == group,
            Metric.name.in_(names),
            Metric.total_batches.between(lo, hi),
            Metric.run_id == run_id,
        )
    )
    return {(b, n): v for b, n, v in found}


__all__ = ["MetricQueries"]
