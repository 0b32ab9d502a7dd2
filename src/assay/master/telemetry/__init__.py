"""What the master counts and keeps of its work: the counters of its hot paths
(`Telemetry`), usage accounting and reports (`usage`), each rank's latest utilisation,
trial logs, what a trial reports without the master's lock (`reports`), and a
multi-objective experiment's metric vectors. The Prometheus exporter is the public module
`prometheus`, imported only when metrics are on.
"""

from assay.master.telemetry import _trial_reports as reports
from assay.master.telemetry import _usage as usage
from assay.master.telemetry._master_logs import (
    SECRET_ARGS,
    MasterLogBuffer,
    stream_master_logs,
)
from assay.master.telemetry._multi_objective import (
    fill_pareto,
    objectives_of,
    pareto_points,
    validation_vector,
)
from assay.master.telemetry._rank_usage import RankUsageBoard
from assay.master.telemetry._telemetry import NO_TELEMETRY, Telemetry
from assay.master.telemetry._trial_logs import (
    FollowerLimit,
    LogKeeper,
    log_filter,
    stream_trial_logs,
)
from assay.master.telemetry._usage import pool_of

__all__ = [
    "FollowerLimit",
    "LogKeeper",
    "NO_TELEMETRY",
    "RankUsageBoard",
    "Telemetry",
    "fill_pareto",
    "objectives_of",
    "pareto_points",
    "pool_of",
    "reports",
    "log_filter",
    "MasterLogBuffer",
    "SECRET_ARGS",
    "stream_master_logs",
    "stream_trial_logs",
    "usage",
    "validation_vector",
]
