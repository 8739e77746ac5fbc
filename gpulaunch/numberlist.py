"""Lists of numbers with ranges, "0,2,5-7": GPUs, CPUs and ranks are all given this way."""

from __future__ import annotations

import re

_PART = re.compile(r"([0-9]+)(?:-([0-9]+))?")


def parse_number_list(
    text: str, noun: str, *, skip_empty: bool = False, most: int | None = None
) -> list[int]:
    """`"0,2,5-7"` -> `[0, 2, 5, 6, 7]`, in the order given, repeats kept.

    Raises ValueError naming the part that is not a `noun` (e.g. "GPU number") or
    range, a range that is backwards, or a number above `most` (checked before a
    range is expanded). Empty parts are errors unless `skip_empty`.
    """
    out: list[int] = []
    for raw in text.split(","):
        part = raw.strip()
        if not part and skip_empty:
            continue
        m = _PART.fullmatch(part)
        if not m:
            raise ValueError(f"{part!r} is not a {noun} or range")
        lower = int(m.group(1))
        upper = int(m.group(2)) if m.group(2) is not None else lower
        if upper < lower:
            raise ValueError(f"range {part!r} is backwards")
        if most is not None and upper > most:
            raise ValueError(f"{noun} {upper} is too large (at most {most})")
        out.extend(range(lower, upper + 1))
    return out
