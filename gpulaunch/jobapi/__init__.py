"""The job API: a job seen from outside its watcher (docs/dbus.md, docs/architecture.md).

- `publisher.py`: the watcher's side, the job published on D-Bus while it runs;
  `interface.py`: io.gpulaunch.Job1 as shipped; `bus.py`: connecting to its bus;
- `record.py`: the durable journal entry written when it ends, and reading it back;
  `filerecord.py`: the same record as a file, where no journal or bus keeps it;
- `view.py`: `JobView`, the one shape of a job that every client shows, with
  `rankview.py` (one rank), `stepview.py` (the ranks' steps) and `wire.py` (its nodes and
  goodput as D-Bus tuples);
- `client.py`: finding jobs (bus or record) and talking to a live one;
  `whose.py`: whose jobs a command is about; `procid.py`: which process a pid meant;
- `commands.py`: `gpulaunch list | status | stop | wait`; `top.py`: `gpulaunch top`,
  with `targets.py`, the ranks it measures;
- `earlier.py`: a requeued Slurm job's last run, as its record left it (recovery/requeue.py);
- `leftovers.py`: what a direct job left in its cgroup when its watcher and keeper died
  together, ended by the next command that reads its record.

Nothing here but `publisher` and `record`'s writer runs inside the watcher, and no
module here imports the watcher or pystemd.
"""
