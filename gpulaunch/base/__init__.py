"""The vocabulary and process primitives every feature shares (the lowest layer but errors).

- `names.py`: job ids and the unit names derived from them;
- `protocol.py`: a node's place in a multi-node job, and what the nodes tell each other;
- `slurm.py`: "am I in a Slurm step", from the variables srun exports;
- `slurmruns.py`: what a Slurm job's run hands the next after a requeue (its record's);
- `procs.py`: forking a process held at a start gate, releasing it, reaping it by pidfd;
- `interrupts.py`: stop and notice signals as bytes on a socket an event loop watches;
- `nofile.py`: the open-file limit raised for the watcher, the user's given back to children;
- `cgroup.py`: a process's own cgroup (v2) as files: its processes and counters;
- `detach.py`: the `start --detach` fork protocol;
- `userbus.py`: finding the user's manager, on the user bus or its private socket;
- `journald.py`: one journal entry written with journald's native protocol;
- `nvml.py`: NVML started, or why not (the one place that imports pynvml);
- `argtext.py`: printable argument text where only UTF-8 will do;
- `stdin.py`: the terminal relayed to the rank that reads it (`--stdin-rank`).

Nothing here imports a feature folder (docs/architecture.md draws the layers;
`lint-imports` checks them).
"""
