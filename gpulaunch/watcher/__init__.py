"""The watcher: the process that runs one job, and what happens to its ranks.

- `loop`: the single-threaded event loop (start gate, exits, gang stop, report);
- `procs`: forking a rank held at its gate, pidfds, reaping;
- `limits`: the open-file and process limits a job must fit;
- `nofile`: the watcher's raised soft limit on open files, the user's given back to ranks;
- `errorfile`: the ranks' torchelastic error files;
- `interrupts`: SIGINT/SIGTERM/SIGHUP as events on a wakeup fd;
- `detach`: `gpulaunch start --detach`;
- `terminal`: the stdin rank's input (`--stdin-rank`), Ctrl-C passed on as SIGINT.

How the ranks are contained is not decided here: see `gpulaunch.supervisor`.
"""
