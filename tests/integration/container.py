"""A container as Docker or Kubernetes makes one, without booting anything in it.

New pid, mount and cgroup namespaces; a fresh cgroup2 directory of the host's
(the way sdbox/box.py prepares a box) entered first, so that the container's
cgroup namespace is rooted there and its own /sys/fs/cgroup (a cgroup2 mount)
is writable (or, as Docker mounts it by default, read-only); a fresh /proc and
an empty /run: no systemd, no bus, no journald inside. `popen` starts a shell
script as the container's PID 1 (`exec gpulaunch ...` in it makes gpulaunch PID 1).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

from sdbox.box import cgroup2_root

INNER = (
    "mount -t proc proc /proc && mount -t cgroup2 -o {mode} none /sys/fs/cgroup && "
    'mount -t tmpfs none /run && exec sh -c "$0"'
)


class Container:
    """One container; `cgroup` is its cgroup as the host sees it."""

    def __init__(self, read_only: bool = False) -> None:
        self.cgroup = cgroup2_root() / f"gpulaunch-test-{uuid.uuid4().hex[:8]}"
        # Docker's default: /sys/fs/cgroup mounted read-only, no cgroup of ours to write.
        self.read_only = read_only

    def popen(self, script: str, **kwargs: object) -> subprocess.Popen[str]:
        """Run `script` (sh) as the container's PID 1."""
        argv = [
            *("sh", "-c", 'echo $$ >"$0" && exec "$@"', str(self.cgroup / "cgroup.procs")),
            *("unshare", "--mount", "--pid", "--cgroup", "--fork", "--kill-child"),
            *("--propagation", "private", "sh", "-c"),
            *(INNER.format(mode="ro" if self.read_only else "rw"), script),
        ]
        return subprocess.Popen(argv, text=True, **kwargs)  # type: ignore[call-overload,no-any-return]

    def run(self, script: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = self.popen(script, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out, _ = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, None)

    def leftovers(self) -> list[str]:
        """The cgroups a job left below the container's own (none when it cleaned up)."""
        return sorted(p.name for p in self.cgroup.iterdir() if p.is_dir())

    def controllers(self) -> set[str]:
        """What the host delegates to the container's cgroup."""
        return set((self.cgroup.parent / "cgroup.subtree_control").read_text().split())


@contextlib.contextmanager
def container(read_only: bool = False) -> Iterator[Container]:
    """A container's cgroup, removed (with whatever a test left in it) afterwards."""
    c = Container(read_only)
    c.cgroup.mkdir()
    try:
        yield c
    finally:
        for sub in sorted(c.cgroup.glob("**/"), key=lambda p: -len(p.parts)):
            if (sub / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    (sub / "cgroup.kill").write_text("1")
        for sub in sorted(c.cgroup.glob("**/"), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                os.rmdir(sub)


def alive_script(pid_dir: Path) -> str:
    """sh: print `ALIVE <name> <state>` for each recorded process that still exists; a zombie
    (state Z: ended, never reaped) is left behind too."""
    return (
        f'for f in {pid_dir}/*.pid; do p=$(cat "$f"); '
        's=$(cut -d" " -f3 /proc/$p/stat 2>/dev/null) && echo "ALIVE $f $s"; '
        "done; true"
    )


# What of a job is left in a container: its ranks, sleepers or gpulaunch processes.
LEFT = (
    "for d in /proc/[0-9]*; do c=$(tr '\\0' ' ' <$d/cmdline 2>/dev/null); "
    'case "$c" in "sh "*) ;; *rank.py*|*"sleep 300"*|*gpulaunch*) echo "LEFT ${d#/proc/} $c";; '
    "esac; done"
)  # (not the test's own shell, whose script names them all)
