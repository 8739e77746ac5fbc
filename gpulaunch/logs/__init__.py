"""The ranks' output: the per-rank pump, the terminal, the journal (`gpulaunch logs`)."""
