"""The benchmark's pure parts: the launchers' order, ratios per launcher, the table."""

from __future__ import annotations

from bench.launchers import LAUNCHERS, Launcher, order
from bench.report import table
from bench.scenarios import SCENARIOS, Scenario
from bench.stats import Metric, below, ratio_at_most


def test_every_launcher_goes_first_once_in_as_many_repetitions() -> None:
    firsts = [order(rep)[0] for rep in range(len(LAUNCHERS))]
    assert sorted(firsts) == sorted(LAUNCHERS)
    for rep in range(5):
        assert sorted(order(rep)) == sorted(LAUNCHERS)
    assert order(1, (Launcher.DIRECT, Launcher.TORCHRUN)) == (Launcher.TORCHRUN, Launcher.DIRECT)


def test_ratios_and_verdicts_are_per_launcher_against_torchrun() -> None:
    m = Metric("1a", "failure → launcher exit", "s", judge=ratio_at_most(1 / 3, "1/3"))
    for value in (1.0, 1.2, 1.1):
        m.add(Launcher.SYSTEMD, value)
    m.add(Launcher.DIRECT, 0.5)
    m.add(Launcher.TORCHRUN, 2.0)
    assert m.ratios() == {"systemd": 1.1 / 2.0, "direct": 0.25}
    assert m.verdict() == (
        "target ≤ 1/3 of torchrun's: systemd MISSED 0.55× (1.7× over); direct met 0.25×"
    )


def test_a_launcher_a_scenario_does_not_run_says_so() -> None:
    a = Metric("2", "watcher SIGKILL → no job process left", "s", judge=below(0.5, "s"))
    a.add(Launcher.FRONTEND, 0.08)
    a.add(Launcher.TORCHRUN, None)
    b = Metric("4a", "launcher peak RSS", "MiB")
    b.add(Launcher.DIRECT, 30.0)
    b.add(Launcher.TORCHRUN, 300.0)
    s = Scenario("2", "x", lambda ctx: [], "x")
    rows = table([(s, [a, b])]).splitlines()
    assert (
        rows[0] == "| # | scenario | gpulaunch direct | gpulaunch frontend | torchrun | verdict |"
    )
    assert (
        "| not run | 0.08 s | no value (1/1 runs) | target < 0.5 s: frontend met 0.08 s |"
        in rows[2]
    )
    assert "| 30.00 MiB **×0.10** | not run | 300.00 MiB |" in rows[3]


def test_scenario_keys_are_unique_and_the_front_end_runs_where_asked() -> None:
    keys = [s.key for s in SCENARIOS]
    assert len(keys) == len(set(keys)) and keys[:2] == ["1", "1r"]
    with_frontend = [s.key for s in SCENARIOS if Launcher.FRONTEND in s.launchers]
    assert with_frontend == ["1", "1r", "2", "3"]


def test_the_pod_restart_is_timed_from_the_failure_to_the_last_rank_back() -> None:
    """Scenario 11's reading of a run (bench/scenarios/pod_restart.py): the first stamp
    of each rank after the failure, the last of them; the phases from podman's log times."""
    from bench.scenarios.pod_restart import Way, _parse, _sample

    out = "\n".join([
        "LOAD 2.1 2.2 1.5 1/77 800",
        "STATUS 0",
        "STARTED 1000000012000000000 RESTARTS 1",
        "LOG 2001-09-09T01:46:41.000000000Z gpulaunch: job x failed: rank 1 exit 3 (status 3)",
        "FILE failed 1000000000.500000",
        "FILE up0 1000000000.000000 0",
        "FILE up0 1000000030.000000 0",
        "FILE up1 1000000000.400000 0",
        "FILE up1 1000000031.500000 0",
    ])  # fmt: skip
    parsed = _parse(out)
    assert (parsed.status, parsed.restarts, parsed.started) == ("0", "1", 1000000012.0)
    s = _sample(Way.ON_FAILURE, parsed)
    assert s.total == 31.0 and s.stopped == 0.5 and s.restarted == 11.0 and s.up == 19.5
    missing = _parse(out.replace("FILE up1 1000000031.500000 0", ""))
    assert _sample(Way.ON_FAILURE, missing).total is None  # rank 1 never came back


def test_scenarios_in_the_vm_lab_run_only_when_named() -> None:
    from bench.cli import selected

    assert "11" not in [s.key for s in selected(set())]  # a plain `python -m bench`: no VM
    assert [s.key for s in selected({"11", "3"})] == ["3", "11"]
    assert all(not s.launchers for s in SCENARIOS if s.vm)  # nothing for the warm-up to start
