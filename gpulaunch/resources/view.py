"""The resources table: `gpulaunch top` (live, redrawn in place by rich) and
`gpulaunch status JOB --resources` (printed once).

A column this machine cannot fill (no memory controller, no NVML) is left out
and one line under the table says why, instead of a column of zeros.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpulaunch.model import format_bytes, format_duration
from gpulaunch.resources.sample import COLUMNS, JobSample, RankSample


def _bytes(n: int | None) -> str:
    return "-" if n is None else format_bytes(n)


def _percent(p: float | int | None) -> str:
    return "-" if p is None else f"{p:.0f}%"


def _seconds(s: float | None) -> str:
    return "-" if s is None else format_duration(s)


def _ago(s: float | None) -> str:
    return "-" if s is None else f"{s:.0f}s ago"


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


def table(title: str, sample: JobSample) -> Table:
    columns = _columns(sample)
    out = Table(title=title, title_justify="left", box=None, pad_edge=False)
    for _, header, _cell in columns:
        out.add_column(header, justify="left" if header in ("rank", "state") else "right")
    for r in sample.ranks:
        out.add_row(*(cell(r) for _, _, cell in columns))
    out.add_row(*(cell(sample.total) for _, _, cell in columns), style="bold")
    return out


def render(jobs: Sequence[tuple[str, JobSample]], footer: str = "") -> RenderableType:
    """Every job's table, then the notes (once, for all of them)."""
    parts: list[RenderableType] = [table(title, sample) for title, sample in jobs]
    seen: list[str] = []
    for _, sample in jobs:
        seen += [n for n in notes(sample) if n not in seen]
    parts += [Text(n, style="dim") for n in seen]
    if footer:
        parts.append(Text(footer, style="dim"))
    return Group(*parts)


def print_table(sample: JobSample, title: str = "") -> None:
    """The table once, on stdout (`gpulaunch status --resources`)."""
    from rich.console import Console

    Console(highlight=False).print(render([(title, sample)]))
