"""Issue 27: where a multi-node start spends its time, per node, gpulaunch beside torchrun.

    .venv/bin/python -m bench.nodestart --nodes 2 8 --reps 3 [--out FILE.json]

Starts N launchers × 8 plain-Python ranks on loopback exactly as scenario 8 does
(bench/launchers.py's node command lines: static rendezvous, direct supervisor), alternating
gpulaunch and torchrun, with bench/nodestart_site/ on PYTHONPATH: its sitecustomize marks,
in every launcher and peer, when the interpreter is up, the imports begin, the peer is forked
and exec'd, the rendezvous handler is made (the store served or connected), the rendezvous
round ends, the layout reaches the watcher, and each rank is forked / exec'd (Popen for
torchrun). The ranks (bench/ranks/node_up.py) stamp their first statement. Once every rank
is up, every launcher gets SIGTERM. Prints the phases (medians over nodes and runs, ms from
each node's own launcher start) and the critical path (the last node) per N and launcher.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from bench import launchers, procs
from bench.launchers import Launcher, Node, Run

NPROC = 8
SITE = Path(__file__).with_name("nodestart_site")
CAP_S = 300.0
C10D_FIRST_S = 0.2  # c10d: node 0's launcher first, so that it is the one serving the store


def once(
    launcher: Launcher,
    nnodes: int,
    scratch: Path,
    label: str,
    code: Path | None,
    backend: str = "static",
) -> dict[str, object]:
    rdzv_id = launchers.new_token(f"ns{nnodes}")
    stamps = scratch / rdzv_id / "stamps"
    trace = scratch / rdzv_id / "trace"
    stamps.mkdir(parents=True)
    trace.mkdir()
    path = [str(SITE), *([str(code)] if code is not None else [])]
    env = {"PYTHONPATH": os.pathsep.join(path), "BENCH_TRACE_DIR": str(trace)}
    port = launchers.free_port()
    runs: list[Run] = []
    try:
        for node in range(nnodes):
            where = Node(node, nnodes, port, rdzv_id)
            argv = launchers.node_command(
                launcher, where, NPROC, launchers.rank_script("node_up"), ["--dir", str(stamps)]
            )
            if backend == "c10d":  # node ranks from the rendezvous; the first node serves
                at = argv.index("--node-rank")
                argv[at : at + 6] = [
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    f"{launchers.LOOPBACK}:{port}",
                    *(["--rdzv-id", rdzv_id] if launcher is Launcher.TORCHRUN else []),
                ]
            runs.append(launchers.spawn(launcher, where.token, argv, scratch, False, env))
            if backend == "c10d" and node == 0:
                time.sleep(C10D_FIRST_S)
        deadline = time.time() + CAP_S
        got: dict[int, float] = {}
        while time.time() < deadline:
            got = procs.read_stamps(stamps, "ready")
            if len(got) >= nnodes * NPROC or _all_exited(runs):
                break
            time.sleep(0.02)
        if len(got) < nnodes * NPROC:
            print(f"{label} {nnodes} nodes: not up; node 0 said:", file=sys.stderr)
            print(launchers.stderr_tail(runs[0], scratch), file=sys.stderr)
        for r in runs:
            r.signal(signal.SIGTERM)  # (a zombie takes it too)
        for r in runs:
            r.wait_exit(30)
    finally:
        for r in runs:
            r.close()
        procs.kill_token(rdzv_id)
    return {
        "launcher": label,
        "nnodes": nnodes,
        "complete": len(got) >= nnodes * NPROC,
        "starts": {r.pid: (n, r.started_at) for n, r in enumerate(runs)},
        "stamps": got,
        "marks": _read_marks(trace),
    }


def _all_exited(runs: list[Run]) -> bool:
    """Every launcher has exited (not reaped: Run.wait_exit does that)."""
    return len(select.select([r.pidfd for r in runs], [], [], 0)[0]) == len(runs)


def _read_marks(trace: Path) -> list[tuple[float, int, str, str]]:
    out = []
    for f in trace.iterdir():
        for line in f.read_text().splitlines():
            t, pid, event, *rest = line.split(" ", 3)
            out.append((float(t), int(pid), event, rest[0] if rest else ""))
    return sorted(out)


def timeline(run: dict[str, object]) -> dict[int, dict[str, float]]:
    """Per node: phase -> seconds since that node's launcher started (first occurrence)."""
    starts = {int(k): (int(v[0]), float(v[1])) for k, v in run["starts"].items()}  # type: ignore[attr-defined]
    marks: list[tuple[float, int, str, str]] = run["marks"]  # type: ignore[assignment]
    parent: dict[int, int] = {}
    for _, pid, event, detail in marks:
        if event in ("python", "forked"):
            parent.setdefault(pid, int(detail.split("ppid ", 1)[1].split()[0]))
    launcher_node = {pid: n for pid, (n, _) in starts.items()}

    def node_of(pid: int) -> int | None:
        for _ in range(10):
            if pid in launcher_node:
                return launcher_node[pid]
            if pid not in parent:
                return None
            pid = parent[pid]
        return None

    starts_by_node = {n: t for _, (n, t) in starts.items()}
    out: dict[int, dict[str, float]] = defaultdict(dict)

    def put(node: int, phase: str, t: float) -> None:
        out[node].setdefault(phase, t - starts_by_node[node])

    torchrun = str(run["launcher"]).startswith("torchrun")
    for t, pid, event, detail in marks:
        n = node_of(pid)
        if n is None:
            continue
        peer = pid not in launcher_node and event == "python"
        if event == "python":
            put(n, "peer: interpreter up" if peer else "launcher: interpreter up", t)
        elif event == "import":
            put(n, f"import {detail} begins", t)
        elif event == "os.exec" and "gpulaunch.multinode.peer" in detail:
            put(n, "peer: exec", t)
        elif event in ("os.fork", "subprocess.Popen"):
            ready = "rdzv: round done" if torchrun else "watcher: layout received"
            if ready in out[n]:
                put(n, "ranks: first fork/spawn", t)
                out[n]["ranks: last fork/spawn"] = t - starts_by_node[n]
        elif event == "watcher.joined":
            put(n, "watcher: layout received", t)
        elif event == "rdzv.handler" and detail.startswith("start"):
            put(n, "rdzv: torch imported, handler", t)
        elif event == "rdzv.handler":
            put(n, "rdzv: store served/connected", t)
        elif event == "rdzv.next" and detail == "done":
            put(n, "rdzv: round done", t)
        elif event == "peer.joined":
            put(n, "peer: layout exchanged, sent", t)
    stamps: dict[int, float] = {int(k): v for k, v in run["stamps"].items()}  # type: ignore[attr-defined]
    for rank, t in stamps.items():
        n = rank // NPROC
        put(n, "ranks: first rank's first line", t)
        out[n]["ranks: last rank's first line"] = max(
            out[n].get("ranks: last rank's first line", 0.0), t - starts_by_node[n]
        )
    return dict(out)


def summary(runs: list[dict[str, object]]) -> None:
    by: dict[tuple[str, int], list[dict[str, object]]] = defaultdict(list)
    for r in runs:
        by[(str(r["launcher"]), int(r["nnodes"]))].append(r)  # type: ignore[call-overload]
    for (launcher, n), rs in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        phases: dict[str, list[float]] = defaultdict(list)
        last: dict[str, list[float]] = defaultdict(list)
        total = []
        for r in rs:
            tl = timeline(r)
            t0 = min(t for _, t in r["starts"].values())  # type: ignore[attr-defined]
            lag = {n_: t - t0 for _, (n_, t) in r["starts"].items()}  # type: ignore[attr-defined]
            for ph in tl.values():
                for k, v in ph.items():
                    phases[k].append(v)
            lastnode = max(tl)
            for k, v in tl[lastnode].items():
                last[k].append(v + lag[lastnode])
            total.append(max(r["stamps"].values()) - t0)  # type: ignore[attr-defined]
        print(
            f"\n== {launcher}, {n} nodes, {len(rs)} runs; start -> every rank up: "
            f"median {statistics.median(total) * 1000:.0f} ms "
            f"({', '.join(f'{x * 1000:.0f}' for x in total)})"
        )
        print(f"{'phase':45} {'all nodes (own start)':>22} {'last node (job start)':>22}")
        for k in sorted(phases, key=lambda k: statistics.median(phases[k])):
            print(
                f"{k:45} {statistics.median(phases[k]) * 1000:>20.0f}ms "
                f"{statistics.median(last[k]) * 1000 if last[k] else float('nan'):>20.0f}ms"
            )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, nargs="+", default=[2, 8])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", type=Path)
    p.add_argument(
        "--backend",
        choices=("static", "c10d"),
        default="static",
        help="c10d: --rdzv-endpoint on loopback instead of --master-addr/--node-rank; the "
        "ranks' stamps are then placed by their rendezvous node rank, not the launch order",
    )
    p.add_argument(
        "--base",
        type=Path,
        help="a folder with another gpulaunch package (e.g. `git archive OLD gpulaunch`), "
        "run as a third launcher, `direct-base`, alternating with the two (an A/B); run "
        "from a directory where `gpulaunch` is not importable (the peer runs with -m)",
    )
    p.add_argument("--summarize", type=Path, help="only print the summary of an --out file")
    args = p.parse_args()
    if args.summarize:
        summary(json.loads(args.summarize.read_text()))
        return
    runs: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="nodestart-") as d:
        os.chmod(d, 0o755)
        for rep in range(args.reps):
            for n in args.nodes:
                variants = [
                    ("direct", Launcher.DIRECT, None),
                    ("torchrun", Launcher.TORCHRUN, None),
                ]
                if args.base is not None:
                    variants.insert(1, ("direct-base", Launcher.DIRECT, args.base.resolve()))
                at = rep % len(variants)
                for label, launcher, code in variants[at:] + variants[:at]:
                    r = once(launcher, n, Path(d), label, code, args.backend)
                    print(
                        f"rep {rep + 1} {label} {n} nodes: complete={r['complete']} "
                        f"load {os.getloadavg()[0]:.1f}",
                        flush=True,
                    )
                    runs.append(r)
                    if args.out:
                        args.out.write_text(json.dumps(runs))
    summary(runs)


if __name__ == "__main__":
    main()
