"""node_exporter's textfile collector: `DIR/gpulaunch-JOB.prom`, replaced whole each time
(written as `.gpulaunch-JOB.prom.tmp`, which the collector's `*.prom` never matches, then
renamed over it: a scrape never reads half a file), removed when the job ends, so that
a job gone is not shown as running for ever.

The directory is opened once and every name is used relative to it, with O_NOFOLLOW
and O_EXCL: a symlink or a file planted in it is never written through.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from gpulaunch.errors import UsageError


class TextFile:
    """One job's file in the collector's directory."""

    def __init__(self, directory: Path, component: str) -> None:
        self.directory = directory
        self.name = f"gpulaunch-{component}.prom"
        self._tmp = f".{self.name}.tmp"
        try:
            self._dir: int | None = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise UsageError(
                f"--metrics-textfile {directory}: {exc.strerror}",
                "name the directory node_exporter's --collector.textfile.directory reads",
            ) from None
        if not os.access(directory, os.W_OK):
            os.close(self._dir)
            raise UsageError(
                f"--metrics-textfile {directory}: not writable by this user",
                "name a directory this user may write, or run as its owner",
            )
        self.problem: str | None = None  # the last write's failure, said once

    @property
    def path(self) -> Path:
        return self.directory / self.name

    def write(self, text: str) -> str | None:
        """Replace the file with `text`; a new failure's text (said once), else None."""
        assert self._dir is not None
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp, dir_fd=self._dir)  # a leftover of a write cut short
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(self._tmp, flags, 0o644, dir_fd=self._dir)
            with open(fd, "wb") as f:  # closes fd; writes all of it
                f.write(text.encode())
            os.replace(self._tmp, self.name, src_dir_fd=self._dir, dst_dir_fd=self._dir)
        except OSError as exc:
            problem = f"could not write {self.path}: {exc.strerror}"
            new = problem != self.problem
            self.problem = problem
            return problem if new else None
        self.problem = None
        return None

    def remove(self) -> None:
        if self._dir is None:
            return
        for name in (self.name, self._tmp):
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self._dir)
        os.close(self._dir)
        self._dir = None
