"""Where the progress channel's socket is bound: a private directory of the job's user.

An abstract socket name is reachable by every process of the network namespace (they
are listed in /proc/net/unix): another user could keep its queue full, costing the
watcher a recvmsg each and making the ranks' datagrams find no room (issue 35). So the
socket is a file, `<runtime>/gpulaunch/progress.XXXXXXXX/notify`, in a directory of the
watcher's user with mode 0700: connecting to or sending to a socket file needs search
permission on its directory (unix(7)), so only the job's own user (whose processes the
ranks are) and root can reach it. The queue and the watcher's time are the job's alone.

`<runtime>` is the error files' (watcher/errorfile.py: /run for root's jobs,
$XDG_RUNTIME_DIR for a user's). Where that path would not fit a socket address (108
bytes, unix(7)), or is not a directory of ours, a private directory of ours in the
temporary directory (`<tmp>/gpulaunch-<uid>`, 0700) holds it. The directory is removed
when the channel closes; it carries the watcher's identity like a job's error-file
directory (the same `watcher` marker), so one a SIGKILLed watcher left is removed by the
next job's start (errorfile.prune_dead).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import tempfile
from pathlib import Path

from gpulaunch.jobapi.procid import Identity

SOCKET_NAME = "notify"
MARKER = "watcher"  # errorfile.MARKER: whose directory it is, for prune_dead
MAX_PATH = 107  # sun_path is 108 bytes with its terminating NUL (unix(7))


def _ours(path: Path, make: bool, mode: int) -> bool:
    """`path` is a directory of ours (made where missing), not a link, not writable by
    others."""
    if make:
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=mode)
    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _candidates(base: Path | None) -> list[Path]:
    out = []
    if base is not None:
        out.append(base / "gpulaunch")
    out.append(Path(tempfile.gettempdir()) / f"gpulaunch-{os.geteuid()}")
    return out


class SocketDir:
    """A private directory holding the channel's bound socket; `close` removes both."""

    def __init__(self, sock: socket.socket, base: Path | None) -> None:
        self.path: Path | None = None
        for parent in _candidates(base):
            try:
                made = _ours(parent, make=True, mode=0o755 if parent.name == "gpulaunch" else 0o700)
            except OSError:
                continue
            if (
                not made
                or len(str(parent)) + len("/progress.XXXXXXXX/") + len(SOCKET_NAME) > MAX_PATH
            ):
                continue
            try:
                private = Path(tempfile.mkdtemp(prefix="progress.", dir=parent))  # 0700
            except OSError:
                continue
            self.path = private
            break
        if self.path is None:
            raise OSError("no private directory for the progress socket")
        try:
            me = Identity.of(os.getpid())
            if me is not None:
                fd = os.open(self.path / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as out:
                    json.dump(me.to_json(), out)
            sock.bind(str(self.path / SOCKET_NAME))
        except BaseException:
            self.close()
            raise

    @property
    def address(self) -> str:
        assert self.path is not None
        return str(self.path / SOCKET_NAME)

    def close(self) -> None:
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None
