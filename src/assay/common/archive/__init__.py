"""Model-directory archives: what `assay experiment create` uploads and agents extract.

`pack_model_dir` turns a directory into a deterministic gzip-compressed tar (sorted entries,
zeroed mtimes and owners), honouring a `.assayignore` file of gitignore-like patterns and
refusing anything over `MAX_MODEL_DEF_BYTES` as early as it can tell. `unpack_model_dir`
extracts such an archive after checking all of it: members that could write outside the
destination (absolute or `..` paths, links leading out, hard links, devices), more than
`MAX_MEMBERS` entries and more than `MAX_UNPACKED_BYTES` of files are refused before
anything is written. `check_model_archive` applies the same checks without extracting.

CLI, master and agent all use these functions, so the rules are the same everywhere. The
package owns three parts: `_rules` (the limits, `.assayignore`, the error), `_pack` and
`_unpack`; everything else imports from here.
"""

from assay.common.archive._pack import (
    CHECKPOINT_SUFFIXES,
    pack_model_dir,
    packed_checkpoint_warning,
)
from assay.common.archive._rules import (
    IGNORE_FILE,
    LOCAL_OUTPUT_MARKER,
    MAX_MODEL_DEF_BYTES,
    MAX_UNPACKED_BYTES,
    ModelDefinitionError,
    format_bytes,
    left_out,
    make_local_output_dir,
)
from assay.common.archive._unpack import (
    MAX_DEPTH,
    MAX_LINK_DEPTH,
    MAX_MEMBERS,
    MAX_NAME_BYTES,
    MAX_PATH_CHARS,
    check_model_archive,
    unpack_model_dir,
)

__all__ = [
    "CHECKPOINT_SUFFIXES",
    "IGNORE_FILE",
    "LOCAL_OUTPUT_MARKER",
    "MAX_DEPTH",
    "MAX_LINK_DEPTH",
    "MAX_MEMBERS",
    "MAX_MODEL_DEF_BYTES",
    "MAX_NAME_BYTES",
    "MAX_PATH_CHARS",
    "MAX_UNPACKED_BYTES",
    "ModelDefinitionError",
    "check_model_archive",
    "format_bytes",
    "left_out",
    "make_local_output_dir",
    "pack_model_dir",
    "packed_checkpoint_warning",
    "unpack_model_dir",
]
