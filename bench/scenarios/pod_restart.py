"""11. Restart in the pod against restarting the container (issue 38), in the VM lab.

The VM lab (sdbox/vm: Debian 12 under qemu, 2 virtual CPUs, podman 4.3) is booted once
and the example image built in it (bench/podlab.py: examples/Containerfile, gpulaunch
from its .deb, PID 1 of the container, the direct supervisor). Then, alternating (which
goes first rotates), each run a `podman run -d` of that image with
`gpulaunch start --nproc 2 bench/ranks/pod_fail.py`: rank 1 fails once (exit 3) as soon
as rank 0 is up, rank 0 sleeps until it is stopped; the restarted ranks exit 0 at once.
Three ways to get the ranks going again:

- in-pod: `gpulaunch start --max-restarts 1`: gpulaunch stops rank 0 and starts both
  ranks again in the same container;
- on-failure: no --max-restarts, `podman run --restart on-failure:1`: gpulaunch exits 3,
  the container with it, and podman starts the container again by itself. This is the
  like-for-like one: what a kubelet does for a pod whose container fails (restartPolicy
  OnFailure or Always: the same pod, its container started again by the node's agent,
  no controller or person in between), and the fastest a container restart gets here;
  a kubelet adds its crash-loop back-off (10 s before the first restart, doubling) on top,
  which podman's policy does not;
- podman restart: no policy; `podman wait` returns the exit, then `podman restart` (the
  issue's words): the same, driven by a client that watches the container.

Measured from rank 1's own stamp taken right before it exits (`failed`, in a directory
bind-mounted from the VM) to the first line of every rank's next start (each rank
appends `time.time()` of its first statement to `upRANK`): the interval until the
last rank is back. All stamps are the VM's clock. The phases: for in-pod, the failure
until gpulaunch's line "restarting all ranks" (the gang stopped, the restart decided;
its time from `podman logs -t`) and from there on; for the container ways, the failure
until gpulaunch's report (the gang stopped), the report until the container runs again
(`.State.StartedAt`: gpulaunch's exit, the container's, podman's restart), and from
there until the ranks are up (gpulaunch's own start in the new container). Between a
run's start and its end nothing but bash builtins and `sleep` runs in the VM (no podman
command), except what the way itself needs (`podman wait` and `podman restart`).

The ranks are plain Python: the image has no torch (the VM reaches no package index,
so the image is built with `--build-arg TORCH=`; the run says whether it found torch).
Training ranks would import torch in every new rank process on both sides (an in-pod
restart starts new rank processes too), which adds the same time to both medians.
qemu TCG emulates the guest's CPUs (about 12x slower than this machine for Python):
both sides pay it, their ratio is what to read, not the seconds.
"""

from __future__ import annotations

import datetime
import enum
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from bench import machine, podlab, procs
from bench.context import Context
from bench.launchers import Launcher
from bench.stats import Judge, Metric, Summary

TARGET = 0.5  # issue 38: the in-pod restart takes at most half of the container's
CAP_S = 300  # per run: runaway protection, never a measurement
OUT = "/var/tmp/podbench"  # in the VM: one directory per run, bind-mounted at /srv/out
RESTARTING = "restarting all ranks"  # gpulaunch's line once the gang is stopped
REPORT = "failed: rank 1 exit 3"  # gpulaunch's report, the container ways


class Way(enum.StrEnum):
    IN_POD = "in-pod (--max-restarts 1)"
    ON_FAILURE = "container: podman run --restart on-failure:1"
    RESTART = "container: podman wait, podman restart"

    @property
    def short(self) -> str:
        return {"IN_POD": "in-pod", "ON_FAILURE": "on-failure"}.get(self.name, "podman restart")


@dataclass
class Sample:
    total: float | None = None  # failure → every rank's first line again
    stopped: float | None = None  # failure → gang stopped (restart decided / report)
    restarted: float | None = None  # gang stopped → container running again
    up: float | None = None  # (gang stopped or container started) → every rank up


def _script(way: Way, name: str) -> str:
    """The run, as one shell script in the VM; prints what _parse reads."""
    out = f"{OUT}/{name}"
    policy = ["--restart", "on-failure:1"] if way is Way.ON_FAILURE else []
    restarts = ["--max-restarts", "1"] if way is Way.IN_POD else []
    argv = ["podman", "run", "-d", "--name", name, *policy, "--network", "host",
            "-v", "/src/bench/ranks:/srv/job:ro", "-v", f"{out}:/srv/out", "-w", "/srv/job",
            podlab.TAG, "gpulaunch", "start", "--job", name, "--nproc", "2", *restarts,
            "pod_fail.py", "--out", "/srv/out"]  # fmt: skip
    again = (
        f"echo FIRST $(podman wait {name}); podman restart {name} >/dev/null"
        if way is Way.RESTART
        else ":"
    )
    # Both ranks started twice: counted by bash builtins, no process but sleep.
    wait = (
        f"n() {{ L=(); [ -e {out}/up$1 ] && mapfile -t L < {out}/up$1; N=${{#L[@]}}; }}\n"
        f"for i in $(seq {CAP_S * 4}); do"
        " n 0; a=$N; n 1; [ $a -ge 2 ] && [ $N -ge 2 ] && break; sleep 0.25; done"
    )
    return "\n".join([
        f"rm -rf {out} && mkdir -p {out}",
        "echo LOAD $(cat /proc/loadavg)",
        shlex.join(argv) + " >/dev/null || exit 1",
        again,
        wait,
        f"echo STATUS $(timeout {CAP_S} podman wait {name})",
        f"podman inspect -f 'STARTED {{{{.State.StartedAt.UnixNano}}}}"
        f" RESTARTS {{{{.RestartCount}}}}' {name}",
        f"podman logs -t {name} 2>&1 | sed 's/^/LOG /'",
        f"for f in {out}/failed {out}/up0 {out}/up1; do"
        ' [ -e $f ] && sed "s|^|FILE $(basename $f) |" $f; done',
        f"podman rm -f {name} >/dev/null",
    ])  # fmt: skip


def _log_time(line: str) -> float:
    """`2026-12-02T09:53:36.589922000Z text` (podman logs -t) → seconds since the epoch."""
    stamp = line.split(" ", 1)[0].rstrip("Z")
    head, _, frac = stamp.partition(".")
    at = datetime.datetime.fromisoformat(head).replace(tzinfo=datetime.UTC)
    return at.timestamp() + float(f"0.{frac or '0'}")


@dataclass
class Parsed:
    failed: float | None
    ups: dict[int, list[float]]
    logs: list[str]
    started: float | None
    status: str
    restarts: str
    vm_load: str
    first: str


def _parse(text: str) -> Parsed:
    p = Parsed(None, {0: [], 1: []}, [], None, "", "", "", "")
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        if word == "FILE":
            which, _, value = rest.partition(" ")
            if which == "failed":
                p.failed = float(value)
            else:
                p.ups[int(which[2:])].append(float(value.split()[0]))
        elif word == "LOG":
            p.logs.append(rest)
        elif word == "STARTED":
            started, _, restarts = rest.partition(" RESTARTS ")
            p.started, p.restarts = int(started) / 1e9, restarts.strip()
        elif word in ("STATUS", "FIRST", "LOAD"):
            value = rest.strip()
            p.status, p.first, p.vm_load = (
                value if word == "STATUS" else p.status,
                value if word == "FIRST" else p.first,
                value if word == "LOAD" else p.vm_load,
            )
    return p


def _sample(way: Way, p: Parsed) -> Sample:
    if p.failed is None:
        return Sample()
    failed = p.failed
    ups = [min((t for t in times if t > failed), default=None) for times in p.ups.values()]
    if any(t is None for t in ups):
        return Sample()
    back = max(t for t in ups if t is not None)
    mark = RESTARTING if way is Way.IN_POD else REPORT
    stopped = next((_log_time(line) for line in p.logs if mark in line), None)
    s = Sample(total=back - failed, stopped=None if stopped is None else stopped - failed)
    if way is Way.IN_POD:
        s.up = None if stopped is None else back - stopped
    elif p.started is not None:
        s.restarted = None if stopped is None else p.started - stopped
        s.up = back - p.started
    return s


def _once(ctx: Context, lab: podlab.PodLab, way: Way, name: str) -> tuple[Sample, str]:
    before, qemu = machine.read_cpu(), lab.qemu_pid
    qemu_cpu = procs.cpu_of([qemu]) if qemu else 0.0
    host_load = machine.loadavg()
    done = lab.sh(_script(way, name), timeout=3 * CAP_S)
    after = machine.read_cpu()
    # The VM is our child but not reaped yet: its CPU is ours, not other work's.
    vm_cpu = (procs.cpu_of([qemu]) if qemu else 0.0) - qemu_cpu
    ours = after.ours_s - before.ours_s + vm_cpu
    other = max(after.machine_s - before.machine_s - ours, 0.0)
    share = other / max((after.at - before.at) * (os.cpu_count() or 1), 1e-9)
    p = _parse(done.stdout)
    sample = _sample(way, p)
    expected_status = p.status == "0" and (way is not Way.RESTART or p.first == "3")
    if sample.total is None or not expected_status:
        tail = "\n".join(p.logs[-12:])
        ctx.problem(
            f"pod restart {name} ({way}): no restart measured (status {p.status or '-'},"
            f" first exit {p.first or '-'}, ssh {done.returncode}): {done.stderr[-300:]} {tail}"
        )
    if way is Way.ON_FAILURE and p.restarts != "1":
        ctx.problem(f"pod restart {name}: podman's RestartCount is {p.restarts!r}, not 1")
    load = f"{name} {way.short}: host load {host_load}, other work {share:.0%}, VM {p.vm_load}"
    return sample, load


def _verdict(baselines: dict[Way, list[float | None]], limit: float | None) -> Judge:
    """In-pod's median against each container way's (from `baselines`, filled later)."""

    def check(ours: Summary, _torchrun: Summary) -> str:
        parts = []
        for way, values in baselines.items():
            theirs = Summary.of(values)
            if theirs.median is None:
                parts.append(f"{way.short}: no value")
                continue
            text = f"{way.short} {theirs.median:.2f} s ({theirs.low:.2f}–{theirs.high:.2f})"
            if ours.median is not None and theirs.median > 0:
                r = ours.median / theirs.median
                mark = "" if limit is None else (" met" if r <= limit else " MISSED")
                text += f",{mark} in-pod/this ×{r:.2f}"
            parts.append(text)
        return "; ".join(parts)

    target = f"target ≤ {limit:g}× the container's" if limit is not None else "info"
    return Judge(target, check)


def run(ctx: Context) -> list[Metric]:
    ways = (Way.IN_POD, Way.ON_FAILURE, Way.RESTART)
    samples: dict[Way, list[Sample]] = {w: [] for w in ways}
    loads: list[str] = []
    with podlab.PodLab(ctx.say) as lab:
        for rep in range(ctx.config.reps):
            at = rep % len(ways)
            for way in ways[at:] + ways[:at]:
                name = f"pod{rep}{way.name.lower().replace('_', '')}"
                ctx.say(f"pod restart: run {rep + 1}/{ctx.config.reps}, {way}")
                sample, load = _once(ctx, lab, way, name)
                samples[way].append(sample)
                loads.append(load)
                ctx.say(f"pod restart: {way.name} {sample}")
        facts = dict(lab.facts)
    return _metrics(samples, loads, facts)


def _metrics(
    samples: dict[Way, list[Sample]], loads: Sequence[str], facts: dict[str, object]
) -> list[Metric]:
    rows = (
        ("11a", "rank fails → every rank's first line again", "total", TARGET),
        ("11b", "rank fails → gang stopped (in-pod: restart decided; else report)", "stopped",
         None),
        ("11c", "gang stopped → container running again (containers only)", "restarted", None),
        ("11d", "restart decided / container started → every rank's first line", "up", None),
    )  # fmt: skip
    metrics = []
    for key, title, field, limit in rows:
        m = Metric(key, f"in-pod restart vs container restart: {title}", "s")
        m.samples[Launcher.DIRECT] = [getattr(s, field) for s in samples[Way.IN_POD]]
        if field == "restarted":
            m.missing_label = "none: the container keeps running"
        baselines = {
            w: [getattr(s, field) for s in samples[w]] for w in samples if w is not Way.IN_POD
        }
        for way, values in baselines.items():
            m.extra[str(way)] = values
        m.judge = _verdict(baselines, limit)
        metrics.append(m)
    head = metrics[0]
    head.notes += [
        f"`gpulaunch direct` is {Way.IN_POD}: gpulaunch's direct supervisor, PID 1 of the"
        " container; the container ways are the rows below it",
        "torch in the image: "
        + ("yes" if facts.get("torch in the image") else "no (plain-Python ranks)"),
        *(f"{k}: {v}" for k, v in facts.items() if k != "torch in the image"),
        "per run (host load average at its start, other work's share of the host's CPUs"
        " during it, the VM's load average at its start): " + "; ".join(loads),
    ]
    return metrics
