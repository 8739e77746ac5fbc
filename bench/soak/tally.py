"""The soak's table (fault × runs × failure columns), its markdown and JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from bench.soak.judge import End, Seen, Verdict
from bench.soak.plan import FAULTS, Fault, JobPlan

COLUMNS = (
    ("wrong_status", "wrong status"),
    ("wrong_report", "wrong report/record"),
    ("leaked_units", "leaked units"),
    ("leaked_procs", "leaked processes"),
    ("missing_record", "missing records"),
    ("hang", "hangs"),
)


@dataclass(frozen=True)
class JobResult:
    plan: JobPlan
    job: str
    seen: Seen
    verdict: Verdict
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        s = self.seen
        return {
            "index": self.plan.index,
            "job": self.job,
            "plan": self.plan.as_dict(),
            "described": self.plan.describe(),
            "seconds": round(self.seconds, 3),
            "returncode": s.returncode,
            "report": _end(s.headline),
            "record": _end(s.record),
            "acted": s.acted,
            "action_rc": s.action_rc,
            "rank_faulted": s.rank_faulted,
            "state_after": s.state_after,
            "leaked_units": list(s.leaked_units),
            "leaked_procs": s.leaked_procs,
            "failures": [name for name, _ in COLUMNS if getattr(self.verdict, name)],
            "reasons": list(self.verdict.reasons),
            "stderr_tail": s.stderr.splitlines()[-6:] if self.verdict.failed else [],
        }


def _end(end: End | None) -> dict[str, Any] | None:
    return None if end is None else {"status": end.status, "cause": end.cause, "rank": end.rank}


@dataclass
class Soak:
    seed: int
    replay_args: str  # what a replay needs besides the seed and the index: --only, --snapshot
    command: str
    started_at: str
    machine: dict[str, Any]
    results: list[JobResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # the soak could not do what it meant to
    total_s: float = 0.0

    def counts(self) -> dict[Fault, dict[str, int]]:
        rows: dict[Fault, dict[str, int]] = {}
        for r in self.results:
            row = rows.setdefault(r.plan.fault, {"runs": 0} | {n: 0 for n, _ in COLUMNS})
            row["runs"] += 1
            for name, _ in COLUMNS:
                row[name] += int(getattr(r.verdict, name))
        return {f: rows[f] for f in FAULTS if f in rows}

    def failures(self) -> list[JobResult]:
        return [r for r in self.results if r.verdict.failed]

    def ok(self) -> bool:
        return not self.failures() and not self.problems


def table(soak: Soak) -> str:
    head = "| fault | runs | " + " | ".join(title for _, title in COLUMNS) + " |"
    lines = [head, "|---" * (len(COLUMNS) + 2) + "|"]
    total = {"runs": 0} | {n: 0 for n, _ in COLUMNS}
    for fault, row in soak.counts().items():
        lines.append(f"| {fault} | " + " | ".join(str(v) for v in row.values()) + " |")
        for k, v in row.items():
            total[k] += v
    lines.append("| **all** | " + " | ".join(f"**{v}**" for v in total.values()) + " |")
    return "\n".join(lines)


def replay(soak: Soak, r: JobResult) -> str:
    return f"python -m bench soak --seed {soak.seed} --first {r.plan.index} --jobs 1" + "".join(
        f" {a}" for a in soak.replay_args.split(" ") if a
    )


def markdown(soak: Soak) -> str:
    out = [
        f"# Fault soak, {soak.started_at}",
        "",
        f"`{soak.command}`: {len(soak.results)} jobs, seed {soak.seed}, "
        f"{soak.total_s:.0f} s. Each job has one fault; bench/soak/judge.py has the rules "
        "each end is checked against (the README's exit-status rules, the report's cause, "
        "the journal record), then no unit and no process of the job may be left.",
        "",
        table(soak),
        "",
        "## Machine",
        "",
        *(f"- {k}: {v}" for k, v in soak.machine.items()),
        "",
    ]
    failures = soak.failures()
    out += ["## Failures", ""]
    if not failures:
        out += ["None.", ""]
    for r in failures:
        out += [
            f"- job {r.plan.index} ({r.plan.fault}: {r.plan.describe()}): "
            + "; ".join(r.verdict.reasons),
            f"  replay: `{replay(soak, r)}`",
        ]
    if soak.problems:
        out += ["", "## Problems of the soak itself", "", *(f"- {p}" for p in soak.problems)]
    return "\n".join(out) + "\n"


def as_json(soak: Soak) -> str:
    data = {
        "seed": soak.seed,
        "command": soak.command,
        "started_at": soak.started_at,
        "total_s": round(soak.total_s, 1),
        "machine": soak.machine,
        "table": {str(f): row for f, row in soak.counts().items()},
        "problems": soak.problems,
        "jobs": [r.as_dict() for r in soak.results],
    }
    return json.dumps(data, indent=1) + "\n"
