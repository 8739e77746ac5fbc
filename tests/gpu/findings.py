"""What a GPU run found: each check's outcome and figures, then a markdown page.

The session writes JSON to `$GPULAUNCH_GPU_FINDINGS` (scripts/test-gpu.sh sets it);
`python -m tests.gpu.findings JSON [NOTES]` turns it into the page that goes to
`bench/results/gpu-<date>.md`. Pure apart from reading the files; tested in tests/unit.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

SESSION = pytest.StashKey[dict[str, Any]]()


def session(config: pytest.Config) -> dict[str, Any]:
    return config.stash.setdefault(
        SESSION, {"machine": {}, "checks": {}, "figures": {}, "not_applicable": {}}
    )


def record_outcome(config: pytest.Config, report: pytest.TestReport, doc: str) -> None:
    """One check's outcome: the worst of its phases (setup, call, teardown)."""
    checks = session(config)["checks"]
    entry = checks.setdefault(report.nodeid, {"outcome": "passed", "seconds": 0.0, "doc": doc})
    entry["seconds"] = round(entry["seconds"] + report.duration, 2)
    if report.failed:
        entry["outcome"] = "failed" if report.when == "call" else "error"
        entry["why"] = report.longreprtext.strip().splitlines()[-1:] or [""]
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"  # no GPU test skips; if one does, the page says so


def _first_line(doc: str) -> str:
    return doc.strip().splitlines()[0] if doc.strip() else ""


def render(data: Mapping[str, Any], notes: Sequence[str] = ()) -> str:
    """The findings as markdown: machine, preparation notes, one row per check."""
    machine = data.get("machine", {})
    lines = ["# GPU checks", ""]
    lines += [f"- {key}: {value}" for key, value in machine.items()]
    if notes:
        lines += ["", "## Preparation", ""] + [f"- {note}" for note in notes]
    lines += ["", "## Checks", "", "| check | outcome | seconds | figures |", "|---|---|---|---|"]
    figures: Mapping[str, list[str]] = data.get("figures", {})
    for nodeid, entry in data.get("checks", {}).items():
        name = nodeid.split("::", 1)[-1]
        what = _first_line(entry.get("doc", "")) or name
        outcome = entry["outcome"]
        if entry.get("why"):
            outcome += f": {entry['why'][0]}"
        shown = "; ".join(figures.get(nodeid, [])) or "—"
        lines.append(f"| `{name}` {what} | {outcome} | {entry['seconds']} | {shown} |")
    for why, ids in data.get("not_applicable", {}).items():
        for nodeid in ids:
            lines.append(f"| `{nodeid.split('::', 1)[-1]}` | not applicable: {why} | — | — |")
    return "\n".join(line.replace("\n", " ") for line in lines) + "\n"


def main(argv: Sequence[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print("usage: python -m tests.gpu.findings FINDINGS.json [NOTES.txt]", file=sys.stderr)
        return 2
    data = json.loads(Path(argv[0]).read_text())
    notes = Path(argv[1]).read_text().splitlines() if len(argv) == 2 else []
    sys.stdout.write(render(data, [n for n in notes if n.strip()]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
