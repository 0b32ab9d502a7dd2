"""The `assay` command line."""
