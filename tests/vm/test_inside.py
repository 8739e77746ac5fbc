"""The integration tests that need cgroup controllers, run inside the VM lab against its
systemd (PID 1 there: no box), as root: the cpuset and memory tests that the box can
only check as "not enforced here", and `status --resources` with the memory
controller. They must all pass, none skipped.

Not here: test_top's `top --once` table (with the memory column its 80-column header
wraps "CPU time" and cuts "memory.current": a finding for `top`) and its report test
(its "the burner used more CPU than the holder in 1 s" does not hold in a VM 12x
slower, where the holder's page-touching dominates)."""

from __future__ import annotations

from sdbox.vm import Machine

TESTS = (
    "tests/integration/test_resources.py::test_allowed_cpus_take_effect_where_cpuset_is_available",
    "tests/integration/test_resources.py::test_memory_max_takes_effect_where_memory_is_available",
    "tests/integration/test_top.py::test_status_resources_shows_cpu_memory_and_what_is_missing",
)


def test_controller_tests_pass_in_the_vm(vm: Machine) -> None:
    res = vm.run(
        "cd /src && ulimit -Sn 1024 && /opt/gpulaunch-venv/bin/python -m pytest"
        " -p no:cacheprovider -q -rs " + " ".join(TESTS),
        timeout=1500,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-5000:]
    assert "skipped" not in out and " passed" in out, out[-5000:]
