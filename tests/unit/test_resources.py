"""gpulaunch/resources/ with fake cgroup trees, fake kernel log lines and a stand-in NVML:
the paths this machine (no cgroup controllers, no GPU) cannot show for real."""

from __future__ import annotations

import os
import resource
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpulaunch.base import cgroup as cg
from gpulaunch.jobapi.rankview import RankView
from gpulaunch.jobapi.targets import targets
from gpulaunch.jobapi.view import JobState, JobView
from gpulaunch.model import (
    Cause,
    JobReport,
    OomKill,
    RankExit,
    RankResult,
    RankUsage,
    format_bytes,
)
from gpulaunch.report import format_report, headline
from gpulaunch.resources.nvml import Gpus, open_gpus
from gpulaunch.resources.sample import (
    SHARED_CGROUP,
    RankTarget,
    Sampler,
    nested_pid_namespace,
)
from gpulaunch.resources.view import render
from gpulaunch.watcher.final import (
    CPU_FROM_CGROUP,
    CPU_FROM_WAIT4,
    FROM_EVENTS,
    FROM_KERNEL_LOG,
    PEAK_FROM_CGROUP,
    PEAK_FROM_WAIT4,
    oom_kill,
    usage,
)

GiB = 1 << 30
UNIT = "gpulaunch-j-rank0.scope"
REL = "gpulaunch.slice/gpulaunch-j.slice/gpulaunch-j-ranks.slice/" + UNIT


def fake_tree(tmp: Path, pids: list[int], memory: bool, **files: str) -> tuple[Path, Path, Path]:
    """A /proc where `pids[0]` is in the rank's cgroup, and that cgroup's files."""
    proc, root = tmp / "proc", tmp / "cgroup"
    group = root / REL
    group.mkdir(parents=True)
    (group / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))
    (group / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    (group.parent / "cgroup.subtree_control").write_text("memory pids\n" if memory else "\n")
    if memory:
        (group / "memory.current").write_text(f"{GiB}\n")
    for name, text in files.items():
        (group / name.replace("_", ".", 1)).write_text(text)
    (proc / str(pids[0])).mkdir(parents=True)
    (proc / str(pids[0]) / "cgroup").write_text(f"0::/{REL}\n")
    return proc, root, group


def rusage(utime: float = 1.0, stime: float = 0.5, maxrss_kib: int = 2048) -> Any:
    return SimpleNamespace(ru_utime=utime, ru_stime=stime, ru_maxrss=maxrss_kib)


# -- the cgroup files ---------------------------------------------------------


def test_cgroup_of_a_live_process_and_of_a_zombie(tmp_path: Path) -> None:
    proc, root, group = fake_tree(tmp_path, [os.getpid()], memory=False)
    assert cg.cgroup_of(os.getpid(), proc, root) == group
    (proc / str(os.getpid()) / "cgroup").write_text("0::/..\n")  # what a zombie shows
    assert cg.cgroup_of(os.getpid(), proc, root) is None
    assert cg.cgroup_of(1 << 22, proc, root) is None


def test_counters_absent_without_the_memory_controller_are_none_not_zero(tmp_path: Path) -> None:
    _, _, group = fake_tree(tmp_path, [1], memory=False)
    assert cg.cpu_usec(group) == 2_500_000
    assert cg.memory_current(group) is None
    assert cg.memory_peak(group) is None
    assert cg.oom_kills(group) is None
    assert "memory controller is not enabled" in (cg.memory_controller(group) or "")


def test_counters_with_the_memory_controller(tmp_path: Path) -> None:
    _, _, group = fake_tree(
        tmp_path,
        [1],
        memory=True,
        memory_peak="12669210624\n",
        memory_max="max\n",
        memory_events="low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
    )
    assert cg.memory_current(group) == GiB
    assert cg.memory_peak(group) == 12669210624
    assert cg.memory_max(group) is None  # unlimited
    assert cg.oom_kills(group) == 1
    assert cg.memory_controller(group) is None


# -- sampling -----------------------------------------------------------------


def test_sampler_reads_the_whole_unit_and_says_what_is_missing(tmp_path: Path) -> None:
    me = os.getpid()
    proc, root, group = fake_tree(tmp_path, [me], memory=False)
    clock = iter([10.0, 12.0])
    sampler = Sampler("no NVML here", proc, root, clock=lambda: next(clock), wall=lambda: 100.0)
    target = RankTarget(rank=0, unit=UNIT, pid=me, state="running", last_output=95.0)
    first = sampler.sample([target])
    assert first.ranks[0].cpu_percent is None and first.interval is None
    (group / "cpu.stat").write_text("usage_usec 4500000\n")  # 2 s of CPU in 2 s
    second = sampler.sample([target])
    r = second.ranks[0]
    assert r.cpu_percent == 100.0 and r.cpu_sec == 4.5 and second.interval == 2.0
    assert r.processes == 1 and r.threads is not None and r.threads >= 1
    assert r.rss is not None and r.rss > 0
    assert r.cgroup_memory is None and r.idle_sec == 5.0
    assert set(second.missing) == {"cgroup_memory", "gpu"}
    assert second.missing["gpu"] == "no NVML here"
    text = _text(render([("job j", second)]))
    assert text.count("memory.current: not available here") == 1
    assert "GPU: not available here: no NVML here" in text
    header = next(line for line in text.splitlines() if line.lstrip().startswith("rank"))
    assert "memory.current" not in header and "GPU" not in header and "RSS" in header


def test_a_cgroup_shared_with_the_watcher_is_no_ranks_own(tmp_path: Path) -> None:
    """Process groups: the rank sits in the watcher's cgroup (a login session's scope); its
    figures are its own processes', and the shared cgroup's never appear (issue 29)."""
    me, watcher = os.getpid(), 1 << 22
    proc, root, _ = fake_tree(tmp_path, [me, watcher], memory=True)
    (proc / str(watcher)).mkdir()
    (proc / str(watcher) / "cgroup").write_text(f"0::/{REL}\n")
    target = RankTarget(rank=0, unit="", pid=me, state="running", watcher_pid=watcher)
    r = Sampler("x", proc, root).sample([target])
    assert r.ranks[0].cgroup_memory is None  # the cgroup's 1 GiB is not the rank's
    assert r.ranks[0].cpu_sec != 2.5  # nor its cpu.stat: psutil's times of our processes
    assert r.ranks[0].processes is not None and r.ranks[0].processes >= 1
    assert r.missing["cgroup_memory"] == SHARED_CGROUP
    # in a cgroup of its own (a scope), the cgroup's figures are the rank's
    own = Sampler("x", proc, root).sample([RankTarget(0, UNIT, me, "running", watcher_pid=1)])
    assert own.ranks[0].cgroup_memory == GiB and own.ranks[0].cpu_sec == 2.5


def test_an_ended_rank_is_shown_without_numbers(tmp_path: Path) -> None:
    sample = Sampler("x").sample([RankTarget(rank=3, unit=UNIT, pid=0, state="exited")])
    assert sample.ranks[0].rss is None and sample.total.rss is None


def test_targets_from_the_bus_view() -> None:
    rank = RankView(0, 0, UNIT, 42, "running", -1, 0, False, -1, 0.0)
    view = JobView("j", "s", "system", 0, 1, JobState.RUNNING, 2, (rank, rank), last_output=(0, 5))
    found, missing = targets(view)
    assert missing is None and [t.last_output for t in found] == [None, 5e-6]
    old = JobView("j", "s", "system", 0, 1, JobState.RUNNING, 1, (rank,))
    assert targets(old)[1] == "the job's watcher does not publish LastOutput (older gpulaunch)"


def test_a_record_files_view_says_why_it_has_no_last_output() -> None:
    """Issue 35: the same version without a bus is not "an older gpulaunch"."""
    rank = RankView(0, 0, "", 42, "running", -1, 0, False, -1, 0.0)
    view = JobView("j", "s", "none", 0, 1, JobState.RUNNING, 1, (rank,), from_record=True)
    missing = targets(view)[1]
    assert missing is not None and "older" not in missing and "record file" in missing


# -- NVML through a stand-in ----------------------------------------------------


class FakeNvml:
    NVML_FEATURE_ENABLED = 1

    def __init__(self, accounting: bool = True, fail: bool = False) -> None:
        self.accounting, self.fail, self.shut = accounting, fail, False

    def nvmlInit(self) -> None:
        if self.fail:
            raise RuntimeError("NVML_ERROR_DRIVER_NOT_LOADED")

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [SimpleNamespace(pid=os.getpid(), usedGpuMemory=(h + 1) * GiB)]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> list[Any]:
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    def nvmlDeviceGetProcessUtilization(self, h: int, since: int) -> list[Any]:
        if h == 1:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")  # no samples on this GPU
        return [
            SimpleNamespace(pid=os.getpid(), timeStamp=1, smUtil=10),
            SimpleNamespace(pid=os.getpid(), timeStamp=2, smUtil=87),
        ]

    def nvmlDeviceGetAccountingMode(self, h: int) -> int:
        return 1 if self.accounting else 0

    def nvmlDeviceGetAccountingStats(self, h: int, pid: int) -> Any:
        if pid != 7:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return SimpleNamespace(maxMemoryUsage=3 * GiB)


def test_gpu_use_per_rank_through_nvml(tmp_path: Path) -> None:
    proc, root, _ = fake_tree(tmp_path, [os.getpid()], memory=True)
    gpus = open_gpus(FakeNvml())
    assert isinstance(gpus, Gpus)
    sampler = Sampler(gpus, proc, root)
    r = sampler.sample([RankTarget(0, UNIT, os.getpid(), "running")])
    assert r.ranks[0].gpu_memory == 3 * GiB  # 1 GiB on GPU 0 + 2 GiB on GPU 1
    assert r.ranks[0].gpu_util == 87  # the newest sample; GPU 1 had none
    assert r.ranks[0].cgroup_memory == GiB and "cgroup_memory" not in r.missing
    assert "gpu" not in r.missing
    assert gpus.peak_memory([7, 8]) == 6 * GiB  # on both GPUs
    assert Gpus(FakeNvml(accounting=False)).peak_memory([7]) is None
    gpus.close()


def test_without_nvml_the_reason_is_given() -> None:
    reason = open_gpus(FakeNvml(fail=True))
    assert isinstance(reason, str) and "NVML_ERROR_DRIVER_NOT_LOADED" in reason


# -- the end of a rank: usage and OOM -------------------------------------------


def test_usage_from_the_cgroup_where_it_has_them(tmp_path: Path) -> None:
    _, _, group = fake_tree(tmp_path, [1], memory=True, memory_peak=f"{2 * GiB}\n")
    used = usage(group, rusage(), 5 * GiB)
    assert used == RankUsage(2.5, CPU_FROM_CGROUP, 2 * GiB, PEAK_FROM_CGROUP, 5 * GiB)


def test_usage_from_wait4_without_a_cgroup() -> None:
    used = usage(None, rusage(1.0, 0.5, 2048), None)
    assert used == RankUsage(1.5, CPU_FROM_WAIT4, 2 << 20, PEAK_FROM_WAIT4, None)


def test_usage_of_a_real_child() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    _, _, ru = os.wait4(pid, 0)
    assert isinstance(ru, resource.struct_rusage)
    assert usage(None, ru, None).peak_memory == ru.ru_maxrss * 1024


def test_oom_from_memory_events(tmp_path: Path) -> None:
    _, _, group = fake_tree(
        tmp_path,
        [1],
        memory=True,
        memory_peak=f"{int(11.8 * GiB)}\n",
        memory_max=f"{12 * GiB}\n",
        memory_events="oom 1\noom_kill 1\n",
    )
    found = oom_kill(group, 1, signal.SIGKILL, None, kernel_log=lambda: [])
    assert found == OomKill(int(11.8 * GiB), 12 * GiB, FROM_EVENTS)
    assert found.describe() == "killed by the OOM killer at 11.8 GiB (limit 12.0 GiB)"
    assert oom_kill(group, 1, signal.SIGTERM, None) is None


def test_oom_names_the_limit_of_an_ancestor(tmp_path: Path) -> None:
    """--job-memory-max: the rank's scope has no memory.max of its own, the job slice has."""
    from gpulaunch.base import cgroup as cg

    root = tmp_path / "cg"
    scope = root / "gpulaunch.slice/job.slice/job-ranks.slice/job-rank0.scope"
    scope.mkdir(parents=True)
    (scope / "memory.max").write_text("max\n")
    (scope.parent / "memory.max").write_text("max\n")
    (scope.parent.parent / "memory.max").write_text(f"{200 << 20}\n")
    (root / "gpulaunch.slice/memory.max").write_text(f"{1 << 30}\n")
    assert cg.memory_limit(scope, root) == 200 << 20
    assert cg.memory_limit(root / "gpulaunch.slice", root) == 1 << 30
    assert cg.memory_limit(root, root) is None
    assert cg.memory_limit(tmp_path / "elsewhere", root) is None


def test_a_sigkill_without_oom_kill_events_is_not_oom(tmp_path: Path) -> None:
    _, _, group = fake_tree(tmp_path, [1], memory=True, memory_events="oom 0\noom_kill 0\n")
    log = [KMSG[2].replace("4242", "1")]
    assert oom_kill(group, 1, signal.SIGKILL, None, kernel_log=lambda: log) is None


KMSG = [
    "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,"
    "global_oom,task_memcg=/gpulaunch.slice/x,task=python3,pid=4242,uid=0",
    "Out of memory: Killed process 4241 (python3) total-vm:9000kB, anon-rss:100kB, "
    "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:100kB oom_score_adj:0",
    "Out of memory: Killed process 4242 (python3) total-vm:13000000kB, anon-rss:12373196kB, "
    "file-rss:1024kB, shmem-rss:0kB, UID:0 pgtables:24000kB oom_score_adj:0",
]


def test_oom_from_the_kernel_log_without_the_memory_controller(tmp_path: Path) -> None:
    _, _, group = fake_tree(tmp_path, [1], memory=False)
    found = oom_kill(group, 4242, signal.SIGKILL, 12 * GiB, kernel_log=lambda: KMSG)
    assert found == OomKill((12373196 + 1024) * 1024, 12 * GiB, FROM_KERNEL_LOG)
    assert found.describe() == "killed by the OOM killer at 11.8 GiB (limit 12.0 GiB)"
    assert oom_kill(group, 9999, signal.SIGKILL, None, kernel_log=lambda: KMSG) is None
    assert oom_kill(None, 4242, signal.SIGKILL, None, kernel_log=lambda: KMSG) is not None


# -- the report and the record ----------------------------------------------------


def oom_report() -> JobReport:
    oom = OomKill(int(11.8 * GiB), 12 * GiB, FROM_EVENTS)
    killed = RankExit(None, 9, False, 1.0, 60.0, usage=RankUsage(59.0, CPU_FROM_CGROUP,
                      int(11.8 * GiB), PEAK_FROM_CGROUP), oom=oom)  # fmt: skip
    stopped = RankExit(None, 15, True, 1.1, 60.1, usage=RankUsage(58.5, CPU_FROM_CGROUP,
                       300 << 20, PEAK_FROM_CGROUP))  # fmt: skip
    return JobReport(
        job="j",
        status=137,
        cause=Cause.RANK_FAILED,
        cause_rank=1,
        interrupt_signal=None,
        ranks=(
            RankResult(0, "gpulaunch-j-rank0.scope", 10, stopped),
            RankResult(1, "gpulaunch-j-rank1.scope", 11, killed),
        ),
    )


def test_the_report_names_the_oom_kill_and_shows_usage() -> None:
    report = oom_report()
    assert headline(report) == (
        "gpulaunch: job j failed: rank 1 killed by the OOM killer at 11.8 GiB "
        "(limit 12.0 GiB) (status 137)"
    )
    text = format_report(report)
    lines = text.splitlines()
    assert lines[1].split() == [
        "rank",
        "unit",
        "pid",
        "exit",
        "how",
        "runtime",
        "cpu",
        "peak",
        "mem",
    ]
    assert "killed by the OOM killer at 11.8 GiB" in lines[2] and "59.00s" in lines[2]
    assert "300.0 MiB" in lines[3]
    assert "cpu: from the unit's cgroup (cpu.stat); peak mem: from the unit's cgroup" in text


def test_the_record_keeps_usage_and_oom() -> None:
    from gpulaunch.jobapi.rankview import ranks_json

    report = oom_report()
    view = RankView(1, 1, "u", 11, "exited", -1, 9, False, 137, 60.0,
                    usage=report.ranks[1].exit.usage, oom=report.ranks[1].exit.oom)  # type: ignore[union-attr]  # fmt: skip
    back = RankView.from_json(ranks_json(view))
    assert back == view
    exit_ = back.result().exit
    assert exit_ is not None and exit_.describe().startswith("killed by the OOM killer")
    old = {k: v for k, v in ranks_json(view).items() if k not in ("usage", "oom")}
    assert RankView.from_json(old).usage is None  # a record of an older gpulaunch


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (512, 300 << 20, int(11.8 * GiB))] == [
        "512 B",
        "300.0 MiB",
        "11.8 GiB",
    ]


def _text(rendered: str) -> str:
    assert "\x1b" not in rendered  # plain text (a pipe, a file)
    return rendered


@pytest.mark.parametrize(
    ("nspid", "nested"), [("NSpid:\t4711\n", False), ("NSpid:\t4711\t12\n", True), ("", False)]
)
def test_nested_pid_namespace(tmp_path: Path, nspid: str, nested: bool) -> None:
    """In a container NVML's host pids are not ours: the GPU column says why it is empty."""
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/status").write_text(f"Name:\tpython3\n{nspid}Uid:\t0\n")
    assert nested_pid_namespace(tmp_path) is nested
