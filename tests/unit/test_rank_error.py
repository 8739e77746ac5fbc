"""The cause rank's error in the report: a traceback is its error; a stderr tail without one
(a library's warning, torch's NumPy warning) is only its last lines (issue 35)."""

from __future__ import annotations

from gpulaunch.model import Cause, JobReport, RankExit, RankResult
from gpulaunch.report import format_report
from gpulaunch.watcher.errorfile import rank_error

WARNING = (
    "/venv/lib/python3.11/site-packages/torch/_subclasses/functional_tensor.py:276: "
    "UserWarning: Failed to initialize NumPy: No module named 'numpy'"
)
RAISED = 'Traceback (most recent call last):\n  File "t.py", line 3\nValueError: boom'


def report_of(tail: str) -> str:
    error, source = rank_error(None, 0, 1, lambda rank: tail)
    exit_ = RankExit(code=3, signal=None, stopped_by_watcher=False, observed_at=1.0, runtime=2.0)
    ranks = (RankResult(1, "u1", 42, exit_, error, source),)
    return format_report(JobReport("j", 3, Cause.RANK_FAILED, 1, None, ranks))


def test_a_tail_without_a_traceback_is_not_called_the_ranks_error() -> None:
    text = report_of(WARNING)
    assert "rank 1's error" not in text, text
    assert "rank 1 exited 3 without a traceback; its last lines of stderr:\n  /venv" in text


def test_a_tail_with_a_traceback_is_its_error() -> None:
    text = report_of(f"{WARNING}\n{RAISED}")
    assert "rank 1's error, from the last lines of its stderr:\n  /venv" in text, text
    assert "without a traceback" not in text
