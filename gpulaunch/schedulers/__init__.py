"""What the cluster's tools read from a job (docs/environments.md, "What schedulers read").

- `termination.py`: Kubernetes' termination message: how the job ended, in 4 KiB;
- `jobmap.py`: DCGM's job map: one file per GPU naming the jobs on it (also a script, for
  the anchor's `ExecStopPost=` after a watcher's SIGKILL);
- `slurm.py`: why Slurm sent SIGTERM (a requeue, a cancel, the time limit), from its
  controller, and the part that makes the report say so;
- `observers.py`: both as parts of the job (gpulaunch/parts.py), and what the keeper
  does for them once the watcher is gone;
- `options.py`: `--termination-log`, `--gpu-job-map`.
"""
