"""Whose jobs a job command is about: the caller's, or, for root, an ordinary user's.

`gpulaunch list | status | stop | wait | signal | top --user-of USER` (root only)
reach USER's jobs as `systemctl --user -M USER@` reaches their manager: on
USER's session bus, `/run/user/UID/bus`, and their records in the journal
(`_UID=UID`). A session bus admits only its own user, root included (dbus-daemon
checks the peer's uid, not only what it claims), so root connects with that
user's effective uid for the connect() alone and says so in the EXTERNAL
authentication; the watcher then sees USER as the caller of `Stop()`, its owner.
Nothing else of the user is trusted: no path of theirs is opened as root (the
socket is reached with their uid), no pid they could name is signalled.

Set once, by cli.main, before a command runs (`act_for`).
"""

from __future__ import annotations

import glob
import os
import pwd
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpulaunch.errors import UsageError

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class OtherUser:
    """The ordinary user whose jobs root asked about."""

    name: str
    uid: int

    @property
    def bus_address(self) -> str:
        return f"unix:path=/run/user/{self.uid}/bus"


_other: OtherUser | None = None


def resolve(who: str) -> OtherUser:
    """`--user-of` given as a name or a uid; only root may act for another user."""
    if os.geteuid() != 0:
        raise UsageError(
            "--user-of is for root: it reaches another user's jobs",
            "your own jobs need no option (--user is the default for you)",
        )
    try:
        entry = pwd.getpwuid(int(who)) if who.isdigit() else pwd.getpwnam(who)
    except (KeyError, OverflowError, ValueError):
        raise UsageError(
            f"--user-of: no user {who!r} on this machine", "give a user name or uid"
        ) from None
    if entry.pw_uid == 0:
        raise UsageError(
            "--user-of root: root's jobs are on the system bus",
            "leave out --user-of (root's user manager: --user)",
        )
    return OtherUser(entry.pw_name, entry.pw_uid)


def act_for(user: OtherUser | None) -> None:
    """From now on, user-manager job commands are about `user`'s jobs (None: the caller's)."""
    global _other
    _other = user


def other() -> OtherUser | None:
    """The user root acts for (`--user-of`), or None."""
    return _other


@contextmanager
def connecting_as(user: OtherUser) -> Iterator[None]:
    """Root with `user`'s effective uid (and so file-system uid) while a socket connects."""
    os.seteuid(user.uid)
    try:
        yield
    finally:
        os.seteuid(0)


def owners_of(slice_name: str, root: Path = CGROUP_ROOT) -> list[str]:
    """The users whose user manager runs a job slice of this name (root's hint, from cgroupfs).

    The cgroup tree is the kernel's: what it says of a user's units cannot be planted.
    """
    pattern = str(root / "user.slice/user-*.slice/user@*.service/gpulaunch.slice")
    found = []
    for parent in sorted(glob.glob(pattern)):
        if (Path(parent) / slice_name).is_dir():
            uid = Path(parent).parent.name.removeprefix("user@").removesuffix(".service")
            try:
                found.append(pwd.getpwuid(int(uid)).pw_name)
            except (KeyError, ValueError):
                found.append(uid)
    return found


def users_with_jobs(root: Path = CGROUP_ROOT) -> list[str]:
    """The users whose user manager runs any gpulaunch job now (root's `list` says so)."""
    pattern = "user.slice/user-*.slice/user@*.service/gpulaunch.slice/gpulaunch-*.slice"
    names = set()
    for path in root.glob(pattern):
        uid = path.parent.parent.name.removeprefix("user@").removesuffix(".service")
        try:
            names.add(pwd.getpwuid(int(uid)).pw_name)
        except (KeyError, ValueError):
            names.add(uid)
    return sorted(names)


def user_of_hint(names: list[str]) -> str | None:
    """For root: the option that reaches a job that runs as these users, if any."""
    if not names:
        return None
    return " or ".join(f"--user-of {name}" for name in names)
