"""`python -m bench [--quick] [--only N[,N...]] [--launchers L[,L...]] [--reps N] [--out DIR]`;
`python -m bench soak` (bench/soak/).

Runs the scenarios of bench/scenarios/ under gpulaunch (its systemd supervisor, its
direct supervisor, and an ordinary user's job through the front end, where the scenario
applies) and under `torchrun --standalone` (and scenario 7, three nodes on loopback,
under gpulaunch's and torchrun's multi-node options) and
writes `<out>/<date>[-TAG].md` and `.json` (full run: bench/results/; --quick:
bench/.scratch/, a smoke test that asserts no timing). Where the host runs no
systemd, it re-runs itself inside the project's throwaway systemd
(`python -m sdbox run -- python -m bench ...`), so both launchers run in the same box.
Scenarios in the VM lab (11: restart in a container against podman restarting it) run
only when --only names them, and on the host: the VM is their systemd.

Exit status: 0 when every scenario ran to its end (whatever the numbers), 1 when one
crashed, 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

from bench import frontend, machine
from bench.context import Config, Context
from bench.launchers import LAUNCHERS, Launcher
from bench.report import Results, as_json, markdown, table
from bench.scenarios import SCENARIOS, Scenario

KEYS = [s.key for s in SCENARIOS]
VM_KEYS = [s.key for s in SCENARIOS if s.vm]

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
SCRATCH = REPO / "bench" / ".scratch"
WORKTREE = "worktree"
# What gpulaunch reads from the checkout: the package, its unit templates (units/), the D-Bus
# interface files it finds next to the package (packaging/dbus).
SNAPSHOT_PARTS = ("gpulaunch", "packaging", "units")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 repetition, small sizes (smoke test)")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="N[,N]",
        help=f"run only these scenarios ({', '.join(KEYS)}); repeatable; those in the VM lab "
        f"({', '.join(VM_KEYS)}) run only when named",
    )
    p.add_argument(
        "--launchers",
        action="append",
        default=[],
        metavar="L[,L]",
        help=f"run only these launchers ({', '.join(LAUNCHERS)}); repeatable; torchrun always",
    )
    p.add_argument("--tag", help="name the results <date>-TAG.md and .json")
    p.add_argument("--reps", type=int, help="repetitions per launcher (default: 5, quick: 1)")
    p.add_argument(
        "--nodes-reps", type=int, help="repetitions of scenario 8's node counts (default: 1)"
    )
    p.add_argument("--out", type=Path, help="directory for <date>.md and .json")
    p.add_argument(
        "--snapshot",
        metavar="REV",
        help="benchmark a copy of gpulaunch/, packaging/ made at the start, first on "
        "PYTHONPATH: "
        "as committed in REV (e.g. HEAD; git archive), or 'worktree' (as they are now), so "
        "that edits made while the benchmark runs do not change what it measures",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["soak"]:  # the fault soak: bench/soak/
        from bench.soak.cli import main as soak

        return soak(args_list[1:])
    args = _parser().parse_args(args_list)
    only = {n for item in args.only for n in item.split(",") if n}
    if not only <= set(KEYS):
        print(
            f"bench: error: no scenario {', '.join(sorted(only - set(KEYS)))}; "
            f"they are {', '.join(KEYS)}, e.g. --only 1,1r,3",
            file=sys.stderr,
        )
        return 2
    wanted = {n for item in args.launchers for n in item.split(",") if n}
    if not wanted <= set(LAUNCHERS):
        print(
            f"bench: error: no launcher {', '.join(sorted(wanted - set(LAUNCHERS)))}; "
            f"they are {', '.join(LAUNCHERS)}",
            file=sys.stderr,
        )
        return 2
    chosen = tuple(x for x in LAUNCHERS if not wanted or x in wanted or not x.ours)
    in_vm_only = bool(only) and only <= set(VM_KEYS)
    if not in_vm_only and not _systemd_running():
        return _rerun_in_box(args_list)
    config = Config.quick() if args.quick else Config()
    if args.reps is not None:
        config = _with_reps(config, args.reps)
    if args.nodes_reps is not None:
        config = replace(config, nodes_reps=max(args.nodes_reps, 1))
    out = args.out or (SCRATCH / "quick" if args.quick else RESULTS)
    mode = "quick" if args.quick else "full"
    return _run(config, only, chosen, out, mode, args_list, args.snapshot, args.tag)


def selected(only: set[str]) -> list[Scenario]:
    """The scenarios --only names; without it, every one but those in the VM lab."""
    return [s for s in SCENARIOS if s.key in only or (not only and not s.vm)]


def _systemd_running() -> bool:
    from sdbox import host_systemd_running  # inside the box, the box's systemd is PID 1

    return host_systemd_running()


def _rerun_in_box(args: list[str]) -> NoReturn:
    print("bench: no systemd runs here: booting the project's box (sdbox)", file=sys.stderr)
    os.chdir(REPO)  # sdbox binds the current directory into the box
    os.environ[machine.IN_BOX] = "1"
    argv = [sys.executable, "-m", "sdbox", "run", "--", sys.executable, "-m", "bench", *args]
    os.execv(sys.executable, argv)


def _with_reps(config: Config, reps: int) -> Config:
    return replace(config, reps=max(reps, 1))


def _run(
    config: Config,
    only: set[str],
    chosen: tuple[Launcher, ...],
    out: Path,
    mode: str,
    args: list[str],
    snapshot: str | None,
    tag: str | None,
) -> int:
    shutil.rmtree(SCRATCH, ignore_errors=True)
    SCRATCH.mkdir(parents=True)
    ctx = Context(config=config, scratch=SCRATCH)
    started = time.monotonic()
    results = Results(
        date=time.strftime("%Y-%m-%d"),
        started_at=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        mode=mode,
        command=" ".join(["python -m bench", *args]),
        machine=machine.describe(),
        config=config.as_dict(),
    )
    if snapshot is not None:
        try:
            ctx.launch_env["PYTHONPATH"] = str(_export(snapshot))
        except subprocess.CalledProcessError as exc:
            print(f"bench: error: cannot export {snapshot}: {exc.stderr.strip()}", file=sys.stderr)
            return 2
        results.machine["gpulaunch"] = _snapshot_label(snapshot)
    scenarios = selected(only)
    if scenarios and all(s.vm for s in scenarios) and not os.environ.get(machine.IN_BOX):
        results.machine["where"] = "the host (the scenarios boot the VM lab, sdbox/vm)"
    chosen = tuple(x for x in chosen if any(x in s.launchers for s in scenarios))
    if Launcher.FRONTEND in chosen:
        try:
            frontend.prepare(SCRATCH, bool(os.environ.get(machine.IN_BOX)))
        except frontend.Unavailable as exc:
            ctx.problem(f"gpulaunch frontend not measured: {exc}")
            chosen = tuple(x for x in chosen if x is not Launcher.FRONTEND)
    if not _warm_up(ctx, chosen):
        print("bench: error: a launcher cannot run a trivial job; see above", file=sys.stderr)
        return 1
    crashed = False
    for scenario in scenarios:
        ctx.launchers = tuple(x for x in scenario.launchers if x in chosen)
        ctx.say(f"scenario {scenario.key}: {scenario.name} ({', '.join(ctx.launchers)})")
        t0, cpu0, first_run = time.monotonic(), machine.read_cpu(), len(ctx.run_loads)
        try:
            metrics = scenario.run(ctx)
        except Exception:
            crashed = True
            ctx.problem(f"scenario {scenario.key} crashed: {traceback.format_exc()}")
            continue
        other_s, share = machine.other_load(cpu0, machine.read_cpu())
        took = time.monotonic() - t0
        results.load.append(
            f"scenario {scenario.key} ({took:.0f} s): other work on the machine used "
            f"{other_s:.1f} CPU s, {share:.0%} of its CPUs" + _busy_runs(ctx.run_loads[first_run:])
        )
        ctx.say(f"scenario {scenario.key} took {took:.0f} s; {results.load[-1]}")
        results.scenarios.append((scenario, metrics))
    results.total_s = time.monotonic() - started
    results.machine["load average at the end"] = machine.loadavg()
    results.problems = ctx.problems
    results.run_loads = [(what, str(launcher), share) for what, launcher, share in ctx.run_loads]
    out.mkdir(parents=True, exist_ok=True)
    stem = results.date + (f"-{tag}" if tag else "")
    md, js = out / f"{stem}.md", out / f"{stem}.json"
    md.write_text(markdown(results))
    js.write_text(as_json(results))
    ctx.say(f"done in {results.total_s:.0f} s: {md} and {js}")
    print(table(results.scenarios), file=sys.stderr)
    return 1 if crashed else 0


BUSY = 0.25  # a run during which other work used more than this share of the CPUs


def _busy_runs(loads: list[tuple[str, Launcher, float]]) -> str:
    """Which runs other work disturbed most, e.g. '; busy runs: fail/torchrun 48%'."""
    busy = [f"{what} {launcher} {share:.0%}" for what, launcher, share in loads if share > BUSY]
    if not busy:
        return f"; no run above {BUSY:.0%}"
    return f"; {len(busy)} of {len(loads)} runs above {BUSY:.0%}: " + ", ".join(busy)


def _export(rev: str) -> Path:
    """gpulaunch/ and what it reads next to it, as committed in `rev` (or as it is now).

    The templates and D-Bus interface files are found next to the package, so all go there.
    """
    dest = SCRATCH / "snapshot"
    dest.mkdir()
    if rev == WORKTREE:
        for part in SNAPSHOT_PARTS:
            if (REPO / part).is_dir():
                ignore = shutil.ignore_patterns("__pycache__")
                shutil.copytree(REPO / part, dest / part, ignore=ignore)
        return dest
    tree = subprocess.run(
        ["git", "ls-tree", "--name-only", rev],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", rev, *(p for p in SNAPSHOT_PARTS if p in tree)],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _snapshot_label(rev: str) -> str:
    head = machine.command("git", "rev-parse", "--short", "HEAD")
    if rev != WORKTREE:
        return (
            f"commit {machine.command('git', 'rev-parse', '--short', rev)} ({rev}), via git archive"
        )
    digest = hashlib.sha256()
    for path in sorted((SCRATCH / "snapshot").rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(SCRATCH)).encode() + path.read_bytes())
    return (
        f"the working tree's {', '.join(SNAPSHOT_PARTS)} as copied at the start (commit {head} + "
        f"uncommitted changes; sha256 of the copy {digest.hexdigest()[:12]})"
    )


def _warm_up(ctx: Context, chosen: tuple[Launcher, ...]) -> bool:
    """Untimed: bring torch and the launchers into the page cache; False if one fails."""
    ctx.say("warm-up (not measured)")
    subprocess.run([sys.executable, "-c", "import torch"], check=False)
    ok = True
    for launcher in chosen:
        run = ctx.start(launcher, 2, "hello", [], "warm", capture=True)
        run.drain(ctx.config.run_cap_s)
        ctx.check_status(run, "warm-up", {0})
        ok = ok and run.returncode == 0
        ctx.finish(run, "warm-up")
    return ok
