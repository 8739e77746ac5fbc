"""The classes of failure `--restart-on` names (the words only: failure.py classifies)."""

from __future__ import annotations

import enum


class FailureClass(enum.StrEnum):
    """Why an attempt failed, as `--restart-on` spells it.

    A rank's exit is `oom` if the kernel's OOM killer killed it, else `signal` if it
    died of a signal, else `exit` (a non-zero exit code). `hang` is --hang-timeout's
    finding; `node` a multi-node job's failure on another node (or its loss).
    """

    EXIT = "exit"
    SIGNAL = "signal"
    OOM = "oom"
    HANG = "hang"
    NODE = "node"


def parse_classes(text: str) -> frozenset[FailureClass]:
    """`exit,signal` or `all` or `none` (`--restart-on`); ValueError naming the bad word."""
    words = [w.strip().lower() for w in text.split(",") if w.strip()]
    if words == ["all"]:
        return frozenset(FailureClass)
    if words == ["none"]:
        return frozenset()
    known = {c.value for c in FailureClass}
    bad = [w for w in words if w not in known]
    if bad or not words:
        raise ValueError(f"unknown failure class {bad[0]!r}" if bad else "no failure class given")
    return frozenset(FailureClass(w) for w in words)
