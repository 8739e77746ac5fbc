"""The width a rank's lines really have on the terminal: `COLUMNS` for the ranks.

A rank's stdout is a pipe (to its log pump), so Rich (Lightning's model summary)
takes its width from the first terminal among stdin, stdout and stderr, or from
`COLUMNS`; tqdm from `COLUMNS`. At the terminal's full width, the `[N] ` prefix
the watcher puts before each line wraps every line of a table (double-spaced
output). So ranks get `COLUMNS` = the width less the prefix (issue 22, item 16).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping


def prefix_width(world_size: int) -> int:
    """Columns of the prefix logs/output.py puts before a rank's line: `[N] `, N padded to
    the width of the highest rank."""
    return len(str(max(world_size - 1, 0))) + 3


def rank_columns(environ: Mapping[str, str], fds: Iterable[int], world_size: int) -> dict[str, str]:
    """`{"COLUMNS": ...}` for a rank of a job of `world_size`, or nothing when no width is known.

    The width is the user's `COLUMNS` if set, else that of the first of `fds` that
    is a terminal (the watcher's stdout, stderr, stdin: the order Rich looks in).
    """
    prefix = prefix_width(world_size)
    given = environ.get("COLUMNS", "")
    columns = int(given) if given.isdigit() else 0
    for fd in fds:
        if columns:
            break
        try:
            columns = os.get_terminal_size(fd).columns
        except OSError:
            continue
    if not columns:
        return {}
    return {"COLUMNS": str(max(columns - prefix, 1))}
