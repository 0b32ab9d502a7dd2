"""The Assay agent daemon (`assay-agent`): devices, the master connection, harness launches."""
