"""The Assay master daemon (`assay-master`): API servers, state machines, searchers, store."""
