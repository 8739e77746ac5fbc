"""Recovery: which failures restart the gang, when restarting is pointless, and preemption.

- `classes.py`, `failure.py`: what kind of failure ended an attempt (exit code, signal, OOM
  kill, hang, another node), the words of `--restart-on`; the one home of that
  classification, another node's ranks included (gpulaunch/multinode/rounds.py asks it);
- `progress.py`: whether an attempt made progress before it failed (one function);
- `policy.py`: the decision after a failed attempt (restart, or end now and why);
- `preempt.py`: a notice that the machine goes away (`--preempt-grace`);
- `requeue.py`: Slurm's requeues: `--max-requeues` ("requeue me", 81) and what a run
  carries to the next (attempts, the crash-loop state);
- `tracker.py`: the watcher's record of its attempts, the one object it calls;
- `settings.py`: what was asked, and the defaults; `options.py`: their command line.

Logic over model's types: no processes, no systemd (one file: a preemption's deadline,
in the job's own run directory). The watcher acts on what it decides
(gpulaunch/watcher/loop.py); docs/recovery.md has the user's side.
"""
