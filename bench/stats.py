"""Metrics: samples per launcher, their median and spread, and a target to judge them by."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.launchers import LAUNCHERS, Launcher

Samples = dict[Launcher, list[float | None]]  # None: no value (e.g. not gone within a cap)


@dataclass(frozen=True)
class Summary:
    """Median and spread (min, max) of the values that exist; `missing` counts the Nones."""

    n: int
    median: float | None
    low: float | None
    high: float | None
    missing: int

    @classmethod
    def of(cls, samples: list[float | None]) -> Summary:
        values = [v for v in samples if v is not None]
        if not values:
            return cls(len(samples), None, None, None, len(samples))
        return cls(
            len(samples),
            statistics.median(values),
            min(values),
            max(values),
            len(samples) - len(values),
        )


@dataclass(frozen=True)
class Judge:
    """A row's target, and one gpulaunch launcher's short verdict against it.

    `check(ours, torchrun's)` says e.g. "met 0.30×" or "MISSED 0.45× (1.4× over)"; the
    row's verdict is the target once, then each launcher's check.
    """

    target: str
    check: Callable[[Summary, Summary], str]


@dataclass
class Metric:
    """One row of the report."""

    key: str  # "1a"
    title: str
    unit: str  # "s", "MiB", "CPU s", "lines"
    samples: Samples = field(default_factory=dict)
    judge: Judge | None = None
    notes: list[str] = field(default_factory=list)  # footnotes: what happened, by launcher
    digits: int = 2
    extra: dict[str, list[float | None]] = field(default_factory=dict)  # reference series
    missing_label: str = "no value"  # what a None sample means, for the table

    def add(self, launcher: Launcher, value: float | None) -> None:
        self.samples.setdefault(launcher, []).append(value)

    def summary(self, launcher: Launcher) -> Summary:
        return Summary.of(self.samples.get(launcher, []))

    def ran(self) -> list[Launcher]:
        """The launchers this row has samples of, in the report's order."""
        return [launcher for launcher in LAUNCHERS if launcher in self.samples]

    def ratio(self, launcher: Launcher) -> float | None:
        """`launcher`'s median / torchrun's."""
        return _ratio(self.summary(launcher), self.summary(Launcher.TORCHRUN))

    def ratios(self) -> dict[str, float | None]:
        return {launcher.value: self.ratio(launcher) for launcher in self.ran() if launcher.ours}

    def verdict(self) -> str:
        if self.judge is None:
            return ""
        theirs = self.summary(Launcher.TORCHRUN)
        checks = [
            f"{launcher.value} {self.judge.check(self.summary(launcher), theirs)}"
            for launcher in self.ran()
            if launcher.ours
        ]
        return f"{self.judge.target}: " + "; ".join(checks)


def _ratio(ours: Summary, theirs: Summary) -> float | None:
    if ours.median is None or theirs.median is None or theirs.median == 0:
        return None
    return ours.median / theirs.median


def ratio_at_most(limit: float, label: str) -> Judge:
    """Target: our median at most `limit` times torchrun's."""

    def check(ours: Summary, theirs: Summary) -> str:
        r = _ratio(ours, theirs)
        if r is None:
            return "no verdict (a median is missing)"
        if r <= limit:
            return f"met {r:.2f}×"
        return f"MISSED {r:.2f}× ({r / limit:.1f}× over)"

    return Judge(f"target ≤ {label} of torchrun's", check)


def below(limit: float, unit: str) -> Judge:
    """Target: our median below an absolute bound."""

    def check(ours: Summary, theirs: Summary) -> str:
        m = ours.median
        if m is None or ours.missing:
            return "MISSED (not every run got there)"
        if m < limit:
            return f"met {m:.3g} {unit}"
        return f"MISSED {m:.3g} {unit} (+{m - limit:.2f} {unit})"

    return Judge(f"target < {limit:g} {unit}", check)


def compared(unit: str, lower_is_better: bool = True) -> Judge:
    """No target: say whether each gpulaunch launcher is ahead of torchrun and by how much."""

    def check(ours: Summary, theirs: Summary) -> str:
        r = _ratio(ours, theirs)
        if r is None:
            return "-"
        if abs(r - 1) < 0.05:
            return f"on par ({r:.2f}×)"
        better = r < 1 if lower_is_better else r > 1
        factor = 1 / r if r < 1 else r
        return (
            f"{'ahead' if better else 'behind'}, {factor:.1f}× {'less' if r < 1 else 'more'} {unit}"
        )

    return Judge("info, against torchrun", check)
