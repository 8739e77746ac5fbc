"""torchelastic's error-file contract: where a rank's `@record` writes its traceback.

torch.distributed.elastic.multiprocessing.errors.record writes the exception of
a failing entry point as JSON to $TORCHELASTIC_ERROR_FILE. The watcher gives
each rank of each attempt its own file under a private run directory, reads
the cause rank's file for the report, and removes the directory at the end.

A watcher killed before its end cannot remove it: each directory holds a
`watcher` file naming its watcher (pid, start time, boot, pid namespace:
gpulaunch/jobapi/procid.py), and every start removes the directories whose watcher is
gone (`prune_dead`; the direct supervisor's keeper does so at once). Only our
own directories are touched, never through a link.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from gpulaunch.errors import UnavailableError
from gpulaunch.jobapi.procid import Identity
from gpulaunch.logs.excerpt import text_excerpt
from gpulaunch.logs.output import TRACEBACK
from gpulaunch.model import Manager
from gpulaunch.report import NO_TRACEBACK


def runtime_base(manager: Manager) -> Path:
    """/run for the system manager, $XDG_RUNTIME_DIR for a user, else a private tmp dir.

    The fallback is the user's own `<tmp>/gpulaunch-<uid>` (mode 0700, owned by us,
    not a link): a /tmp/gpulaunch made by another user is neither writable nor safe.
    """
    if manager is Manager.SYSTEM and os.geteuid() == 0:
        return Path("/run")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg) and os.access(xdg, os.W_OK):
        return Path(xdg)
    private = Path(tempfile.gettempdir()) / f"gpulaunch-{os.getuid()}"
    try:
        private.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = private.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise UnavailableError(
            f"{private} is not a private directory of yours (another user made it, or it is "
            "a link, or others may write it)",
            "set XDG_RUNTIME_DIR to a directory of your own, or remove that one",
        )
    return private


def runtime_dir(base: Path) -> Path:
    """`base`/gpulaunch, made if missing: a directory of ours we can write (not a link).

    Checked before anything starts (start.py), so that a bad one is one line, exit 69.
    """
    parent = base / "gpulaunch"
    try:
        parent.mkdir(mode=0o755)
    except FileExistsError:
        pass
    except OSError as exc:
        raise UnavailableError(f"cannot create {parent}: {exc.strerror}", _hint(parent)) from None
    problem = runtime_dir_problem(parent)
    if problem:
        raise UnavailableError(problem, _hint(parent))
    return parent


def _hint(parent: Path) -> str:
    return f"remove it (rm -r {parent}) or set XDG_RUNTIME_DIR to a directory of your own"


def runtime_dir_problem(parent: Path) -> str | None:
    """Why `parent` (<base>/gpulaunch) cannot hold our error files, or None (also `doctor`)."""
    try:
        st = parent.lstat()
    except FileNotFoundError:  # made when a job starts: its parent must take it
        if os.access(parent.parent, os.W_OK | os.X_OK):
            return None
        return f"cannot create {parent}: {parent.parent} is not writable"
    except OSError as exc:
        return f"{parent}: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{parent} is {'a symbolic link' if stat.S_ISLNK(st.st_mode) else 'not a directory'}"
    if st.st_uid != os.geteuid():
        return f"{parent} belongs to uid {st.st_uid}, not to you"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot write to {parent} (its mode is {st.st_mode & 0o7777:o})"
    return None


MARKER = "watcher"  # in each job's directory: whose it is


def prune_dead(parent: Path) -> int:
    """Remove our job directories in `parent` whose watcher is gone; how many.

    Only directories we own (lstat: no link followed), whose marker names a
    watcher of this boot and pid namespace that no longer runs; one without a
    marker (being made, or of another version) is left alone.
    """
    removed = 0
    try:
        names = os.listdir(parent)
    except OSError:
        return 0
    for name in names:
        path = parent / name
        try:
            st = path.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue
            fd = os.open(path / MARKER, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as f:
                owner = Identity.from_json(json.load(f))
        except (OSError, ValueError):
            continue
        if owner is None or not owner.here() or owner.alive():
            continue
        shutil.rmtree(path, ignore_errors=True)  # fd-based: no link below is followed
        removed += 1
    return removed


class ErrorFiles:
    """A private directory with one error-file path per attempt and rank."""

    def __init__(self, base: Path, component: str) -> None:
        parent = runtime_dir(base)
        prune_dead(parent)
        self.root = Path(tempfile.mkdtemp(prefix=f"{component[:100]}.", dir=parent))
        me = Identity.of(os.getpid())
        if me is not None:
            fd = os.open(self.root / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump(me.to_json(), out)

    def __enter__(self) -> ErrorFiles:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def path(self, attempt: int, rank: int) -> Path:
        """Like torchrun: .../attempt_<n>/<rank>/error.json (the directory exists)."""
        directory = self.root / f"attempt_{attempt}" / str(rank)
        directory.mkdir(parents=True, exist_ok=True)
        return directory / "error.json"

    def read(self, attempt: int, rank: int) -> str | None:
        return read_error_file(self.root / f"attempt_{attempt}" / str(rank) / "error.json")


def rank_error(
    errors: ErrorFiles | None, attempt: int, rank: int, stderr_tail: Callable[[int], str]
) -> tuple[str | None, str | None]:
    """The cause rank's own error: its @record traceback, else its last stderr lines."""
    from_file = errors.read(attempt, rank) if errors else None
    if from_file:
        return from_file, "its error file (@record)"
    tail = stderr_tail(rank)
    if tail and TRACEBACK.decode() not in tail:  # e.g. only a library's warning (issue 35)
        return tail, NO_TRACEBACK
    return (tail, "the last lines of its stderr") if tail else (None, None)


ERROR_FILE_MAX = 64 << 20  # a larger error file is not read (the stderr tail is shown instead)


def read_error_file(path: Path) -> str | None:
    """The traceback (or message) a rank's `@record` wrote, bounded (logs/excerpt.py), or None."""
    try:
        with path.open("rb") as file:
            raw = file.read(ERROR_FILE_MAX + 1)
        data = json.loads(raw) if len(raw) <= ERROR_FILE_MAX else None
    except (OSError, ValueError):
        return None
    text = _error_text(data)
    return text_excerpt(text) if text is not None else None


def _error_text(data: object) -> str | None:
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, str):
        return message.rstrip() or None
    if not isinstance(message, dict):
        return None
    extra = message.get("extraInfo")
    stack = extra.get("py_callstack") if isinstance(extra, dict) else None
    if isinstance(stack, str) and stack.strip():
        return stack.rstrip()
    text = message.get("message")
    return text.rstrip() if isinstance(text, str) and text.strip() else None
