"""The shared kernel: what the master, the agents and the CLI (and the harness) all use.

- `assay.common.archive`: packing, checking and extracting model-directory archives.
- `assay.common.storage`: checkpoint storage (shared_fs and S3).
- `assay.common.tls`: TLS between the master and its clients.
- `assay.common.settings`: the daemons' settings (file keys, ASSAY_* variables, flags).

It sits beside, not inside, the user's library (`Trial`, `assay.core`, `assay.config`):
the daemons depend on it, and a user's model never needs to. Importing a module here never
imports torch, and the modules are imported one by one (`import assay.common` loads none).
"""

__all__ = ["archive", "settings", "storage", "tls"]
