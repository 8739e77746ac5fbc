"""7. Cross-node stop: 3 nodes of 2 gloo ranks each; global rank 3, on node 1, raises.

The nodes are three launchers on this machine, one per node, joined by the static
rendezvous that node 0 serves on loopback (a free port per run; the command lines are
in bench/launchers.py; no restarts, gpulaunch with `--grace 10`). Every rank stamps its
pid first; after 3 all-reduces rank 3 stamps the time and raises
(bench/ranks/node_fail.py) while the ranks of the other nodes are
- collective: waiting in the next all-reduce, which rank 3 never joins (gloo may see
  rank 3's connections close and fail them by itself);
- busy: sleeping, standing in for a long compute step: nothing in the ranks notices.

Measured from rank 3's stamp: until every rank process of nodes 0 and 2 is gone (the
later of the two nodes; one pidfd per stamped pid, pidfd_open(2), so no polling), and
until all three launchers have exited. We wait at most `node_cap_s` after the failure;
what is still there then counts as not gone (not exited), and we kill it: every
process carrying the node's token, and for gpulaunch the node's slice. The notes give
each node's exit status, and what each node's report named as the cause: gpulaunch's
headline (checked for node 1 and rank 3), torchrun's "Root Cause" rank.
"""

from __future__ import annotations

import os
import re
import select
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import launchers, procs
from bench.context import Context, fmt
from bench.launchers import Launcher, Node, Run
from bench.stats import Judge, Metric, Summary, compared

NNODES = 3
NPROC = 2  # ranks per node
FAIL_NODE, FAIL_RANK = 1, 3
OTHER_NODES = (0, 2)
VARIANTS = ("collective", "busy")  # bench/ranks/node_fail.py --mode
KEYS = {"collective": ("7a", "7b"), "busy": ("7c", "7d")}  # rows: ranks gone, launchers exited
POLL_S = 0.005  # how often stamp files are looked for; exits are events (pidfds)
EXPECTED_STATUS = 1  # the failing rank's exit status: every node should exit with it


@dataclass
class Outcome:
    """One run of the three nodes: seconds from rank 3's stamp; None: not within the cap."""

    gone: dict[int, float | None] = field(default_factory=dict)  # node → all its ranks gone
    failed_gone: float | None = None  # rank 3's own process gone: no launcher can act before
    exits: dict[int, float | None] = field(default_factory=dict)  # node → its launcher exited
    statuses: dict[int, int | None] = field(default_factory=dict)  # None: killed at the cap
    causes: dict[int, str] = field(default_factory=dict)  # node → what its report named
    named: dict[int, bool] = field(default_factory=dict)  # gpulaunch: node 1 and rank 3 named
    capped: bool = False
    broken: bool = False  # the run did not get to a measurement (a problem says why)

    @property
    def others_gone(self) -> float | None:
        return _latest([self.gone.get(n) for n in OTHER_NODES])

    @property
    def all_exited(self) -> float | None:
        return _latest([self.exits.get(n) for n in range(NNODES)])


def _latest(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present and len(present) == len(values) else None


def run(ctx: Context) -> list[Metric]:
    cfg = ctx.config
    rows: dict[str, tuple[Metric, Metric]] = {}
    for variant in VARIANTS:
        gone_key, exited_key = KEYS[variant]
        gone = Metric(
            gone_key,
            f"cross-node, {variant}: failure → ranks of nodes 0 and 2 gone",
            "s",
            missing_label=f"not gone after {cfg.node_cap_s:g} s",
        )
        exited = Metric(
            exited_key,
            f"cross-node, {variant}: failure → all 3 launchers exited",
            "s",
            missing_label=f"not exited after {cfg.node_cap_s:g} s",
        )
        gone.judge, exited.judge = _judge(gone.missing_label), _judge(exited.missing_label)
        rows[variant] = (gone, exited)
    outcomes: dict[tuple[str, Launcher], list[Outcome]] = {}
    for rep in range(cfg.reps):
        for variant in VARIANTS:
            for launcher in ctx.order(rep):
                o = _once(ctx, launcher, variant)
                ctx.say(f"7 cross-node rep {rep + 1}/{cfg.reps} {variant} {launcher}: {_line(o)}")
                if o.broken:
                    continue
                outcomes.setdefault((variant, launcher), []).append(o)
                gone, exited = rows[variant]
                gone.add(launcher, o.others_gone)
                exited.add(launcher, o.all_exited)
    for variant, (gone, exited) in rows.items():
        for launcher in ctx.launchers:
            done = outcomes.get((variant, launcher), [])
            for n in OTHER_NODES:
                gone.extra[f"{launcher} node {n}: ranks gone"] = [o.gone.get(n) for o in done]
            gone.extra[f"{launcher} node {FAIL_NODE}: rank {FAIL_RANK}'s own process gone"] = [
                o.failed_gone for o in done
            ]
            for n in range(NNODES):
                exited.extra[f"{launcher} node {n}: launcher exit"] = [o.exits.get(n) for o in done]
            broken = cfg.reps - len(done)
            exited.notes += _notes(launcher, done, broken, cfg.node_cap_s)
    return [metric for pair in rows.values() for metric in pair]


def _line(o: Outcome) -> str:
    if o.broken:
        return "broke down (see the problems)"
    gone = ", ".join(f"node {n} {fmt(o.gone.get(n))}" for n in OTHER_NODES)
    exits = ", ".join(f"{n} {fmt(o.exits.get(n))}" for n in range(NNODES))
    statuses = "/".join(_status(o.statuses.get(n)) for n in range(NNODES))
    return (
        f"rank {FAIL_RANK} gone {fmt(o.failed_gone)} s, "
        f"other nodes' ranks gone {fmt(o.others_gone)} s ({gone}), launchers exited "
        f"{fmt(o.all_exited)} s ({exits}), statuses {statuses}"
    )


def _status(status: int | None) -> str:
    return "killed" if status is None else str(status)


def _notes(launcher: Launcher, done: list[Outcome], broken: int, cap: float) -> list[str]:
    """Per launcher: statuses per run, the cap, and what each node's report named."""
    statuses = ", ".join("/".join(_status(o.statuses.get(n)) for n in range(NNODES)) for o in done)
    notes = [
        f"{launcher}: exit status of nodes 0/1/2, per run (killed: still running "
        f"{cap:g} s after the failure, killed by us): {statuses or '-'}"
    ]
    capped = sum(1 for o in done if o.capped)
    if capped:
        notes.append(f"{launcher}: something was left {cap:g} s after the failure in {capped} runs")
    if broken:
        notes.append(f"{launcher}: {broken} runs broke down before a measurement (see problems)")
    for n in range(NNODES):
        seen = Counter(o.causes.get(n, "-") for o in done)
        said = "; ".join(f"“{text}” ×{count}" for text, count in seen.most_common())
        if launcher.ours:
            named = sum(1 for o in done if o.named.get(n))
            notes.append(
                f"gpulaunch node {n}'s report names node {FAIL_NODE} and rank {FAIL_RANK} in "
                f"{named}/{len(done)} runs; its headline: {said}"
            )
        else:
            notes.append(f"torchrun node {n}'s report: {said}")
    return notes


def _judge(missing: str) -> Judge:
    """Who is faster; and how often a launcher did not get there within the cap."""
    timed = compared("time")

    def check(ours: Summary, theirs: Summary) -> str:
        verdict = timed.check(ours, theirs)
        for who, s in (("", ours), ("torchrun: ", theirs)):
            if s.missing:
                verdict += f"; {who}{missing} in {s.missing}/{s.n} runs"
        return verdict

    return Judge(timed.target, check)


def _once(ctx: Context, launcher: Launcher, variant: str) -> Outcome:
    rdzv_id = launchers.new_token("node")
    port = launchers.free_port()
    d = ctx.run_dir("node")
    runs: list[Run] = []
    outcome = Outcome(broken=True)
    try:
        for n in range(NNODES):
            node_dir = d / f"node{n}"
            node_dir.mkdir()
            args = ["--dir", str(node_dir), "--mode", variant, "--fail-rank", str(FAIL_RANK)]
            node = Node(n, NNODES, port, rdzv_id)
            runs.append(ctx.start_node(launcher, node, NPROC, "node_fail", args))
        outcome = _watch(ctx, runs, d, variant)
        if not outcome.broken:
            _read_reports(ctx, runs, outcome, variant)
        return outcome
    finally:
        # What is left after the cap (torchrun's busy ranks) is part of the result, not a
        # problem of the run: the notes count it.
        for n, r in enumerate(runs):
            ctx.finish(r, f"cross-node {variant} node {n}", leftovers_expected=outcome.capped)


def _watch(ctx: Context, runs: list[Run], d: Path, variant: str) -> Outcome:
    """Wait for rank 3's stamp, then for the other nodes' ranks and every launcher to end."""
    what = f"cross-node {variant} ({runs[0].launcher})"
    cap = ctx.config.node_cap_s
    deadline = time.monotonic() + ctx.config.run_cap_s  # until the failure: runaway only
    pidfds: dict[int, int] = {}  # pidfd → node: ranks of nodes 0 and 2, and rank 3, still there
    gone_at: dict[int, list[float]] = {n: [] for n in (*OTHER_NODES, FAIL_NODE)}
    watching = False
    failed_at: float | None = None
    capped = False
    try:
        while True:
            if failed_at is None:
                stamp = procs.read_stamps_pids(d / f"node{FAIL_NODE}", "fail").get(FAIL_RANK)
                if stamp is not None:
                    failed_at = stamp[0]
                    deadline = time.monotonic() + (failed_at + cap - time.time())
            if not watching:
                opened = _open_pidfds(ctx, runs, d, what)
                if opened is None:
                    return Outcome(broken=True)
                pidfds, watching = opened, bool(opened)
            live = [r for r in runs if r.exited_at is None]
            if failed_at is None and len(live) < len(runs):
                ended = ", ".join(
                    f"node {n} status {r.returncode}" for n, r in enumerate(runs) if r not in live
                )
                ctx.problem(f"{what}: a launcher exited before rank {FAIL_RANK} failed: {ended}")
                return Outcome(broken=True)
            if failed_at is not None and watching and not pidfds and not live:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                if failed_at is None:
                    ctx.problem(f"{what}: rank {FAIL_RANK} did not fail within the run cap")
                    return Outcome(broken=True)
                capped = True
                break
            timeout = left if failed_at is not None and watching else min(left, POLL_S)
            ready, _, _ = select.select([*pidfds, *(r.pidfd for r in live)], [], [], timeout)
            now = time.time()
            for fd in ready:
                if fd in pidfds:
                    gone_at[pidfds.pop(fd)].append(now)
                    os.close(fd)
            for r in live:
                if r.pidfd in ready:
                    r.wait_exit(0)
    finally:
        for fd in pidfds:
            os.close(fd)
    assert failed_at is not None
    outcome = Outcome(capped=capped)
    for n in OTHER_NODES:
        times = gone_at[n]
        outcome.gone[n] = max(times) - failed_at if len(times) == NPROC else None
    failed_gone = gone_at[FAIL_NODE]
    outcome.failed_gone = failed_gone[0] - failed_at if failed_gone else None
    for n, r in enumerate(runs):
        outcome.exits[n] = None if r.exited_at is None else r.exited_at - failed_at
        outcome.statuses[n] = None if r.exited_at is None else r.returncode
    early = [t - failed_at for times in gone_at.values() for t in times if t < failed_at]
    if early:
        ctx.problem(f"{what}: ranks were gone {min(early):.3f} s before rank {FAIL_RANK}'s stamp")
    return outcome


def _open_pidfds(ctx: Context, runs: list[Run], d: Path, what: str) -> dict[int, int] | None:
    """Once every rank has stamped its pid: pidfds of nodes 0 and 2's ranks and of rank 3.

    {} while some rank has not stamped yet; None when the run cannot be measured.
    """
    stamps = {n: procs.read_stamps_pids(d / f"node{n}", "pid") for n in range(NNODES)}
    if any(len(s) < NPROC for s in stamps.values()):
        return {}
    if FAIL_RANK not in stamps[FAIL_NODE]:
        ctx.problem(f"{what}: rank {FAIL_RANK} is not on node {FAIL_NODE}: {stamps}")
        return None
    watched = [(n, rank, pid) for n in OTHER_NODES for rank, (_, pid) in stamps[n].items()]
    watched.append((FAIL_NODE, FAIL_RANK, stamps[FAIL_NODE][FAIL_RANK][1]))
    pidfds: dict[int, int] = {}
    for n, rank, pid in watched:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            fd = -1
        # The pid is the rank's only if it still carries the node's token: not reused.
        if fd < 0 or runs[n].token.encode() not in (procs.cmdline(pid) or b""):
            if fd >= 0:
                os.close(fd)
            for other in pidfds:
                os.close(other)
            ctx.problem(f"{what}: rank {rank} of node {n} was gone before it was watched")
            return None
        pidfds[fd] = n
    return pidfds


def _read_reports(ctx: Context, runs: list[Run], outcome: Outcome, variant: str) -> None:
    """What each node's launcher said caused the job's end; its status if not the expected."""
    for n, r in enumerate(runs):
        text = launchers.stderr_text(r, ctx.scratch)
        if r.exited_at is not None:
            ctx.check_status(r, f"cross-node {variant} node {n}", {EXPECTED_STATUS})
        if r.launcher is Launcher.TORCHRUN:
            outcome.causes[n] = _torchrun_cause(text)
            continue
        headline = _gpulaunch_headline(text, r.token)
        outcome.causes[n] = headline or "no report"
        outcome.named[n] = headline is not None and _names_failure(n, headline, text)
        if r.exited_at is not None and not outcome.named[n]:
            ctx.problem(
                f"cross-node {variant} node {n} (gpulaunch): the report does not name node "
                f"{FAIL_NODE} and rank {FAIL_RANK}: {outcome.causes[n]}"
            )


def _gpulaunch_headline(text: str, job: str) -> str | None:
    """The report's first line without `gpulaunch: job JOB `, e.g. `failed: rank 3 exit 1 ...`."""
    pattern = rf"^gpulaunch: job {re.escape(job)} ((?:failed|stopped|succeeded)\b.*)$"
    found = re.findall(pattern, text, re.MULTILINE)
    return found[-1] if found else None


def _names_failure(node: int, headline: str, text: str) -> bool:
    """Node 1's own report names rank 3 (its nodes line says it is node 1); others name both."""
    if not re.search(rf"\brank {FAIL_RANK}\b", headline):
        return False
    if node == FAIL_NODE:
        return f"node {FAIL_NODE} of {NNODES};" in text
    return re.search(rf"\bnode {FAIL_NODE}\b", headline) is not None


def _torchrun_cause(text: str) -> str:
    """The global rank and exit code under torchrun's "Root Cause (first observed failure)"."""
    m = re.search(
        r"Root Cause \(first observed failure\):.*?\brank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)",
        text,
        re.DOTALL,
    )
    return f"root cause rank {m[1]} exitcode {m[2]}" if m else "no report"
