"""`python -m bench soak [--jobs N] [--seed S] [--first I] [--only FAULT,...] [--out DIR]`.

Runs N short gpulaunch jobs, each with one fault drawn from the seed (bench/soak/plan.py),
checks every end against the README's rules and that nothing of the job is left
(bench/soak/judge.py), prints the table and writes `<out>/<date>-soak.md` and `.json`
(default bench/results/). As root under systemd; where no systemd runs, it re-runs itself
in the project's box (sdbox) and installs gpulaunch's D-Bus policy there.

Exit status: 0 when no job failed a check, 1 when one did (or the soak could not inject a
fault), 2 for a bad command line or a machine it cannot run on.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench import frontend, machine
from bench.soak.judge import judge
from bench.soak.plan import DIRECT, FAULTS, FRONTEND, RESTARTS, Fault, draw
from bench.soak.runner import Bounds, prepare_direct, run_job
from bench.soak.tally import JobResult, Soak, as_json, markdown, replay, table

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
POLICY = "io.gpulaunch.conf"
POLICY_DIRS = (Path("/etc/dbus-1/system.d"), Path("/usr/share/dbus-1/system.d"))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=40, help="how many jobs (default 40)")
    p.add_argument("--seed", type=int, default=1, help="decides every job's fault (default 1)")
    p.add_argument("--first", type=int, default=0, metavar="I", help="index of the first job")
    p.add_argument(
        "--only",
        default="",
        metavar="FAULT[,FAULT]",
        help="draw only these faults: " + ", ".join(FAULTS),
    )
    p.add_argument("--out", type=Path, default=RESULTS, help="where <date>-soak.md/.json go")
    p.add_argument(
        "--snapshot",
        metavar="REV",
        help="soak gpulaunch as committed in REV (git archive, first on PYTHONPATH)",
    )
    p.add_argument("--hang", type=float, default=Bounds.hang_s, help="seconds until a job hangs")
    return p


def main(argv: Sequence[str]) -> int:
    args_list = list(argv)
    args = _parser().parse_args(args_list)
    try:
        kinds = tuple(Fault(k) for k in args.only.split(",") if k) or FAULTS
    except ValueError:
        print(f"bench soak: error: --only takes faults among {', '.join(FAULTS)}", file=sys.stderr)
        return 2
    if args.jobs < 1 or args.first < 0 or args.hang <= 0:
        print("bench soak: error: --jobs and --hang must be positive", file=sys.stderr)
        return 2
    from sdbox import host_systemd_running

    if not host_systemd_running():
        print("bench soak: no systemd runs here: booting the project's box", file=sys.stderr)
        os.chdir(REPO)
        os.environ[machine.IN_BOX] = "1"
        sdbox = [sys.executable, "-m", "sdbox", "run", "--"]
        os.execv(sys.executable, [*sdbox, sys.executable, "-m", "bench", "soak", *args_list])
    if os.geteuid() != 0:
        print("bench soak: error: run it as root (it restarts dbus and journald)", file=sys.stderr)
        return 2
    problem = _job_api_ready(kinds)
    if problem:
        print(f"bench soak: error: {problem}", file=sys.stderr)
        return 2
    return _soak(args, kinds, args_list)


def _prepare(kinds: tuple[Fault, ...], scratch: Path) -> str | None:
    """The front end's user and the direct watchers' cgroups, where kinds need them."""
    users = [k for k in kinds if k in FRONTEND or k is Fault.DIRECT_SIGKILL_PGROUP]
    if users:
        try:
            frontend.prepare(scratch, bool(os.environ.get(machine.IN_BOX)))
        except frontend.Unavailable as exc:
            return f"{', '.join(users)}: {exc}; leave them out with --only"
    if any(k in DIRECT for k in kinds):
        prepare_direct()
    return None


def _job_api_ready(kinds: tuple[Fault, ...]) -> str | None:
    """`gpulaunch stop` needs the job API's D-Bus policy: installed in our own box."""
    if Fault.GPULAUNCH_STOP not in kinds or any((d / POLICY).exists() for d in POLICY_DIRS):
        return None
    if not os.environ.get(machine.IN_BOX):
        return (
            "gpulaunch's D-Bus policy is not installed, so `gpulaunch stop` cannot work; "
            "run `gpulaunch setup`, or leave gpulaunch-stop out with --only"
        )
    POLICY_DIRS[0].mkdir(parents=True, exist_ok=True)  # the box's /etc is its own
    shutil.copy(REPO / "packaging" / "dbus" / POLICY, POLICY_DIRS[0] / POLICY)
    subprocess.run(["systemctl", "reload", "dbus"], check=True)
    return None


def _soak(args: argparse.Namespace, kinds: tuple[Fault, ...], args_list: list[str]) -> int:
    (REPO / "bench" / ".scratch").mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="soak-", dir=REPO / "bench" / ".scratch"))
    try:
        problem = _prepare(kinds, scratch)
        if problem:
            print(f"bench soak: error: {problem}", file=sys.stderr)
            return 2
        return _soak_in(args, kinds, args_list, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _soak_in(
    args: argparse.Namespace, kinds: tuple[Fault, ...], args_list: list[str], scratch: Path
) -> int:
    soak = Soak(
        seed=args.seed,
        replay_args=" ".join(
            [
                *(["--only", args.only] if args.only else []),
                *(["--snapshot", args.snapshot] if args.snapshot else []),
            ]
        ),
        command=" ".join(["python -m bench soak", *args_list]),
        started_at=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        machine=machine.describe(),
    )
    env = {}
    if args.snapshot:
        try:
            env["PYTHONPATH"] = str(_export(args.snapshot, scratch / "snapshot"))
        except subprocess.CalledProcessError as exc:
            print(f"bench soak: error: cannot export {args.snapshot}: {exc}", file=sys.stderr)
            return 2
        rev = machine.command("git", "rev-parse", "--short", args.snapshot)
        soak.machine["gpulaunch"] = f"commit {rev} ({args.snapshot}), via git archive"
    started = time.monotonic()
    bounds = Bounds(hang_s=args.hang)
    for index in range(args.first, args.first + args.jobs):
        plan = draw(args.seed, index, kinds)
        job, seen, took = run_job(plan, scratch, bounds, env)
        result = JobResult(plan, job, seen, judge(plan, seen), took)
        soak.results.append(result)
        if plan.fault in RESTARTS and seen.acted and seen.action_rc != 0:
            soak.problems.append(f"job {index}: {plan.action()} exited {seen.action_rc}")
        _say(soak, result)
    soak.total_s = time.monotonic() - started
    soak.machine["load average at the end"] = machine.loadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"{time.strftime('%Y-%m-%d')}-soak"
    stem.with_suffix(".md").write_text(markdown(soak))
    stem.with_suffix(".json").write_text(as_json(soak))
    print(table(soak))
    for line in soak.problems:
        print(f"bench soak: problem: {line}", file=sys.stderr)
    print(f"bench soak: {stem}.md and .json, {soak.total_s:.0f} s", file=sys.stderr)
    return 0 if soak.ok() else 1


def _export(rev: str, dest: Path) -> Path:
    """gpulaunch/ and what it finds next to it (packaging/, units/), as committed in `rev`."""
    dest.mkdir()
    tree = subprocess.run(
        ["git", "ls-tree", "--name-only", rev], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    parts = [p for p in ("gpulaunch", "packaging", "units") if p in tree]
    archive = subprocess.run(
        ["git", "archive", "--format=tar", rev, *parts], cwd=REPO, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _say(soak: Soak, r: JobResult) -> None:
    end = "hang" if r.seen.returncode is None else f"exit {r.seen.returncode}"
    line = f"bench soak: job {r.plan.index} {r.plan.fault} ({r.plan.describe()}): {end}"
    if r.verdict.failed:
        line += " FAILED: " + "; ".join(r.verdict.reasons) + f"\n  replay: {replay(soak, r)}"
        tail = r.seen.stderr.rstrip().splitlines()[-6:]  # what the launcher said last
        line += "".join(f"\n  | {text}" for text in tail)
    print(f"{line} [{r.seconds:.1f} s]", file=sys.stderr, flush=True)
