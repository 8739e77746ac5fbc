"""The sentinel: what ends a direct job's cgroup when its watcher and its keeper die together.

The keeper outlives a watcher that dies (supervisor/keeper.py), but `pkill -9 -f gpulaunch`
kills both at once: the ranks die by PR_SET_PDEATHSIG, and what they started would run on.
The kernel's way to end every process of a cgroup is one write, `cgroup.kill`; what must
do that write is a process that neither death takes along:

- `sh`, not Python, and not a process of ours by its command line: `pkill -f gpulaunch`
  matches none of its words (the job's cgroup comes on its stdin, not in its argv);
- in a session of its own (setsid): the terminal's ^C and hangup are the job's, not its;
- it waits on a pipe whose write end only the keeper and the watcher (and the watcher's
  forked log pumps, which die with it) hold: its end of file is the death of all of them.

The watcher writes the job's cgroup once it made it (KeeperLink.tell); at end of file the
sentinel writes `cgroup.kill` there, once the job's `watcher` cgroup is empty (neither keeper
nor watcher in it: no job of the same id that started since), then removes the cgroups
(bounded: 5 s). It waits for that emptiness (bounded: 2 s): the pipe ends as the last of
them closes its files, which the kernel does before it takes that process out of its cgroup
(do_exit: exit_files, then cgroup_exit), so the first look may still see it there (the
soak's direct-pkill kind found it). A keeper that ends normally kills it first (it is the
keeper's child), after having cleaned up itself. Where the job has no cgroup (process
groups) it reads no line and exits. Whatever is left (a sentinel killed too) is ended by
the next command that reads the job's record (jobapi/leftovers.py).
"""

from __future__ import annotations

import contextlib
import os

SCRIPT = (
    "read -r G || exit 0; while read -r _; do :; done; "
    'i=0; until grep -qx "populated 0" "$G/watcher/cgroup.events"; do '
    "[ $i -lt 40 ] || exit 0; sleep 0.05; i=$((i+1)); done; "
    'echo 1 > "$G/cgroup.kill"; i=0; '
    'while [ $i -lt 50 ]; do rmdir "$G"/*/ "$G" && exit 0; sleep 0.1; i=$((i+1)); done'
)


def spawn_sentinel(read_end: int) -> None:
    """Start the sentinel on `read_end` (a pipe's, closed here either way); where it cannot
    be started (no /bin/sh) the next command's sweep is the only way, and the watcher's
    line to it fails quietly (EPIPE: Python ignores SIGPIPE)."""
    try:
        os.posix_spawn(
            "/bin/sh",
            ["sh", "-c", SCRIPT],
            {"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
            file_actions=[
                (os.POSIX_SPAWN_DUP2, read_end, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
            ],
            setsid=True,
        )
    except OSError:
        pass
    finally:
        os.close(read_end)


def tell_sentinel(fd: int, cgroup: str) -> None:
    """The job's cgroup, for the sentinel (one line; never blocks, never fails the job)."""
    if fd >= 0 and "\n" not in cgroup:
        with contextlib.suppress(OSError):
            os.write(fd, cgroup.encode() + b"\n")
