"""Seeing inside a running job: the ranks' stacks (py-spy) and the hang detector.

- `command.py`: `gpulaunch stacks JOB`; `stacks.py`: a rank's Python stacks, with py-spy;
- `hang.py`: the hang detector's pure decisions (--hang-timeout);
- `options.py`: `start --hang-timeout/--dump-stacks`.
"""
