"""The watcher: the process that runs one job, and what happens to its ranks.

- `loop.py`: the single-threaded event loop (start gate, exits, gang stop, report), on
  `eventloop.py`, asyncio's loop driven from synchronous code;
- `forkrank.py`: forking one rank and its log pump, held at their gates; `ranks.py`:
  the live record of one rank;
- `outcome.py`: the job's report from the ranks' exits; `final.py`: what a rank used,
  and whether the OOM killer ended it; `origin.py`: which rank a failure began in;
  `settle.py`: how long the ranks' output settles before the gang stop;
- `errorfile.py`, `errorwatch.py`: the ranks' torchelastic error files, and the moment
  one is written;
- `limits.py`: the open-file and process limits a job must fit;
- `notices.py`: SIGUSR1/SIGUSR2 passed on to the ranks;
- `hangwatch.py`: --hang-timeout and --dump-stacks in the loop;
- `drops.py`: what the report says of rank output lost on its way (log-file gaps,
  journal drops);
- `rounds.py`: the watcher's side of the other nodes' rounds;
- `unmanaged.py`: ranks whose manager is gone, ended by the watcher itself;
- `keep.py`: the direct supervisor's keeper, seen from `gpulaunch start`;
- `launcher.py`: whether a SIGTERM to the watcher is its launcher's death (keeper, front
  end);
- `terminal.py`: the stdin rank's input (`--stdin-rank`), Ctrl-C passed on as SIGINT.

How the ranks are contained is not decided here: see `gpulaunch.supervisor`. What a job
has besides its ranks plugs in as a part: see `gpulaunch.parts`.
"""
