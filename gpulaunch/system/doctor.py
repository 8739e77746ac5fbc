"""`gpulaunch doctor`: one table of what this machine gives gpulaunch and what it lacks.

Exit status 0 when a job can run here, 69 (EX_UNAVAILABLE) when it cannot: a finding
of status `fail` (no supervisor can run, the job's manager is unreachable).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from gpulaunch.model import Manager
from gpulaunch.system.checks import run_all
from gpulaunch.system.findings import Finding, Machine, Status

CANNOT_RUN = 69  # as for "no systemd manager reachable" (gpulaunch/cli.py)


def can_run(findings: Sequence[Finding]) -> bool:
    """True when nothing stops a job from running here.

    A systemd manager that does not answer stops nothing where the job gets a
    supervisor anyway (the direct one): that row is then what a job lacks, not a stop.
    """
    chosen = next((f for f in findings if f.area == "supervisor" and f.item == "a job gets"), None)
    if chosen is not None and chosen.status is Status.FAIL:
        return False
    return all(
        f.status is not Status.FAIL for f in findings if chosen is None or f.area != "systemd"
    )


def format_table(findings: Sequence[Finding]) -> str:
    """The findings as aligned columns, each lack followed by its fix."""
    rows = [("area", "check", "status", "found")]
    rows += [(f.area, f.item, f.status.value, f.detail) for f in findings]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = []
    for row, finding in zip(rows, (None, *findings), strict=True):
        cells = [c.ljust(w) for c, w in zip(row[:3], widths, strict=True)]
        lines.append("  ".join([*cells, row[3]]).rstrip())
        if finding is not None and finding.fix:
            lines.append(" " * (sum(widths) + 6) + f"fix: {finding.fix}")
    verdict = "a job can run here" if can_run(findings) else "a job cannot run here"
    lines.append(f"gpulaunch doctor: {verdict}")
    return "\n".join(lines)


def as_json(findings: Sequence[Finding]) -> dict[str, Any]:
    chosen = next((f for f in findings if f.area == "supervisor" and f.item == "a job gets"), None)
    supervisor = None
    if chosen is not None and chosen.status is not Status.FAIL:
        supervisor = chosen.detail.split(":", 1)[0]
    return {
        "can_run": can_run(findings),
        "supervisor": supervisor,
        "checks": [{**asdict(f), "status": f.status.value} for f in findings],
    }


def cmd_doctor(args: argparse.Namespace) -> int:
    findings = run_all(Machine.here(Manager(args.manager)))  # cli.main resolved the default
    if args.json:
        print(json.dumps(as_json(findings), indent=2))
    else:
        print(format_table(findings))
    return 0 if can_run(findings) else CANNOT_RUN
