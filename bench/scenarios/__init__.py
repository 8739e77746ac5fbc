"""The scenarios, in order: 1-6 on one node, then 7 (several nodes); each returns its rows.
Scenario 11 runs none of bench/launchers.py's: it boots the VM lab and compares gpulaunch's
restart inside a container with podman restarting the container (`vm`: no box needed).

Each names the launchers it applies to: the front end (an ordinary user's job from a
login session) is measured where it can change the result, failure and exit (1, 1r),
its own death (2) and the launch (3); footprint, output and scale are the watcher's
(the same as `systemd`'s, under the user manager). Scenario 7 runs several launchers
per job and compares gpulaunch's systemd supervisor with torchrun.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench.context import Context
from bench.launchers import LAUNCHERS, TWO, Launcher
from bench.scenarios import (
    cross_node,
    failure,
    footprint,
    launch,
    membership,
    metrics,
    nodes,
    output,
    pod_restart,
    rounds,
    scale,
    watcher_kill,
)
from bench.stats import Metric

NO_FRONTEND = tuple(launcher for launcher in LAUNCHERS if launcher is not Launcher.FRONTEND)


@dataclass(frozen=True)
class Scenario:
    key: str  # "1", "1r", ...: what --only takes
    name: str
    run: Callable[[Context], list[Metric]]
    doc: str
    launchers: tuple[Launcher, ...] = LAUNCHERS
    vm: bool = False  # runs in the VM lab (its own systemd): the host needs none, nor a box


def _doc(module: object) -> str:
    return (getattr(module, "__doc__", None) or "").strip()


SCENARIOS = (
    Scenario("1", "failure propagation", failure.run, _doc(failure)),
    Scenario("1r", "failure propagation, @record", failure.run_record, failure.RECORD_DOC),
    Scenario("2", "watcher killed", watcher_kill.run, _doc(watcher_kill)),
    Scenario("3", "launch overhead", launch.run, _doc(launch)),
    Scenario("4", "footprint", footprint.run, _doc(footprint), NO_FRONTEND),
    Scenario("5", "output volume", output.run, _doc(output), NO_FRONTEND),
    Scenario("6", "scale", scale.run, _doc(scale), NO_FRONTEND),
    Scenario("7", "cross-node stop", cross_node.run, _doc(cross_node), TWO),
    Scenario("8", "many nodes", nodes.run, _doc(nodes), (Launcher.DIRECT, Launcher.TORCHRUN)),
    Scenario("9", "metrics scrape", metrics.run, _doc(metrics), metrics.LAUNCHERS),
    Scenario("10", "restarts across nodes", rounds.run, _doc(rounds), TWO),
    Scenario("10g", "a lost node, gpulaunch's rendezvous", membership.run, _doc(membership), TWO),
    Scenario(
        "10h", "a frozen node, gpulaunch's rendezvous", membership.run_frozen, _doc(membership), TWO
    ),
    Scenario("11", "pod restart", pod_restart.run, _doc(pod_restart), (), vm=True),
)
