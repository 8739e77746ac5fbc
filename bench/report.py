"""The results: a markdown report with the table of every scenario, and the same data as JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.launchers import LAUNCHERS, Launcher, command
from bench.scenarios import Scenario
from bench.stats import Metric, Summary


@dataclass
class Results:
    """Everything one run of the suite produced."""

    date: str
    started_at: str
    mode: str
    command: str
    machine: dict[str, Any]
    config: dict[str, Any]
    scenarios: list[tuple[Scenario, list[Metric]]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    load: list[str] = field(default_factory=list)  # how busy other work kept the machine
    run_loads: list[tuple[str, str, float]] = field(default_factory=list)  # per run, in order
    total_s: float = 0.0


LEGEND = [
    "**×r**: that launcher's median / torchrun's (below 1: less time, memory or CPU than",
    "torchrun). Spread: min–max over the runs. `not run`: the scenario does not apply to",
    "that launcher (see What was run).",
    "",
]


def _launchers_run() -> list[str]:
    """How the launchers were run (scenarios 1-10), for the report's "What was run"."""
    return [
        "Single-node scenarios (1-6; scenario 7's three nodes are described in its section):",
        "",
        "```",
        *[_example(launcher) for launcher in LAUNCHERS],
        "```",
        "",
        "`systemd`: the ranks in scopes of root's system manager; `direct`: the watcher",
        "supervises the ranks itself (gpulaunch/supervisor/direct); `frontend`: an ordinary",
        "user (lingering) starts the job from a login session's scope, which their user",
        "manager cannot adopt from: the command is gpulaunch's front end, the watcher a",
        "service of the user manager, the ranks scopes of the user manager.",
        "`setpriv` execs (so does `systemd-run --scope`): the process we start and time is",
        "the front end itself.",
        "",
        "(`--local-addr 127.0.0.1`: torchrun otherwise gives the ranks the hostname as",
        "MASTER_ADDR, which does not resolve in the box; gpulaunch uses 127.0.0.1.)",
        "Each run of a scenario starts a launcher with a fresh token (the gpulaunch job id, a",
        "rank argument, and `BENCH_TOKEN` in the environment); a job's processes are the ones",
        "whose argv or environment carries it (/proc scanned every 5 ms where a time is",
        "measured). The launchers alternate within each repetition (which one goes first",
        "rotates). Times are `time.time()` across processes; deadlines are only",
        "runaway protection. After every run anything left of it is killed.",
        "",
    ]


def _number(value: float, metric: Metric) -> str:
    if metric.digits == 0:
        return f"{value:,.0f}"
    return f"{value:.{metric.digits}f}"


def cell(metric: Metric, s: Summary) -> str:
    """`median unit (min–max)`, and how many runs had no value."""
    if s.n == 0:
        return "n/a"
    if s.median is None:
        return f"{metric.missing_label} ({s.missing}/{s.n} runs)"
    text = f"{_number(s.median, metric)} {metric.unit}"
    if s.n > 1 and s.low is not None and s.high is not None:
        text += f" ({_number(s.low, metric)}–{_number(s.high, metric)})"
    if s.missing:
        text += f"; {metric.missing_label} in {s.missing}/{s.n} runs"
    return text


def columns(scenarios: Sequence[tuple[Scenario, list[Metric]]]) -> list[Launcher]:
    """The launchers that ran in any of these scenarios, in the report's order."""
    ran = {launcher for _, metrics in scenarios for m in metrics for launcher in m.samples}
    return [launcher for launcher in LAUNCHERS if launcher in ran]


def table(scenarios: Sequence[tuple[Scenario, list[Metric]]]) -> str:
    """One row per metric: each launcher's median (min–max), gpulaunch's with its ratio to
    torchrun's (`×0.64`: 0.64 times torchrun's median), then the verdict."""
    cols = columns(scenarios)
    rows = [
        "| # | scenario | " + " | ".join(launcher.label for launcher in cols) + " | verdict |",
        "|---|---|" + "---|" * len(cols) + "---|",
    ]
    for _, metrics in scenarios:
        for m in metrics:
            cells = []
            for launcher in cols:
                if launcher not in m.samples:
                    cells.append("not run")
                    continue
                text = cell(m, m.summary(launcher))
                ratio = m.ratio(launcher) if launcher.ours else None
                cells.append(text if ratio is None else f"{text} **×{ratio:.2f}**")
            rows.append(f"| {m.key} | {m.title} | " + " | ".join(cells) + f" | {m.verdict()} |")
    return "\n".join(rows)


def markdown(r: Results) -> str:
    minutes, seconds = divmod(round(r.total_s), 60)
    # Scenarios of the VM lab (11) run none of the launchers: no torchrun, no launcher lines.
    launchers = any(scenario.launchers for scenario, _ in r.scenarios)
    title = (
        f"gpulaunch ({', '.join(x.value for x in columns(r.scenarios) if x.ours)}) vs torchrun"
        if launchers
        else ", ".join(scenario.name for scenario, _ in r.scenarios)
    )
    out = [
        f"# Benchmark: {title} ({r.date})",
        "",
        f"`{r.command}`: {r.mode} run, started {r.started_at}, took {minutes} min {seconds} s.",
        "Generated by `bench/`; the raw samples are in the `.json` next to this file.",
        "",
        table(r.scenarios),
        "",
        *(LEGEND if launchers else ["Spread: min–max over the runs.", ""]),
        "## Machine",
        "",
        *[f"- {k}: {v}" for k, v in r.machine.items()],
        *[f"- {line}" for line in r.load],
        "",
        "## What was run",
        "",
        *(_launchers_run() if launchers else []),
        *[f"- {k}: {v}" for k, v in r.config.items()],
        "",
    ]
    for scenario, metrics in r.scenarios:
        out += [f"## {scenario.doc.splitlines()[0]}", ""]
        out += scenario.doc.split("\n", 1)[1].strip().splitlines() if "\n" in scenario.doc else []
        out.append("")
        for m in metrics:
            out.append(f"- {m.key} {m.title}, samples in run order:")
            for launcher in m.ran():
                out.append(f"  - {launcher.label}: {_samples(m, m.samples[launcher])}")
            for name, series in m.extra.items():
                out.append(f"  - {name}: {_samples(m, series)}")
            out += [f"  - {note}" for note in m.notes]
        out.append("")
    out += ["## Problems seen during the run", ""]
    out += [f"- {p}" for p in r.problems] or ["none"]
    out.append("")
    return "\n".join(out)


def _example(launcher: Launcher) -> str:
    if launcher is Launcher.FRONTEND:
        head = "systemd-run --scope --slice=user-UID.slice --unit=session-TOKEN setpriv "
        head += "--reuid=UID --regid=GID --init-groups "
        return head + _example(Launcher.SYSTEMD)
    argv = command(launcher, 4, "bench/ranks/SCRIPT.py", ["ARGS..."], "TOKEN")
    return " ".join([Path(argv[0]).name, *argv[1:]])


def _samples(m: Metric, values: Sequence[float | None]) -> str:
    return ", ".join("-" if v is None else _number(v, m) for v in values)


def as_json(r: Results) -> str:
    data = {
        "date": r.date,
        "started_at": r.started_at,
        "mode": r.mode,
        "command": r.command,
        "total_s": round(r.total_s, 1),
        "machine": r.machine,
        "config": r.config,
        "problems": r.problems,
        "other_load": r.load,
        "other_load_per_run": [
            {"run": what, "launcher": launcher, "share": round(share, 3)}
            for what, launcher, share in r.run_loads
        ],
        "scenarios": [
            {
                "number": s.key,
                "name": s.name,
                "metrics": [_metric_json(m) for m in metrics],
            }
            for s, metrics in r.scenarios
        ],
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _metric_json(m: Metric) -> dict[str, Any]:
    summaries = {launcher.value: m.summary(launcher) for launcher in m.ran()}
    return {
        "key": m.key,
        "title": m.title,
        "unit": m.unit,
        "samples": {launcher.value: values for launcher, values in m.samples.items()},
        "median": {k: s.median for k, s in summaries.items()},
        "min": {k: s.low for k, s in summaries.items()},
        "max": {k: s.high for k, s in summaries.items()},
        "missing": {k: s.missing for k, s in summaries.items()},
        "missing_means": m.missing_label,
        "ratio_to_torchrun": m.ratios(),
        "verdict": m.verdict(),
        "extra": m.extra,
        "notes": m.notes,
    }
