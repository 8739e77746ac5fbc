"""The fault soak's pure logic (bench/soak/): plans drawn from the seed, the README's rules.

The soak itself runs against the box in tests/integration/test_soak.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bench.soak.judge import STOPPED_BEFORE_START, End, Seen, judge, parse_headline
from bench.soak.plan import FAULTS, Fault, JobPlan, Phase, draw

JOB = "bench_soak_0123456789"
MAIN = Path(__file__).parents[2] / "gpulaunch" / "__main__.py"


def seen(returncode: int | None, report: End | None, **kw: object) -> Seen:
    base = Seen(
        returncode=returncode,
        stderr="",
        headline=report,
        record=report,
        leaked_units=(),
        leaked_procs=0,
        acted=True,
        action_rc=0,
        rank_faulted=False,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def plan_of(fault: Fault, **kw: object) -> JobPlan:
    """A plan of this fault kind, drawn as the soak draws it, with some fields set."""
    return replace(draw(7, 0, (fault,)), **kw)  # type: ignore[arg-type]


def test_a_plan_depends_on_the_seed_the_index_and_the_kinds_only() -> None:
    assert draw(5, 17, FAULTS) == draw(5, 17, FAULTS)
    assert len({draw(5, i, FAULTS).fault for i in range(200)}) == len(FAULTS)
    assert {draw(5, i, (Fault.SLICE_STOP,)).fault for i in range(20)} == {Fault.SLICE_STOP}
    late = draw(5, 3, (Fault.LATE_SIGTERM,))
    assert late.phase is Phase.AT_THE_END and late.rank_fault == "exit"


def test_headlines_are_read_as_report_py_writes_them() -> None:
    lines = {
        f"gpulaunch: job {JOB} succeeded (all 2 ranks exited 0)": End(0, "succeeded", None),
        f"gpulaunch: job {JOB} failed: rank 1 exit 37 (status 37)": End(37, "rank-failed", 1),
        f"gpulaunch: job {JOB} failed: rank 0 SIGSEGV (status 139)": End(139, "rank-failed", 0),
        f"gpulaunch: job {JOB} stopped by SIGTERM (status 143)": End(143, "interrupted", None),
        f"gpulaunch: job {JOB} stopped by systemctl stop (status 143)": End(
            143, "interrupted", None
        ),
        f"gpulaunch: job {JOB} failed to start (status 71)": End(71, "start-failed", None),
    }
    for line, end in lines.items():
        assert parse_headline(JOB, f"[rank0] hi\n{line}\n  rank  unit\n") == end
    assert parse_headline(JOB, "gpulaunch: job other failed: rank 1 exit 3 (status 3)") is None


def test_a_rank_failure_is_its_status_its_report_and_its_record() -> None:
    plan = plan_of(Fault.RANK_EXIT, code=37, fault_rank=1)
    right = End(37, "rank-failed", 1)
    assert not judge(plan, seen(37, right)).failed
    assert judge(plan, seen(1, End(1, "rank-failed", 1))).wrong_status
    assert judge(plan, seen(37, End(37, "rank-failed", 0))).wrong_report
    assert judge(plan, seen(37, right, record=None)).missing_record
    assert judge(plan, seen(37, right, record=End(143, "interrupted", None))).wrong_report
    sigsegv = plan_of(Fault.RANK_SIGSEGV, fault_rank=0)
    assert not judge(sigsegv, seen(139, End(139, "rank-failed", 0))).failed


def test_an_outside_stop_is_an_interrupt_never_a_rank_failure() -> None:
    """Issue 13, item 5: what the soak found on main before h/ends."""
    plan = plan_of(Fault.SLICE_STOP)
    assert not judge(plan, seen(143, End(143, "interrupted", None))).failed
    v = judge(plan, seen(143, End(143, "rank-failed", 0)))
    assert v.wrong_report and not v.wrong_status
    stop = plan_of(Fault.GPULAUNCH_STOP)
    assert judge(stop, seen(143, End(143, "interrupted", None), action_rc=3)).wrong_status


def test_a_late_signal_never_changes_the_reported_status() -> None:
    """Issue 13, item 6: reported rank-failed 130, then the watcher died of SIGTERM."""
    plan = plan_of(Fault.LATE_SIGTERM, code=130, fault_rank=0)
    v = judge(plan, seen(-15, None, record=End(130, "rank-failed", 0), rank_faulted=True))
    assert v.wrong_status and v.wrong_report
    rank_first = seen(130, End(130, "rank-failed", 0), rank_faulted=True)
    assert not judge(plan, rank_first).failed
    assert judge(plan, replace(rank_first, rank_faulted=False)).failed  # it never failed
    assert not judge(plan, seen(143, End(143, "interrupted", None))).failed


def test_a_signal_during_start_up_may_end_it_before_anything_exists() -> None:
    plan = plan_of(Fault.WATCHER_SIGINT, phase=Phase.START_UP)
    assert not judge(plan, seen(-2, None)).failed  # before gpulaunch took SIGINT over
    assert not judge(plan, seen(130, None)).failed  # its quiet ^C during the imports
    assert not judge(plan, seen(71, End(71, "start-failed", None))).failed
    assert judge(plan, seen(70, None)).wrong_status
    traceback = seen(-2, None, stderr="Traceback (most recent call last):\nKeyboardInterrupt")
    assert judge(plan, traceback).wrong_report
    running = replace(plan, phase=Phase.RUNNING)
    assert judge(running, seen(-2, None)).wrong_status  # once it runs, the watcher handles it


def test_a_killed_watcher_owes_no_record_but_leaves_nothing() -> None:
    plan = plan_of(Fault.WATCHER_SIGKILL)
    assert not judge(plan, seen(-9, None)).failed
    v = judge(plan, seen(-9, None, leaked_units=("gpulaunch-x.slice",), leaked_procs=2))
    assert v.leaked_units and v.leaked_procs and not v.missing_record


def test_a_restart_of_a_service_changes_nothing_and_a_hang_is_counted() -> None:
    plan = plan_of(Fault.DBUS_RESTART, rank_fault="none")
    assert not judge(plan, seen(0, End(0, "succeeded", None))).failed
    assert judge(plan, seen(70, None)).wrong_status
    assert judge(plan, seen(None, None)).hang


PYTHON_STARTUP = """Traceback (most recent call last):
  File "/venv/bin/gpulaunch", line 5, in <module>
  File "/repo/gpulaunch/__main__.py", line 11, in <module>
  File "<frozen importlib._bootstrap>", line 1176, in _find_and_load
KeyboardInterrupt
"""
OUR_CODE = PYTHON_STARTUP.replace('__main__.py", line 11', '__main__.py", line 25').replace(
    "<frozen importlib._bootstrap>", "/repo/gpulaunch/cli.py"
)


def test_a_sigint_before_gpulaunchs_first_line_is_pythons_not_a_defect() -> None:
    """Python's own KeyboardInterrupt while the interpreter and the console script start
    is no gpulaunch traceback; one with a frame of gpulaunch's code past its entry is."""
    plan = plan_of(Fault.WATCHER_SIGINT, phase=Phase.START_UP)
    for code in (1, -2):
        assert not judge(plan, seen(code, None, stderr=PYTHON_STARTUP)).failed
    assert judge(plan, seen(1, None, stderr=OUR_CODE)).failed
    running = replace(plan, phase=Phase.RUNNING)
    assert judge(running, seen(1, None, stderr=PYTHON_STARTUP)).failed


def test_the_new_kinds_are_replayable_and_launched_as_they_say() -> None:
    """Issue 22: the front end's, the direct supervisor's and the early stop's kinds."""
    for fault, launcher in (
        (Fault.FRONTEND_SIGKILL, "frontend"),
        (Fault.USER_MANAGER_STOP, "frontend"),
        (Fault.USER_MANAGER_REEXEC, "frontend"),
        (Fault.LOGOUT, "frontend"),
        (Fault.DIRECT_SIGKILL_CGROUP, "direct-cgroup"),
        (Fault.DIRECT_SIGKILL_PGROUP, "direct-pgroup"),
        (Fault.STOP_AT_START, "systemd"),
    ):
        plan = draw(3, 11, (fault,))
        assert plan == draw(3, 11, (fault,)) and plan.launcher == launcher
    direct = draw(3, 11, (Fault.DIRECT_SIGKILL_CGROUP,))
    assert direct.children >= 1 and "--children" in direct.rank_args()
    assert "--children" not in draw(3, 11, (Fault.SLICE_STOP,)).rank_args()  # old kinds: same
    early = draw(3, 11, (Fault.STOP_AT_START,))
    assert early.phase is Phase.UNITS and early.offset_s <= 0.15


def test_a_sigkilled_front_end_leaves_its_watcher_to_report_an_interrupt() -> None:
    plan = plan_of(Fault.FRONTEND_SIGKILL)
    stopped = End(143, "interrupted", None)
    assert not judge(plan, seen(-9, stopped)).failed
    assert judge(plan, seen(-9, None, record=None)).wrong_report  # no report at all
    assert judge(plan, seen(-9, stopped, record=None)).missing_record
    assert judge(plan, seen(-9, stopped, record=End(0, "succeeded", None))).wrong_report


def test_a_user_manager_going_away_is_an_interrupt_not_an_internal_error() -> None:
    """Issue 22, item 2: 70 and no record was what main did."""
    for fault in (Fault.USER_MANAGER_STOP, Fault.LOGOUT):
        plan = plan_of(fault)
        assert not judge(plan, seen(143, End(143, "interrupted", None))).failed
        v = judge(plan, seen(70, None, record=None, stderr="gpulaunch: internal error: x"))
        assert v.wrong_status and v.wrong_report and v.missing_record
    reexec = plan_of(Fault.USER_MANAGER_REEXEC, rank_fault="none")
    assert not judge(reexec, seen(0, End(0, "succeeded", None))).failed
    assert judge(reexec, seen(70, None)).wrong_status


def test_an_outside_stop_at_the_gates_is_143_with_a_record() -> None:
    """Issue 22, item 1: a silent 141 (no report, no record), or 71, was what main did."""
    plan = plan_of(Fault.STOP_AT_START)
    assert not judge(plan, seen(143, End(143, "interrupted", None))).failed
    assert not judge(plan, seen(143, None, record=End(143, "interrupted", None))).failed
    v = judge(plan, seen(141, None, record=None))
    assert v.wrong_status and v.missing_record
    assert judge(plan, seen(71, End(71, "start-failed", None))).wrong_status
    assert judge(plan, seen(143, None, record=None)).missing_record


def test_a_killed_direct_watcher_leaves_no_child_of_a_rank_and_no_cgroup() -> None:
    """Issue 22, item 3."""
    for fault in (Fault.DIRECT_SIGKILL_CGROUP, Fault.DIRECT_SIGKILL_PGROUP):
        plan = plan_of(fault)
        assert not judge(plan, seen(-9, None)).failed
        v = judge(plan, seen(-9, None, leaked_procs=6))
        assert v.leaked_procs and not v.missing_record
        assert judge(plan, seen(-9, None, leaked_units=("/sys/fs/cgroup/x",))).leaked_units


def test_a_direct_job_whose_watcher_died_is_not_said_to_run() -> None:
    """Issue 22, item 5: `status` said running forever after a SIGKILLed direct watcher."""
    plan = plan_of(Fault.DIRECT_SIGKILL_CGROUP)
    assert judge(plan, seen(-9, None, state_after="running")).wrong_report
    assert not judge(plan, seen(-9, None, state_after="stopped")).failed
    assert not judge(plan, seen(-9, None, state_after=None)).failed


def test_a_sigterm_before_the_watchers_handler_is_one_line_and_no_record() -> None:
    """gpulaunch/__main__.py takes a SIGTERM over from its first line (issue 22, item 11):
    before the watcher's own handler nothing of the job exists, and it says so in one line
    (it was "report none for exit 143" in 4 of 20 of the 500-job soak)."""
    plan = plan_of(Fault.WATCHER_SIGTERM, phase=Phase.START_UP)
    line = "gpulaunch: stopped by SIGTERM before the job started (nothing was made)"
    assert STOPPED_BEFORE_START.format(name="SIGTERM") == line
    assert f'STOPPED_BEFORE_START = "{STOPPED_BEFORE_START}"' in MAIN.read_text()  # the same
    assert not judge(plan, seen(143, None, stderr=line + "\n")).failed
    assert judge(plan, seen(143, None)).wrong_report  # silent: not what it says
    assert judge(plan, seen(143, None, stderr=line + "\n", leaked_units=("x",))).leaked_units
    recorded = seen(143, None, stderr=line + "\n", record=End(143, "interrupted", None))
    assert judge(plan, recorded).wrong_report  # said nothing was made, yet recorded
    # a SIGTERM once the job runs owes its report, whatever the phase
    late = plan_of(Fault.WATCHER_SIGTERM, phase=Phase.RUNNING)
    assert judge(late, seen(143, None, stderr=line + "\n")).failed


def test_the_kinds_of_issue_35_are_drawn_and_launched_as_they_say() -> None:
    restart = draw(3, 11, (Fault.RESTART_SIGTERM,))
    assert restart == draw(3, 11, (Fault.RESTART_SIGTERM,)) and restart.launcher == "systemd"
    assert restart.nproc >= 2 and restart.phase is Phase.GANG_STOP
    assert "--hold" in restart.rank_args() and 1.5 <= restart.hold_s <= 3.0
    assert restart.offset_s < restart.hold_s - 1.0  # the watcher's SIGTERM inside the hold
    assert restart.options[:2] == ("--max-restarts", "2") and restart.code != 78
    variants = {draw(3, i, (Fault.RESTART_SIGTERM,)).preempt for i in range(40)}
    assert variants == {True, False}  # with and without --preempt-grace
    for fault in (Fault.DIRECT_PKILL, Fault.DIRECT_STOP):
        plan = draw(3, 11, (fault,))
        assert plan.launcher == "direct-cgroup" and plan.children >= 1
        assert plan.phase is Phase.RUNNING
    assert "--hold" not in draw(3, 11, (Fault.SLICE_STOP,)).rank_args()  # old kinds: same


def test_a_sigterm_during_a_restarts_gang_stop_wins_and_nothing_restarts() -> None:
    """Issue 35, item 8: the failed rank's 3 and no word of the signal was what main did."""
    plan = plan_of(Fault.RESTART_SIGTERM, options=("--max-restarts", "2"), code=3)
    said = (
        "gpulaunch: rank 1 exited 3; not restarting: the job was interrupted while its ranks "
        f"stopped\ngpulaunch: job {JOB} stopped by SIGTERM (status 143)\n"
    )
    stopped = End(143, "interrupted", None)
    assert not judge(plan, seen(143, stopped, stderr=said, rank_faulted=True)).failed
    failed = End(3, "rank-failed", plan.fault_rank)
    v = judge(plan, seen(3, failed, stderr="", rank_faulted=True))
    assert v.wrong_status and v.wrong_report
    restarted = said + "gpulaunch: restarting all ranks (restart 1 of 2)\n"
    assert judge(plan, seen(143, stopped, stderr=restarted)).wrong_report
    assert judge(plan, seen(143, stopped, stderr=said.splitlines()[1])).wrong_report
    preempt = replace(plan, options=("--max-restarts", "2", "--preempt-grace", "15"))
    line = f"gpulaunch: job {JOB} preempted (status 79: requeue it)"
    assert parse_headline(JOB, line + "\n") == End(79, "preempted", None)
    notice = "gpulaunch: SIGTERM: preempted while the ranks stop; nothing restarts\n"
    ok = said.splitlines()[0] + "\n" + notice + line + "\n"
    assert not judge(preempt, seen(79, End(79, "preempted", None), stderr=ok)).failed
    assert judge(preempt, seen(143, stopped, stderr=said)).wrong_status
    no_notice = said.splitlines()[0] + "\n" + line + "\n"
    assert judge(preempt, seen(79, End(79, "preempted", None), stderr=no_notice)).wrong_report


def test_the_direct_keeper_and_watcher_killed_together_leave_nothing() -> None:
    """Issue 35, item 11: every rank's children stayed (pkill -9 -f gpulaunch)."""
    plan = plan_of(Fault.DIRECT_PKILL)
    assert not judge(plan, seen(-9, None, record=None)).failed
    assert judge(plan, seen(-9, None, leaked_procs=4)).leaked_procs
    assert judge(plan, seen(-9, None, leaked_units=("/sys/fs/cgroup/x",))).leaked_units
    assert judge(plan, seen(-9, None, state_after="running")).wrong_report


def test_gpulaunch_stop_of_a_direct_job_is_an_interrupt() -> None:
    """Issue 35, item 5: `gpulaunch stop` of a direct job exited 69."""
    plan = plan_of(Fault.DIRECT_STOP)
    stopped = End(143, "interrupted", None)
    assert not judge(plan, seen(143, stopped)).failed
    assert judge(plan, seen(143, stopped, action_rc=69)).wrong_status
    assert judge(plan, seen(143, stopped, record=None)).missing_record


def test_a_ranks_own_keyboardinterrupt_is_not_a_traceback_of_gpulaunch() -> None:
    """Since a SIGINT reaches the ranks as SIGINT (issue 35, item 4) a Python rank prints
    its KeyboardInterrupt, prefixed; gpulaunch's own traceback still counts."""
    plan = plan_of(Fault.WATCHER_SIGINT, phase=Phase.RUNNING)
    stopped = End(130, "interrupted", None)
    rank = "[0] Traceback (most recent call last):\n[0]     time.sleep(1)\n[0] KeyboardInterrupt\n"
    assert not judge(plan, seen(130, stopped, stderr=rank)).failed
    own = 'Traceback (most recent call last):\n  File "/x/gpulaunch/cli.py", line 3\n'
    assert judge(plan, seen(130, stopped, stderr=rank + own)).wrong_report
    assert judge(plan, seen(130, stopped, stderr="gpulaunch: internal error: x\n")).wrong_report
