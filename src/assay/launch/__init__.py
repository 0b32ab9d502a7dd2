"""Launchers for script entrypoints: `python3 -m assay.launch.torch_distributed ...`."""
