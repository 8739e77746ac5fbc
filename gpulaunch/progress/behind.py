"""Where the ranks' steps stopped, in words, for a hang by steps (pure)."""

from __future__ import annotations

from collections.abc import Mapping


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def behind(steps: Mapping[int, int | None]) -> str:
    """Each rank's last step (None: it never stepped) → who is behind, or that none is.

    `{0: 4, 1: 3, 2: 4}` → "rank 1 at step 3, behind the others' 4".
    """
    known = {r: s for r, s in steps.items() if s is not None}
    never = sorted(r for r, s in steps.items() if s is None)
    parts = []
    if known:
        top = max(known.values())
        late: dict[int, list[int]] = {}
        for rank, step in sorted(known.items()):
            if step < top:
                late.setdefault(step, []).append(rank)
        if late:
            at = ", ".join(f"{_ranks(r)} at step {s}" for s, r in sorted(late.items()))
            parts.append(f"{at}, behind the others' {top}")
        else:
            parts.append(f"{'every rank' if not never else _ranks(sorted(known))} at step {top}")
    if never:
        parts.append(f"{_ranks(never)} never stepped")
    return "; ".join(parts)
