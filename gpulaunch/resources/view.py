"""The resources table: `gpulaunch top` (live, redrawn in place) and
`gpulaunch status JOB --resources` (printed once).

A column this machine cannot fill (no memory controller, no NVML) is left out
and one line under the table says why, instead of a column of zeros.

Plain text, no table library: gpulaunch once drew this with `rich`, and a
dependency installed into the user's environment changed the user's program
(Lightning picks its Rich progress bar over tqdm when `rich` can be imported;
issue 22, item 16).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpulaunch.model import format_bytes, format_duration
from gpulaunch.resources.sample import COLUMNS, JobSample, RankSample


def _bytes(n: int | None) -> str:
    return "-" if n is None else format_bytes(n)


def _percent(p: float | int | None) -> str:
    return "-" if p is None else f"{p:.0f}%"


def _seconds(s: float | None) -> str:
    return "-" if s is None else format_duration(s)


def _count(n: int | None) -> str:
    return "-" if n is None else str(n)


_Column = tuple[str, str, Callable[[RankSample], str]]  # key, header, cell


def _columns(sample: JobSample) -> list[_Column]:
    columns: list[_Column] = [
        ("", "rank", lambda r: "total" if r.rank is None else str(r.rank)),
        ("", "state", lambda r: r.state),
        ("", "CPU", lambda r: _percent(r.cpu_percent)),
        ("", "CPU time", lambda r: _seconds(r.cpu_sec)),
        ("", "RSS", lambda r: _bytes(r.rss)),
        ("pss", "PSS", lambda r: _bytes(r.pss)),
        ("cgroup_memory", "memory.current", lambda r: _bytes(r.cgroup_memory)),
        ("", "procs", lambda r: _count(r.processes)),
        ("", "threads", lambda r: _count(r.threads)),
        ("gpu", "GPU mem", lambda r: _bytes(r.gpu_memory)),
        ("gpu", "GPU util", lambda r: _percent(r.gpu_util)),
        (
            "idle_sec",
            "last output",
            lambda r: "-" if r.idle_sec is None else f"{r.idle_sec:.0f}s ago",
        ),
    ]
    # PSS stays when only some processes hid it: '-' then means "not readable".
    hidden = {k for k in sample.missing if k != "pss" or all(r.pss is None for r in sample.ranks)}
    return [c for c in columns if c[0] not in hidden]


def notes(sample: JobSample) -> list[str]:
    """One line per column this machine cannot fill, and why."""
    lines = [f"{COLUMNS[key]}: not available here: {why}" for key, why in sample.missing.items()]
    if sample.interval is None:
        lines.append("CPU %: measured from the next look on")
    return lines


def table(title: str, sample: JobSample) -> list[str]:
    """The title, a header, a row per rank and the total; numbers aligned right."""
    columns = _columns(sample)
    rows = [[header for _, header, _cell in columns]]
    rows += [[cell(r) for _, _, cell in columns] for r in [*sample.ranks, sample.total]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    left = {i for i, (_, header, _cell) in enumerate(columns) if header in ("rank", "state")}
    lines = [title] if title else []
    for row in rows:
        cells = [
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def render(jobs: Sequence[tuple[str, JobSample]], footer: str = "") -> str:
    """Every job's table, then the notes (once, for all of them)."""
    lines: list[str] = []
    for title, sample in jobs:
        lines += table(title, sample)
    seen: list[str] = []
    for _, sample in jobs:
        seen += [n for n in notes(sample) if n not in seen]
    lines += seen
    if footer:
        lines.append(footer)
    return "\n".join(lines)


def print_table(sample: JobSample, title: str = "") -> None:
    """The table once, on stdout (`gpulaunch status --resources`)."""
    print(render([(title, sample)]))
