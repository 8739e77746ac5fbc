"""Whether a template file may be trusted: nobody but the invoking user and root can change it.

A unit template decides how a job's processes are contained and stopped, and it is code
(jinja2, sandboxed: see `gpulaunch.units.templates`). So gpulaunch reads a template only
from a path that no one else can change, the way ssh treats its keys and
`authorized_keys` (`StrictModes`, `secure_filename()` in OpenSSH's `misc.c`):

- the file and every directory above it, up to `/`, must be owned by the invoking user
  (the effective uid) or by root;
- none of them may be writable by the group or by others, except a directory with the
  sticky bit (`/tmp`): there nobody can rename or replace an entry they do not own, and the
  entry itself is checked as the next component;
- both the path as written (each symlink on the way must be owned by the user or root) and
  the path the symlinks lead to are checked.

Mode bits are what is read; on a file with POSIX ACLs the group bits are the ACL mask, so a
named user or group with write access shows as group-writable and is refused too. The
built-in templates are not checked: they are part of the installed code, trusted like it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpulaunch.errors import TemplateError

_HINT = (
    "templates decide how a job is contained and stopped, so only you and root may be able "
    "to change them and the directories above them"
)


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def _problem(path: Path, st: os.stat_result, uid: int) -> str | None:
    """Why `path` (its lstat is `st`) lets someone other than `uid` and root change it."""
    if st.st_uid not in (uid, 0):
        return (
            f"{path} is owned by {_owner(st.st_uid)}, not by you or root; "
            f"use a directory of your own, or chown {path}"
        )
    if stat.S_ISLNK(st.st_mode):
        return None  # a symlink's own mode means nothing; its target is checked on its own
    if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX:
        return None
    writable = [
        who for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if st.st_mode & bit
    ]
    if writable:
        return (
            f"{path} is writable by {' and '.join(writable)} "
            f"(mode {stat.S_IMODE(st.st_mode):04o}); run chmod go-w {path}"
        )
    return None


def _check_chain(path: Path, uid: int, what: str) -> None:
    """`path` and each directory above it, as written (no symlink resolved)."""
    for component in (path, *path.parents):
        problem = _problem(component, os.lstat(component), uid)
        if problem is not None:
            raise TemplateError(f"refusing {what}: {problem}", _HINT)


def check_trusted(path: Path, uid: int, what: str | None = None) -> None:
    """Raise `TemplateError` unless nobody but `uid` and root can change `path`.

    `what` names the refused thing in the message (default: the path). `path` must exist
    (FileNotFoundError otherwise). Checks the path as written and the path its symlinks
    lead to.
    """
    what = what or str(path)
    written = Path(os.path.abspath(path))
    _check_chain(written, uid, what)
    real = Path(os.path.realpath(written))
    if real != written:
        _check_chain(real, uid, what)


def read_trusted(path: Path, uid: int) -> str:
    """The text of the file `path` after `check_trusted`, re-checked on the open file itself.

    The directories above it were checked, so nobody else can swap the file between the
    check and the open; the fstat makes sure of the file that was really read.
    """
    check_trusted(path, uid)
    try:
        fd = os.open(os.path.realpath(path), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        with open(fd, encoding="utf-8") as file:
            problem = _problem(path, os.fstat(file.fileno()), uid)
            if problem is not None:
                raise TemplateError(f"refusing {path}: {problem}", _HINT)
            return file.read()
    except UnicodeDecodeError as exc:
        raise TemplateError(f"{path}: not UTF-8 text ({exc.reason})", "save it as UTF-8") from None
    except OSError as exc:
        raise TemplateError(
            f"cannot read template {path}: {exc.strerror}", "check its permissions"
        ) from None
