"""Metrics: samples per launcher, their median and spread, and a target to judge them by."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.launchers import Launcher

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


# A verdict: given our summary and torchrun's, a one-line judgement.
Judge = Callable[[Summary, Summary], str]


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

    def ratio(self) -> float | None:
        ours = self.summary(Launcher.GPULAUNCH).median
        theirs = self.summary(Launcher.TORCHRUN).median
        if ours is None or theirs is None or theirs == 0:
            return None
        return ours / theirs

    def verdict(self) -> str:
        if self.judge is None:
            return ""
        return self.judge(self.summary(Launcher.GPULAUNCH), self.summary(Launcher.TORCHRUN))


def _ratio(ours: Summary, theirs: Summary) -> float | None:
    if ours.median is None or theirs.median is None or theirs.median == 0:
        return None
    return ours.median / theirs.median


def ratio_at_most(limit: float, label: str) -> Judge:
    """Target: our median at most `limit` times torchrun's."""

    def judge(ours: Summary, theirs: Summary) -> str:
        r = _ratio(ours, theirs)
        if r is None:
            return f"no verdict: a median is missing (target ≤ {label} of torchrun's)"
        if r <= limit:
            return f"met: {r:.2f}× torchrun's (target ≤ {label})"
        return f"MISSED: {r:.2f}× torchrun's, target ≤ {label} ({r / limit:.1f}× over)"

    return judge


def below(limit: float, unit: str) -> Judge:
    """Target: our median below an absolute bound."""

    def judge(ours: Summary, theirs: Summary) -> str:
        m = ours.median
        if m is None or ours.missing:
            return f"MISSED: not every run got there (target < {limit:g} {unit})"
        if m < limit:
            return f"met: {m:.3g} {unit} (target < {limit:g} {unit})"
        return f"MISSED: {m:.3g} {unit}, target < {limit:g} {unit} (+{m - limit:.2f} {unit})"

    return judge


def compared(unit: str, lower_is_better: bool = True) -> Judge:
    """No target: say who is faster (or smaller) and by how much."""

    def judge(ours: Summary, theirs: Summary) -> str:
        r = _ratio(ours, theirs)
        if r is None:
            return "info only"
        better = r < 1 if lower_is_better else r > 1
        word = "better" if better else "worse"
        if abs(r - 1) < 0.05:
            return f"info: on par ({r:.2f}×)"
        factor = 1 / r if r < 1 else r
        return f"info: gpulaunch {word}, {factor:.1f}× {'less' if r < 1 else 'more'} {unit}"

    return judge
