"""A straggler's journal entry: flagged and cleared, each with the same MESSAGE_ID.

`journalctl MESSAGE_ID=f7229eeb1dbd498f8b2225a5ffba09d9` lists every straggler
flagged or cleared on this machine (`GPULAUNCH_STRAGGLER=1` or `0`); the job's
record carries each rank's flag when the job ended.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulaunch.base.journald import encode, send
from gpulaunch.model import StragglerRule

STRAGGLER_MESSAGE_ID = "f7229eeb1dbd498f8b2225a5ffba09d9"


@dataclass(frozen=True)
class StragglerNote:
    """A rank's straggler flag changed."""

    job: str
    rank: int
    unit: str  # "" without units (the direct supervisor)
    straggler: bool
    seconds: float  # its step time
    others: float  # the median of the other ranks'
    step: int
    rule: StragglerRule

    def message(self) -> str:
        if self.straggler:
            return (
                f"job {self.job}: rank {self.rank} is a straggler: {self.seconds:.3g} s a step, "
                f"{self.seconds / self.others:.1f}x the other ranks' {self.others:.3g} s "
                f"(over {self.rule.factor:g}x for {self.rule.steps} steps, at step {self.step})"
            )
        return (
            f"job {self.job}: rank {self.rank} keeps up again: {self.seconds:.3g} s a step, "
            f"the other ranks' {self.others:.3g} s (at step {self.step})"
        )

    def fields(self) -> list[tuple[str, str]]:
        out = [
            ("MESSAGE_ID", STRAGGLER_MESSAGE_ID),
            ("MESSAGE", "gpulaunch: " + self.message()),
            ("PRIORITY", "4" if self.straggler else "5"),
            ("SYSLOG_IDENTIFIER", "gpulaunch"),
            ("GPULAUNCH_JOB", self.job),
            ("GPULAUNCH_RANK", str(self.rank)),
            ("GPULAUNCH_STRAGGLER", "1" if self.straggler else "0"),
            ("GPULAUNCH_STEP", str(self.step)),
            ("GPULAUNCH_STEP_SECONDS", f"{self.seconds:.6f}"),
            ("GPULAUNCH_OTHERS_STEP_SECONDS", f"{self.others:.6f}"),
        ]
        if self.unit:
            out.append(("GPULAUNCH_UNIT", self.unit))
        return out


def note_straggler(note: StragglerNote) -> bool:
    """Hand the entry to journald; whether it took it (the terminal said it anyway)."""
    try:
        send(encode(note.fields()))
    except OSError:
        return False
    return True
