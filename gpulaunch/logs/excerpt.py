"""A bounded excerpt of a rank's error: its stderr tail or its `@record` traceback.

The excerpt goes into the report, the journal record (`GPULAUNCH_CAUSE_ERROR`)
and `gpulaunch status`, so it must stay small whatever the rank wrote: a line
keeps its start and its end with a note of how many bytes were cut between
them, and the whole excerpt keeps its last lines (a traceback's last lines say
what happened) with a note of how many earlier lines were cut. A line redrawn
with carriage returns (a tqdm bar) is kept in its final state only, as a
terminal shows it: its redraws would fill the excerpt (and `splitlines()` would
make a line of each).
"""

from __future__ import annotations

from collections.abc import Sequence

LINE_KEEP = 256  # bytes kept at each end of a long line
EXCERPT_MAX = 8192  # bytes of a whole excerpt (the notes of what was cut not counted)


def _boundary(data: bytes, i: int) -> int:
    """`i`, moved back to the start of the UTF-8 character it falls in (if it does)."""
    for _ in range(3):
        if 0 < i < len(data) and data[i] & 0xC0 == 0x80:
            i -= 1
    return i


def final_state(line: bytes) -> bytes:
    """What a terminal finally shows of a line redrawn with carriage returns (tqdm).

    The text after the last `\r`; a `\r` that ends the line (CRLF, a bar's last
    redraw) draws nothing over it.
    """
    if b"\r" not in line:
        return line
    return line.rstrip(b"\r").rsplit(b"\r", 1)[-1]


def clip_line(line: bytes, missing: int = 0) -> bytes:
    """`line` cut to its first and last LINE_KEEP bytes, saying how many bytes were cut.

    `missing`: bytes of the line already dropped after its first LINE_KEEP bytes (a
    line too long to hold whole); they count as cut.
    """
    if len(line) <= 2 * LINE_KEEP and not missing:
        return line
    start = _boundary(line, min(LINE_KEEP, len(line)))
    end = max(start, _boundary(line, len(line) - LINE_KEEP))
    cut = end - start + missing
    return line[:start] + f" [... {cut} bytes cut ...] ".encode() + line[end:]


def excerpt(clipped: Sequence[bytes]) -> str:
    """Lines as `clip_line` gives them: as many of the last as fit in EXCERPT_MAX bytes."""
    kept: list[bytes] = []
    size = 0
    for line in reversed(clipped):
        if kept and size + len(line) + 1 > EXCERPT_MAX:
            break
        kept.append(line)
        size += len(line) + 1
    kept.reverse()
    if len(kept) < len(clipped):
        kept.insert(0, f"[... {len(clipped) - len(kept)} earlier lines cut ...]".encode())
    return "\n".join(line.decode("utf-8", "replace") for line in kept)


def text_excerpt(text: str) -> str:
    """`excerpt` of a text (a traceback read from a file)."""
    lines = text.encode("utf-8", "replace").split(b"\n")
    return excerpt([clip_line(final_state(line)) for line in lines])
