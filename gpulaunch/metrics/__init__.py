"""The job's state for Prometheus (`start --metrics-listen`, `--metrics-textfile`).

- `observer.py`: the watcher's observer that keeps the job's state for both outputs;
- `series.py`: the job as metric families (pure; docs/metrics.md lists them);
- `usage.py`: what each live rank uses now, read at every scrape;
- `exposition.py`: the families as OpenMetrics and Prometheus text;
- `server.py`: the HTTP endpoint on the watcher's loop; `textfile.py`: node_exporter's file;
- `options.py`: `--metrics-listen/--metrics-textfile/--metrics-interval`.
"""
