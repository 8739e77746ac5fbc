"""The ranks' output: the per-rank pump, the terminal, the journal (`gpulaunch logs`), and a
detached job's spool where there is no journald."""
