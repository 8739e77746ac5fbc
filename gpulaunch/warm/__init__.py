"""Warm ranks (`--preload`, issue 36): each rank a fork of a process that imported torch.

A job started with `--preload MODULE,...` has, besides its watcher, one warm process per
node: a child of the watcher in the watcher's own containment (its scope, or cgroup),
started before the job's units are made, that imports torch and torch.distributed (where
the ranks' Python has them) and MODULE,..., never the user's script, and never
initializes CUDA. Each rank is then forked from it instead of starting a new interpreter,
held at its start gate as a cold rank is, contained, then released to run the script
exactly as `python -u SCRIPT ARGS` would. The warm process outlives a gang stop (it is not
in the ranks' slice), so a restart's ranks are forked from it too.

Modules: `fit.py` (pure: whether a rank may start warm: its command, its environment
against the warm process's), `process.py` (the launcher's side: starting the warm
process, asking it for a rank, the cold start's one line when it may not), and
`rankside/`, what runs in the warm process (the ranks' Python; it may import torch, the
launcher never imports it).
"""
