"""The master's decisions as pure code: experiment, trial, run and agent transitions.

Each transition is a function over plain data (`TrialStatus`, `ExperimentStatus`, the
core's state dataclasses) that returns effects; `Master` (`_core.py`) is the shell that
holds the lock, applies the effects to the write batch and the agents' outboxes, and
commits. `simulate.py` drives the shell through a seeded fake cluster and checks the
invariants at every step, as `searcher/simulate.py` does for search.
"""
