"""bench/lightning.py's pure parts: a row from runs, the statuses, the table's ratios."""

from __future__ import annotations

from typing import Any

from bench.lightning import _markdown, _row, _status


def run(strategy: str, status: int, exit_s: float, reaction_s: float) -> dict[str, Any]:
    return {
        "strategy": strategy,
        "ended": True,
        "status": status,
        "exit_s": exit_s,
        "rank_gone_s": exit_s - reaction_s,
        "reaction_s": reaction_s,
        "report_names_rank": strategy == "gpulaunch",
        "left_at_exit": 0,
        "left_after_1s": 0,
        "zombie_s": reaction_s if strategy == "ddp" else 0.0,
    }


def test_a_row_and_its_table() -> None:
    ddp = _row([run("ddp", -9, 4.0, 3.0), run("ddp", -9, 6.0, 5.0), run("ddp", -9, 5.0, 4.0)])
    ours = _row([run("gpulaunch", 7, 2.0, 0.5), run("gpulaunch", 7, 1.0, 0.5)])
    assert (ddp["median_exit_s"], ddp["max_exit_s"], ddp["median_reaction_s"]) == (5.0, 6.0, 4.0)
    assert ddp["statuses"] == [-9] and ours["statuses"] == [7]
    assert ddp["max_zombie_s"] == 5.0 and ours["report_names_rank"] == 2
    meta = {"date": "d", "commit": "c", "reps": 3, "loadavg": "1 1 1", "cpus": 2}
    text = _markdown({"while x": {"ddp": ddp, "gpulaunch": ours}}, meta)
    assert "## Rank 1 fails while x" in text
    assert "| exit status of `python train.py` | killed by signal 9 (137 in a shell) | 7 |" in text
    assert "failure → exit (gpulaunch / Lightning): 0.30." in text
    assert "reaction (gpulaunch / Lightning): 0.12." in text


def test_statuses() -> None:
    assert _status(7) == "7"
    assert _status(-6) == "killed by signal 6 (134 in a shell)"
    assert _status(None) == "none (still running)"
