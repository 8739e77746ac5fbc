"""Warm ranks against torchrun (issue 36): `python -m bench.warm [--reps N] [--tag TAG]`.

Two measurements, each launcher in turn within each repetition (the first rotates), on
bench/ranks/warm_allreduce.py (imports torch, joins a gloo group, stamps its first
all_reduce of each attempt):

- launch (a): 8 ranks on one node: from just before the launcher is started until every
  rank has done its first all_reduce;
- restart (b): 4 ranks, `--max-restarts 1`, rank 1 raises once the others reduce: from its
  stamp until every rank of the next attempt has done its first all_reduce. torchrun gets
  `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` (torch 2.13's torchrun does not restart without).

Launchers: `warm` (gpulaunch, systemd supervisor, `--preload torch`), `cold` (the same
without it), `direct-warm` (`--supervisor direct --preload torch`), `torchrun`
(`--standalone`). Where no systemd runs it re-runs itself in the project's box, as
`python -m bench` does. Writes bench/results/<date>-warm[-TAG].md with medians, min–max,
ratios to torchrun's median, and the load.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SCRIPT = REPO / "bench" / "ranks" / "warm_allreduce.py"
LAUNCHERS = ("warm", "direct-warm", "cold", "torchrun")
CAP_S = 180.0


def argv(launcher: str, nproc: int, restarts: int, d: str, token: str, fail: int) -> list[str]:
    script = [str(SCRIPT), "--dir", d, "--token", token]
    if fail >= 0:
        script += ["--fail-rank", str(fail)]
    if launcher == "torchrun":
        head = [str(BIN / "torchrun"), "--standalone", "--local-addr", "127.0.0.1"]
        return [*head, "--nproc-per-node", str(nproc), "--max-restarts", str(restarts), *script]
    sup = "direct" if launcher.startswith("direct") else "systemd"
    head = [str(BIN / "gpulaunch"), "start", "--supervisor", sup, "--job", token, "--quiet"]
    head += ["--nproc", str(nproc), "--max-restarts", str(restarts), "--grace", "5"]
    if launcher.endswith("warm"):
        head += ["--preload", "torch"]
    return [*head, *script]


def stamps(d: Path, name: str) -> dict[int, float]:
    out = {}
    for p in d.glob(f"{name}.*"):
        out[int(p.suffix[1:])] = float(p.read_text().split()[0])
    return out


def once(launcher: str, scenario: str) -> float | None:
    nproc, restarts, fail = (8, 0, -1) if scenario == "launch" else (4, 1, 1)
    token = f"warmbench{uuid.uuid4().hex[:8]}"
    d = Path(tempfile.mkdtemp(prefix="warmbench-"))
    env = {**os.environ, "BENCH_TOKEN": token}
    if launcher == "torchrun":
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    try:
        started = time.time()
        res = subprocess.run(
            argv(launcher, nproc, restarts, str(d), token, fail),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=CAP_S,
            cwd=str(REPO),
        )
        attempt = "first0" if scenario == "launch" else "first1"
        firsts = stamps(d, attempt)
        if res.returncode != 0 or len(firsts) != nproc:
            tail = res.stderr.strip().splitlines()[-3:]
            print(f"  {launcher} {scenario}: status {res.returncode}, {tail}", file=sys.stderr)
            return None
        since = started if scenario == "launch" else stamps(d, "fail")[fail]
        return max(firsts.values()) - since
    except subprocess.TimeoutExpired:
        print(f"  {launcher} {scenario}: no end within {CAP_S:g} s", file=sys.stderr)
        return None
    finally:
        shutil.rmtree(d, ignore_errors=True)


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.warm")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--tag", default="")
    p.add_argument("--launchers", default=",".join(LAUNCHERS))
    args = p.parse_args()
    if not Path("/run/systemd/system").exists():
        print("bench.warm: no systemd runs here: booting the project's box", file=sys.stderr)
        os.chdir(REPO)
        cmd = [sys.executable, "-m", "sdbox", "run", "--", sys.executable, "-m", "bench.warm"]
        return subprocess.call([*cmd, *sys.argv[1:]])
    chosen = [x for x in args.launchers.split(",") if x]
    rows: dict[tuple[str, str], list[float | None]] = {}
    start_load, began = loadavg(), time.time()
    for scenario in ("launch", "restart"):
        for rep in range(args.reps):
            turn = chosen[rep % len(chosen) :] + chosen[: rep % len(chosen)]
            for launcher in turn:
                t = once(launcher, scenario)
                rows.setdefault((scenario, launcher), []).append(t)
                shown = "-" if t is None else f"{t:.2f} s"
                print(f"{scenario} rep {rep + 1}/{args.reps} {launcher}: {shown}", file=sys.stderr)
    report = render(rows, chosen, args, start_load, loadavg(), time.time() - began)
    day = datetime.date.today().isoformat()
    out = REPO / "bench" / "results" / f"{day}-warm{'-' + args.tag if args.tag else ''}.md"
    out.write_text(report)
    print(report)
    print(f"bench.warm: wrote {out}", file=sys.stderr)
    return 0


def render(
    rows: dict[tuple[str, str], list[float | None]],
    chosen: list[str],
    args: argparse.Namespace,
    start_load: str,
    end_load: str,
    took: float,
) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()
    lines = [
        f"# Warm ranks against torchrun ({datetime.date.today().isoformat()})",
        "",
        f"`python -m bench.warm --reps {args.reps} --launchers {args.launchers}` at commit "
        f"{commit} (plus the working "
        f"tree), in the project's systemd box; took {took:.0f} s; CPUs: {os.cpu_count()}; "
        f"load average at the start {start_load}, at the end {end_load}.",
        "",
        "| scenario | " + " | ".join(chosen) + " |",
        "|---|" + "---|" * len(chosen),
    ]
    names = {
        "launch": "a. 8 ranks: launch → every rank's first all_reduce",
        "restart": "b. 4 ranks, rank 1 fails: failure → every rank's first all_reduce of the "
        "next attempt",
    }
    for scenario in ("launch", "restart"):
        ref = [t for t in rows.get((scenario, "torchrun"), []) if t is not None]
        ref_med = statistics.median(ref) if ref else None
        cells = []
        for launcher in chosen:
            got = rows.get((scenario, launcher), [])
            ok = [t for t in got if t is not None]
            if not ok:
                cells.append("no value")
                continue
            med = statistics.median(ok)
            cell = f"{med:.2f} s ({min(ok):.2f}–{max(ok):.2f})"
            if ref_med and launcher != "torchrun":
                cell += f" **×{med / ref_med:.2f}**"
            if len(ok) < len(got):
                cell += f"; no value in {len(got) - len(ok)}/{len(got)}"
            cells.append(cell)
        lines.append(f"| {names[scenario]} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Medians of the runs (min–max); **×r**: the median over torchrun's median.",
        "Targets (issue 36): a ≤ ×0.5, b ≤ ×0.3.",
        "",
        "Every sample, in run order:",
        "",
    ]
    for (scenario, launcher), got in rows.items():
        shown = ", ".join("-" if t is None else f"{t:.2f}" for t in got)
        lines.append(f"- {scenario} {launcher}: {shown}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
