"""The few Linux calls Python's standard library lacks: prctl(2) and inotify(7).

Through ctypes on the C library already loaded into the process; each call
raises OSError with the C library's errno when it fails.
"""

from __future__ import annotations

import ctypes
import os
import struct

PR_SET_PDEATHSIG = 1  # prctl(2): a signal for us when our parent thread dies
PR_SET_CHILD_SUBREAPER = 36  # prctl(2): orphans of our descendants become our children

IN_MODIFY = 0x00000002  # inotify(7)
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_Q_OVERFLOW = 0x00004000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return result


def set_parent_death_signal(signum: int) -> None:
    """Have the kernel send `signum` to us when the thread that forked us dies (0: never)."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


def become_subreaper() -> None:
    """Orphaned descendants (a daemonised grandchild) are re-parented to us, not to init."""
    _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(PR_SET_CHILD_SUBREAPER)")


def inotify_init() -> int:
    """A non-blocking, close-on-exec inotify fd."""
    return _check(_libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC), "inotify_init1")


def inotify_watch(fd: int, path: str | os.PathLike[str], mask: int = IN_MODIFY) -> int:
    """Watch `path`; returns the watch descriptor that its events carry."""
    wd = _libc.inotify_add_watch(fd, os.fsencode(path), ctypes.c_uint32(mask))
    return _check(wd, f"inotify {os.fspath(path)}")


def inotify_read(fd: int) -> list[tuple[int, int, bytes]]:
    """Every event waiting on `fd` as (watch descriptor, mask, name); none: []."""
    out: list[tuple[int, int, bytes]] = []
    while True:
        try:
            data = os.read(fd, 64 * 1024)
        except BlockingIOError:
            return out
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            name = data[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
            out.append((wd, mask, name))
            offset += _EVENT.size + length


def inotify_events(fd: int) -> list[int]:
    """The watch descriptors of the events waiting on `fd` (none: an empty list)."""
    return [wd for wd, _mask, _name in inotify_read(fd)]


PR_GET_CHILD_SUBREAPER = 37


def set_subreaper(on: bool) -> bool:
    """Be a child subreaper or not; returns whether we were one before."""
    was = ctypes.c_int(0)
    _check(
        _libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0),
        "prctl(PR_GET_CHILD_SUBREAPER)",
    )
    _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0), "prctl(PR_SET_CHILD_SUBREAPER)")
    return bool(was.value)
