"""The moment a rank's `@record` writes its error file: inotify on each rank's directory.

torch's `@record` writes the failing entry point's exception to
$TORCHELASTIC_ERROR_FILE and re-raises; the interpreter then prints the
traceback and tears down (torch, CUDA), which takes a second or more, during
which a rank it took down may fail and exit first. The moment of the write is
the failure's true time: the watcher notes it (`Rank.error_at`) and, if that
rank then fails by itself, takes its failure as of then. The file alone stops
nothing and blames nobody: a rank may catch the exception and exit 0, and any
rank can write a sibling's file (same uid). inotify(7): one fd on the
watcher's loop, no polling.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from gpulaunch.linux import (
    IN_CLOSE_WRITE,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    inotify_init,
    inotify_read,
    inotify_watch,
)
from gpulaunch.model import RankState
from gpulaunch.watcher.errorfile import ErrorFiles
from gpulaunch.watcher.ranks import Rank

FILE_NAME = "error.json"  # errorfile.ErrorFiles.path's name


class ErrorFileWatch:
    """Says which (attempt, rank) just wrote its error file."""

    def __init__(self) -> None:
        self.fd = inotify_init()
        self._keys: dict[int, tuple[int, int]] = {}

    def __enter__(self) -> ErrorFileWatch:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def fileno(self) -> int:
        return self.fd

    def add(self, directory: Path, attempt: int, rank: int) -> None:
        """Watch `directory` (the rank's own, before the rank runs) for its error file."""
        wd = inotify_watch(self.fd, directory, IN_CLOSE_WRITE | IN_MOVED_TO)
        self._keys[wd] = (attempt, rank)

    def read(self) -> list[tuple[int, int]]:
        """The (attempt, rank) pairs whose error file was written since the last read."""
        found: list[tuple[int, int]] = []
        for wd, mask, name in inotify_read(self.fd):
            if mask & IN_Q_OVERFLOW:  # events were lost: every watched rank might have written
                found += list(self._keys.values())
            elif name == FILE_NAME.encode() and wd in self._keys:
                found.append(self._keys[wd])
        return found

    def new_errors(self, files: ErrorFiles, ranks: Sequence[Rank], attempt: int) -> list[Rank]:
        """The running ranks of `attempt` that wrote their error file just now, for the first time.

        A file that does not parse (yet) is not an error: @record writes it whole, then closes.
        """
        found = []
        for written_attempt, index in self.read():
            rank = ranks[index]
            if (
                written_attempt == attempt
                and rank.state is RankState.RUNNING
                and not rank.stop_requested
                and rank.error_at is None
                and rank not in found
                and files.read(attempt, index) is not None
            ):
                found.append(rank)
        return found

    def note(self, files: ErrorFiles, ranks: Sequence[Rank], attempt: int, now: float) -> None:
        """Date the failure of each rank that wrote its error file just now (`error_at`).

        If that rank then fails by itself, its failure counts as of then: it is the cause
        even if a rank it took down exits first (the watcher's `_failed` waits for it)."""
        for rank in self.new_errors(files, ranks, attempt):
            rank.error_at = now

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def tearing_down(ranks: Sequence[Rank]) -> bool:
    """Whether a rank that wrote its error file still runs (most likely it tears down).

    One node only: with several, each node's first failure goes to the others at once,
    and every node must name the same cause (docs/multinode.md)."""
    return any(r.state.alive and r.error_at is not None for r in ranks)
