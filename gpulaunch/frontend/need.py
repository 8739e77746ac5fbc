"""Whether `gpulaunch start` needs the front end: can the chosen manager adopt us?"""

from __future__ import annotations

import os
from pathlib import Path

from gpulaunch.base.cgroup import unified_path
from gpulaunch.model import Manager


def own_cgroup(proc_cgroup: Path = Path("/proc/self/cgroup")) -> str | None:
    """This process's cgroup v2 path (`0::/...`), or None where there is none."""
    try:
        return unified_path(proc_cgroup.read_text())
    except OSError:
        return None


def adoptable(cgroup: str, uid: int) -> bool:
    """Whether uid's user manager may move a process out of `cgroup`.

    cgroup v2 lets a writer move a process only with write access to
    `cgroup.procs` of the common ancestor of source and destination; the user
    manager owns exactly its own tree, `.../user@UID.service/` (systemd always
    runs it as that unit).
    """
    return f"/user@{uid}.service/" in cgroup + "/"


def needs_frontend(manager: Manager, uid: int | None = None, cgroup: str | None = None) -> bool:
    """True for an ordinary user's job under their user manager, started from outside its tree.

    Root's managers can move any process; a cgroup we cannot read (no cgroup v2)
    keeps today's way (the watcher adopts itself).
    """
    uid = os.geteuid() if uid is None else uid
    if manager is not Manager.USER or uid == 0:
        return False
    cgroup = own_cgroup() if cgroup is None else cgroup
    return cgroup is not None and not adoptable(cgroup, uid)
