"""The job API: a job seen from outside its watcher (docs/dbus.md, docs/architecture.md).

- `publisher`: the watcher's side, the job published on D-Bus while it runs;
- `record`: the durable journal entry written when it ends, and reading it back;
- `view`: `JobView`, the one shape of a job that every client shows;
- `client`: finding jobs (bus or record) and talking to a live one;
- `commands`: `gpulaunch list | status | stop | wait`.
- `leftovers`: what a direct job left in its cgroup when its watcher and keeper died
  together, ended by the next command that reads its record.

Nothing here but `publisher` and `record`'s writer runs inside the watcher, and no
module here imports the watcher or pystemd.
"""
