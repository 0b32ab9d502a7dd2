"""How an experiment comes in: a submission checked before anything is stored, the
archive uploads spooled to disk, each user's submission quota, `experiment continue`'s
config changes, how an experiment enters the master's memory (`intake`), and the
master's side of a custom search.
"""

from assay.master.submission import _intake as intake
from assay.master.submission._continue import continued_config, parse_overrides
from assay.master.submission._custom_search import (
    check_config_cap,
    events_response,
    operations_of,
    post_operations,
    searcher_events,
)
from assay.master.submission._quota import SubmissionQuota
from assay.master.submission._spool import Upload, UploadSpool
from assay.master.submission._submission import (
    PreparedExperiment,
    check_config,
    check_resource_pool,
    check_submission,
    new_record,
    new_searcher,
)

__all__ = [
    "PreparedExperiment",
    "SubmissionQuota",
    "Upload",
    "UploadSpool",
    "check_config",
    "check_config_cap",
    "check_resource_pool",
    "check_submission",
    "continued_config",
    "events_response",
    "intake",
    "new_record",
    "new_searcher",
    "operations_of",
    "parse_overrides",
    "post_operations",
    "searcher_events",
]
