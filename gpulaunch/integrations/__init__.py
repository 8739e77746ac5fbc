"""gpulaunch inside other frameworks' launch models (Lightning's `strategy="gpulaunch"`).

`relaunch.py` is pure and light (no torch): which role the process a user started
has, and the `gpulaunch start` command line it becomes. `lightning.py` imports
Lightning (and so torch); only a training script that asks for the strategy
imports it, never gpulaunch itself; `progress.py` is its callback that reports
steps, `teardown.py` a rank's end without a hang in gloo's teardown.
"""
