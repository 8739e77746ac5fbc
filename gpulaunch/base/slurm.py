"""The node's place in a SLURM step, read from the variables srun exports.

Pure: reads a mapping given by the caller, never `os.environ`, and never runs
`scontrol`. The first host of a hostlist is derived with SLURM's own grammar
(see "HOSTNAME" and "SLURM_JOB_NODELIST" in srun(1)). A variable that is set
but empty counts as unset.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpulaunch.errors import UsageError

# One host when there is no nodelist: the same default as `--master_addr`.
_LOCAL_ADDR = "127.0.0.1"

# 20000-29999: below Linux's ephemeral range (32768-60999 by default), so a
# port picked by the kernel for some outgoing connection rarely holds it.
_PORT_BASE = 20000
_PORT_SPAN = 10000

_NNODES_VARS = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
_NTASKS_VARS = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
_NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")

_NUMBER = re.compile(r"[0-9]+")
_LEADING_DIGITS = re.compile(r"[0-9]*")


@dataclass(frozen=True)
class SlurmStep:
    """This node's part in a SLURM job step."""

    job_id: str
    step_id: str | None
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int


def slurm_step(env: Mapping[str, str]) -> SlurmStep | None:
    """None when not running under SLURM (no SLURM_JOB_ID in env)."""
    job_id = _get(env, "SLURM_JOB_ID")
    if job_id is None:
        return None
    step_id = _get(env, "SLURM_STEP_ID")

    nnodes_var = _first_set(env, _NNODES_VARS)
    nnodes = 1 if nnodes_var is None else _count(env, nnodes_var, minimum=1)

    if _get(env, "SLURM_NODEID") is None:
        if nnodes > 1:
            raise UsageError(
                f"SLURM_NODEID is not set in a SLURM step of {_nodes(nnodes)}",
                "start gpulaunch on every node with srun, which sets it",
            )
        node_rank = 0
    else:
        node_rank = _count(env, "SLURM_NODEID", minimum=0)
        if node_rank >= nnodes:
            raise UsageError(
                f"SLURM_NODEID={node_rank} is not below the step's {_nodes(nnodes)}",
                "start gpulaunch with srun, which sets the node id and node count together",
            )

    # Checked only inside a step: in a batch script SLURM_NTASKS is the job's
    # request, while a single copy of the script runs.
    tasks_var = _first_set(env, _NTASKS_VARS) if step_id is not None else None
    if tasks_var is not None:
        ntasks = _count(env, tasks_var, minimum=1)
        if ntasks > nnodes:
            raise UsageError(
                f"srun started {ntasks} tasks on {_nodes(nnodes)}; gpulaunch starts the ranks "
                "of a node itself and wants one task per node",
                "use srun --ntasks-per-node=1 (or sbatch --ntasks-per-node=1)",
            )

    nodelist_var = _first_set(env, _NODELIST_VARS)
    if nodelist_var is None:
        if nnodes > 1:
            raise UsageError(
                "no SLURM_STEP_NODELIST, SLURM_JOB_NODELIST or SLURM_NODELIST in a SLURM "
                f"step of {_nodes(nnodes)}",
                "start gpulaunch with srun, which exports the nodelist",
            )
        master_addr = _LOCAL_ADDR
    else:
        value = env[nodelist_var]
        try:
            master_addr = _first_host(value)
        except ValueError as e:
            raise UsageError(
                f"{nodelist_var}={value!r} is not a SLURM hostlist: {e}",
                "gpulaunch reads the nodelist srun exports; do not set it by hand",
            ) from None

    return SlurmStep(
        job_id=job_id,
        step_id=step_id,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=slurm_master_port(job_id),
    )


def first_host(nodelist: str) -> str:
    """The first host of a SLURM hostlist expression, e.g. `gpu07` for `gpu[07-09,12]`."""
    try:
        return _first_host(nodelist)
    except ValueError as e:
        raise UsageError(
            f"{nodelist!r} is not a SLURM hostlist: {e}",
            "write hosts as SLURM does, e.g. node1,node2 or gpu[07-09,12]",
        ) from None


def slurm_master_port(job_id: str) -> int:
    """A port every node of the job derives alike, without talking to the others.

    It is 20000 + (the job id's leading digits) % 10000, so in 20000-29999;
    20000 when the id has no leading digits. Only the leading digits count, so
    array tasks (`1234_5`) share their array job's port.
    """
    digits = _LEADING_DIGITS.match(job_id.strip())
    assert digits is not None  # `[0-9]*` matches every string
    if not digits.group():
        return _PORT_BASE
    return _PORT_BASE + int(digits.group()) % _PORT_SPAN


def slurm_job_name(job_id: str, step_id: str | None, stem: str) -> str:
    """Default gpulaunch job id under SLURM: `<stem>_slurm<job>`, plus `.<step>` in a step.

    The step suffix keeps concurrent steps of one allocation apart. `stem` is
    already sanitized by the caller.
    """
    name = f"{stem}_slurm{job_id}"
    return name if step_id is None else f"{name}.{step_id}"


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name, "").strip()
    return value or None


def _first_set(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    return next((name for name in names if _get(env, name) is not None), None)


def _nodes(count: int) -> str:
    return f"{count} node" if count == 1 else f"{count} nodes"


def _count(env: Mapping[str, str], name: str, *, minimum: int) -> int:
    value = env[name].strip()
    if not _NUMBER.fullmatch(value) or int(value) < minimum:
        kind = "a positive integer" if minimum >= 1 else "a non-negative integer"
        raise UsageError(
            f"{name}={env[name]!r} is not {kind}",
            f"unset {name} or let srun set it",
        )
    return int(value)


def _first_host(nodelist: str) -> str:
    """Validate the whole hostlist, then expand only its first host.

    Raises ValueError saying what is wrong.
    """
    entries = _split_top_level(nodelist.strip())
    if entries == [""]:
        raise ValueError("it is empty")
    for entry in entries:
        if not entry:
            raise ValueError("it has an empty entry")
        _check_entry(entry)
    return _expand_first(entries[0])


def _split_top_level(text: str) -> list[str]:
    """Split at the commas outside brackets."""
    entries, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            entries.append(text[start:i])
            start = i + 1
    entries.append(text[start:])
    return entries


def _check_entry(entry: str) -> None:
    if any(c.isspace() for c in entry):
        raise ValueError(f"whitespace in {entry!r}")
    rest = entry
    while rest:
        open_at, close_at = rest.find("["), rest.find("]")
        if open_at < 0 and close_at < 0:
            break
        if close_at < 0 or "[" in rest[open_at + 1 : close_at]:
            raise ValueError(f"unbalanced '[' in {entry!r}")
        if open_at < 0 or close_at < open_at:
            raise ValueError(f"unbalanced ']' in {entry!r}")
        _check_group(rest[open_at + 1 : close_at], entry)
        rest = rest[close_at + 1 :]


def _check_group(group: str, entry: str) -> None:
    if not group:
        raise ValueError(f"empty brackets in {entry!r}")
    for item in group.split(","):
        low, dash, high = item.partition("-")
        if not _NUMBER.fullmatch(low) or (dash and not _NUMBER.fullmatch(high)):
            raise ValueError(f"bad range {item!r} in {entry!r}")
        if dash and int(high) < int(low):
            raise ValueError(f"range {item!r} runs backwards in {entry!r}")


def _expand_first(entry: str) -> str:
    """Each bracket group becomes its first number, padding kept (`[07-09]` -> `07`)."""
    return re.sub(r"\[([0-9]+)[^\]]*\]", r"\1", entry)


def resource_manager_step(env: Mapping[str, str]) -> str | None:
    """The resource manager's step we run in, if any (its cgroup is not ours to leave)."""
    if env.get("SLURM_STEP_ID") is not None and env.get("SLURM_JOB_ID") is not None:
        return f"Slurm step {env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}"
    return None
