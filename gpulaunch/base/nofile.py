"""Raising the watcher's soft RLIMIT_NOFILE, and giving each child the user's back.

Apart from watcher/limits.py (which says how much a job needs) so that
base/procs.py, which restores the limit in every child, imports nothing else.
"""

from __future__ import annotations

import resource

# The soft RLIMIT_NOFILE gpulaunch was started with, once raise_nofile() raised it.
_user_nofile: int | None = None


def raise_nofile(needed: int) -> None:
    """Raise this process's soft RLIMIT_NOFILE to the hard limit if `needed` is above it.

    Remembers the soft limit the user had, for `restore_user_nofile` in each child.
    """
    global _user_nofile
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if needed <= soft or soft == hard:
        return
    if _user_nofile is None:
        _user_nofile = soft
    # A hard limit of "unlimited" cannot be a soft one (fs.nr_open caps it): take what is needed.
    new = needed if hard == resource.RLIM_INFINITY else hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))


def restore_user_nofile() -> None:  # pragma: no cover - in a forked child
    """In a rank or pump, before it runs: the soft limit the user started gpulaunch with.

    Call it only once the child's fds are in place: F_DUPFD fails for numbers
    at or above the soft limit, and the watcher's fds may be numbered there.
    """
    if _user_nofile is not None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (_user_nofile, hard))
