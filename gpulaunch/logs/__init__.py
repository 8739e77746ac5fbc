"""The ranks' output: the per-rank pump, the terminal, the journal (`gpulaunch logs`).

- `pump.py`: the log pump, one small process per rank in its scope; `feed.py`: which
  of its lines it hands journald, never at the cost of the rank's pace;
- `output.py`: the terminal, every rank's lines prefixed, the progress line, --log-dir;
  `terminal.py`: one output fd written without blocking; `width.py`: `COLUMNS` for ranks;
- `journal.py`: reading the journal back; `command.py`: `gpulaunch logs JOB`;
- `excerpt.py`: a bounded excerpt of a rank's error for the report.
"""
