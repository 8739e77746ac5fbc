"""The scenarios, in order: 1-6 on one node, then 7 (several nodes); each returns its rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench.context import Context
from bench.scenarios import cross_node, failure, footprint, launch, output, scale, watcher_kill
from bench.stats import Metric


@dataclass(frozen=True)
class Scenario:
    number: int
    name: str
    run: Callable[[Context], list[Metric]]
    doc: str


def _doc(module: object) -> str:
    return (getattr(module, "__doc__", None) or "").strip()


SCENARIOS = (
    Scenario(1, "failure propagation", failure.run, _doc(failure)),
    Scenario(2, "watcher killed", watcher_kill.run, _doc(watcher_kill)),
    Scenario(3, "launch overhead", launch.run, _doc(launch)),
    Scenario(4, "footprint", footprint.run, _doc(footprint)),
    Scenario(5, "output volume", output.run, _doc(output)),
    Scenario(6, "scale", scale.run, _doc(scale)),
    Scenario(7, "cross-node stop", cross_node.run, _doc(cross_node)),
)
