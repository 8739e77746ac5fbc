"""`python -m bench.lightning [--reps N] [--out DIR] [--cap S]`: Lightning's own launcher
against `strategy="gpulaunch"` on the seed issue's failure (issue 31).

The same `python bench/ranks/lightning_fail.py` twice over: `--strategy ddp` (Lightning's
_SubprocessScriptLauncher: rank 0 is the process started and spawns rank 1) and
`--strategy gpulaunch` (the process started becomes gpulaunch's watcher). Two CPU ranks
(gloo); rank 1 calls sys.exit(7) in step 5. Measured per run: the time from the failing
rank's stamp (taken right before sys.exit) to the exit of the process started, its exit
status, whether its stderr names rank 1 and its status, and what is left: processes
carrying the run's token when the started process has exited (zombies apart), and one
second later. A run that has not ended after --cap seconds is recorded as such, and its
processes are killed.

Its own runner, not a scenario of `python -m bench`: the two launchers here are two
strategies of one Lightning script, not the launchers bench/launchers.py compares.
Where no systemd runs, it re-runs itself in the project's box, as `python -m bench` does.
Writes `<out>/<date>-lightning.md` and `.json`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import procs

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "ranks" / "lightning_fail.py"
STRATEGIES = ("ddp", "gpulaunch")
LABELS = {"ddp": 'Lightning strategy="ddp"', "gpulaunch": 'strategy="gpulaunch"'}
FAIL_RANK = 1
# (name, seconds rank 0 is busy outside any collective in the failing step)
CASES = (("while rank 0 waits in the all-reduce", 0.0), ("while rank 0 is busy for 20 s", 20.0))


def _once(strategy: str, cap: float, busy: float) -> dict[str, Any]:
    token = f"bench_lightning_{uuid.uuid4().hex[:10]}"
    with tempfile.TemporaryDirectory(prefix="bench-lightning-", dir=REPO / ".it-tmp") as d:
        os.chmod(d, 0o755)
        argv = [sys.executable, str(SCRIPT), "--dir", d, "--strategy", strategy, "--token", token]
        argv += ["--busy", str(busy)]
        env = dict(os.environ, **{procs.TOKEN_VAR: token})
        started = time.monotonic()
        with open(Path(d, "stderr"), "w+") as err:
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=REPO)
            scanner = procs.JobScanner(token, exclude=frozenset({proc.pid}))
            stamp = None
            up: dict[int, tuple[float, int]] = {}
            zombie_at: float | None = None  # the failing rank exited, not yet reaped
            reaped_at: float | None = None
            rank_gone_at: float | None = None  # the failing rank exited (a zombie counts)
            while proc.poll() is None and time.monotonic() - started < cap:
                if stamp is None:
                    stamp = procs.read_stamps_pids(Path(d), "fail").get(FAIL_RANK)
                    up = procs.read_stamps_pids(Path(d), "up")
                elif reaped_at is None:
                    state = procs._state(stamp[1])
                    if state in (None, "Z", "X") and rank_gone_at is None:
                        rank_gone_at = time.time()
                    if state == "Z" and zombie_at is None:
                        zombie_at = time.time()
                    if state is None:
                        reaped_at = time.time()
                time.sleep(0.005)  # measurement code: a short fixed poll, on purpose
            exited_at = time.time()
            ended = proc.poll() is not None
            if stamp is None:
                stamp = procs.read_stamps_pids(Path(d), "fail").get(FAIL_RANK)
            left_at_exit = scanner.pids()
            time.sleep(1.0)
            left_after_1s = scanner.pids()
            killed = procs.kill_token(token) if (left_after_1s or not ended) else 0
            if not ended:
                proc.kill()
            proc.wait()
            err.seek(0)
            stderr = err.read()
    named = f"rank {FAIL_RANK} exit 7" in stderr
    return {
        "strategy": strategy,
        "busy": busy,
        "ended": ended,
        "status": proc.returncode if ended else None,
        "exit_s": (exited_at - stamp[0]) if (ended and stamp) else None,
        # the failing rank's own share (its exception handling and teardown), and the rest
        "rank_gone_s": (rank_gone_at - stamp[0]) if (rank_gone_at and stamp) else None,
        "reaction_s": (exited_at - rank_gone_at) if (ended and rank_gone_at) else None,
        "report_names_rank": named,
        "left_at_exit": len(left_at_exit),
        # how long the failing rank stayed a zombie while `python train.py` ran
        "zombie_s": None if zombie_at is None else (reaped_at or exited_at) - zombie_at,
        "ranks_up": len(up),
        "left_after_1s": len(left_after_1s),
        "killed_after": killed,
        "failed_stamp": stamp is not None,
    }


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def _row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    times = [r["exit_s"] for r in runs if r["exit_s"] is not None]
    return {
        "median_rank_gone_s": _median(runs, "rank_gone_s"),
        "median_reaction_s": _median(runs, "reaction_s"),
        "runs": len(runs),
        "ended": sum(r["ended"] for r in runs),
        "median_exit_s": statistics.median(times) if times else None,
        "max_exit_s": max(times) if times else None,
        "statuses": sorted({r["status"] for r in runs}, key=str),
        "report_names_rank": sum(r["report_names_rank"] for r in runs),
        "left_at_exit": max(r["left_at_exit"] for r in runs),
        "left_after_1s": max(r["left_after_1s"] for r in runs),
        "max_zombie_s": max((r["zombie_s"] or 0.0) for r in runs),
    }


def _status(code: int | None) -> str:
    if code is None:
        return "none (still running)"
    return f"killed by signal {-code} ({128 - code} in a shell)" if code < 0 else str(code)


def _markdown(cases: dict[str, dict[str, dict[str, Any]]], meta: dict[str, Any]) -> str:
    def fmt(v: float | None) -> str:
        return "—" if v is None else f"{v:.2f}"

    lines = [
        '# Lightning\'s launcher against strategy="gpulaunch" (issue 31)',
        "",
        f"{meta['date']}, commit {meta['commit']}, {meta['reps']} runs each, interleaved; "
        f"load average at the start {meta['loadavg']} on {meta['cpus']} CPUs (a machine shared "
        "by other work: compare the columns, not the absolute times).",
        "",
        "`python bench/ranks/lightning_fail.py`: Trainer, 2 CPU ranks (gloo), rank 1 calls "
        "sys.exit(7) in step 5, while rank 0 waits for it in the step's all-reduce, or while "
        "rank 0 spends 20 s in that step on its own (a checkpoint, an evaluation) and learns "
        "of the failure only at its next collective. `python -m bench.lightning` "
        "(bench/lightning.py says what each row is).",
    ]
    cells = {
        "failure → `python train.py` exit, median (s)": lambda r: fmt(r["median_exit_s"]),
        "… max (s)": lambda r: fmt(r["max_exit_s"]),
        "failure → failing rank's process exited, median (s)": lambda r: fmt(
            r["median_rank_gone_s"]
        ),
        "failing rank exited → `python train.py` exit, median (s)": lambda r: fmt(
            r["median_reaction_s"]
        ),
        "runs ended within the cap": lambda r: f"{r['ended']}/{r['runs']}",
        "exit status of `python train.py`": lambda r: ", ".join(map(_status, r["statuses"])),
        "report names rank 1 and its exit 7": lambda r: f"{r['report_names_rank']}/{r['runs']}",
        "job processes left at its exit (max)": lambda r: str(r["left_at_exit"]),
        "… 1 s later (max)": lambda r: str(r["left_after_1s"]),
        "failing rank left a zombie, unreaped, for at most (s)": lambda r: fmt(r["max_zombie_s"]),
    }
    for case, rows in cases.items():
        lines += ["", f"## Rank 1 fails {case}", ""]
        lines += ["| | " + " | ".join(LABELS[s] for s in STRATEGIES) + " |"]
        lines += ["|---|" + "---|" * len(STRATEGIES)]
        for name, cell in cells.items():
            lines.append(f"| {name} | " + " | ".join(cell(rows[s]) for s in STRATEGIES) + " |")
        lines.append("")
        for key, what in (("median_exit_s", "failure → exit"), ("median_reaction_s", "reaction")):
            ddp, ours = rows["ddp"][key], rows["gpulaunch"][key]
            if ddp and ours:
                lines.append(
                    f"- ratio of the medians, {what} (gpulaunch / Lightning): {ours / ddp:.2f}."
                )
    return "\n".join(lines) + "\n"


def _in_box(argv: Sequence[str]) -> int:
    from sdbox import host_systemd_running

    if host_systemd_running():
        return -1
    print("bench.lightning: no systemd runs here: booting the project's box", file=sys.stderr)
    os.chdir(REPO)
    cmd = [sys.executable, "-m", "sdbox", "run", "--"]
    return subprocess.call([*cmd, sys.executable, "-m", "bench.lightning", *argv])


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m bench.lightning", description=__doc__)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--cap", type=float, default=120.0, help="seconds before a run is given up")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = p.parse_args(args_list)
    code = _in_box(args_list)
    if code >= 0:
        return code
    (REPO / ".it-tmp").mkdir(exist_ok=True)
    runs: list[dict[str, Any]] = []
    loadavg = " ".join(f"{x:.1f}" for x in os.getloadavg())
    for case, busy in CASES:
        for rep in range(args.reps):
            for strategy in STRATEGIES if rep % 2 == 0 else reversed(STRATEGIES):
                run = {"case": case, **_once(strategy, args.cap, busy)}
                print(f"rep {rep + 1}/{args.reps} {run}", file=sys.stderr)
                runs.append(run)
    rows = {
        case: {
            s: _row([r for r in runs if (r["case"], r["strategy"]) == (case, s)])
            for s in STRATEGIES
        }
        for case, _ in CASES
    }
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()
    meta = {
        "date": datetime.date.today().isoformat(),
        "commit": commit or "?",
        "reps": args.reps,
        "loadavg": loadavg,
        "cpus": os.cpu_count(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"{meta['date']}-lightning"
    stem.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "rows": rows, "runs": runs}, indent=2) + "\n"
    )
    text = _markdown(rows, meta)
    stem.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
