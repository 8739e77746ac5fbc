"""Recovery: which failures restart the gang, when restarting is pointless, and preemption.

- `classes`, `failure`: what kind of failure ended an attempt (exit code, signal, OOM kill, hang,
  another node), the words of `--restart-on`;
- `progress`: whether an attempt made progress before it failed (one function);
- `policy`: the decision after a failed attempt (restart, or end now and why);
- `preempt`: a notice that the machine goes away (`--preempt-grace`);
- `tracker`: the watcher's record of its attempts, the one object it calls;
- `settings`: what was asked, and the defaults; `options`: their command line.

Logic over model's types: no processes, no systemd (one file: a preemption's deadline,
in the job's own run directory). The watcher acts on what it decides
(gpulaunch/watcher/loop.py); docs/recovery.md has the user's side.
"""
