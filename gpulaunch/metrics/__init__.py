"""The job's state for Prometheus (`start --metrics-listen`, `--metrics-textfile`)."""
