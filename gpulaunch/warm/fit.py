"""Whether a rank may start warm: pure rules, over the rank's command and environment.

A rank forked from the warm process keeps what its libraries read when they loaded
there, so every variable a library might read at import must be the same in the warm
process as in the rank (OMP_NUM_THREADS, MKL_*, CUDA_*, TORCH_*, PYTHONHASHSEED, and
anything else: the rule is every name, not a list of prefixes that would miss one). The
only names that may differ are those the launcher gives each rank or each attempt,
`PER_RANK`: torchrun's contract and gpulaunch's own, read by torch when the script calls
`init_process_group`, never at import; and CUDA_VISIBLE_DEVICES, read by the CUDA driver
when it initializes, which the warm process never does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

PER_RANK = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_NAME",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_USE_AGENT_STORE",
        "TORCHELASTIC_ERROR_FILE",
        "NOTIFY_SOCKET",  # the progress channel (gpulaunch/progress/)
        "COLUMNS",  # logs/width.py: read by whoever asks for the terminal's width
        "CUDA_VISIBLE_DEVICES",
    }
)
PER_RANK_PREFIXES = ("GPULAUNCH_",)  # gpulaunch's own: read by its helpers when called
DEFAULT_MODULES = ("torch", "torch.distributed")  # as rankside/server.py, where present


def per_rank(name: str) -> bool:
    return name in PER_RANK or name.startswith(PER_RANK_PREFIXES)


def warm_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The warm process's environment: a rank's, without what is per rank or attempt."""
    return {k: v for k, v in env.items() if not per_rank(k)}


def differs(warm: Mapping[str, str], env: Mapping[str, str]) -> str | None:
    """Why a rank with `env` may not be a fork of a process with `warm`, else None."""
    names = sorted(
        k for k in warm.keys() | env.keys() if not per_rank(k) and warm.get(k) != env.get(k)
    )
    if not names:
        return None
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"its {shown} differ{'s' if len(names) == 1 else ''} from the warm process's"


def python_command(argv: Sequence[str], python: str) -> str | None:
    """Why `argv` is not `PYTHON -u SCRIPT ARGS` or `PYTHON -u -m MODULE ARGS`, else None
    (plan/spec.py's Launch.SCRIPT and Launch.MODULE: what a warm rank can become)."""
    if len(argv) < 3 or argv[0] != python or argv[1] != "-u":
        return "its command is not `python -u SCRIPT` (--no-python)"
    if argv[2] == "-m":
        return None if len(argv) >= 4 and argv[3] else "no module after -m"
    if argv[2].startswith("-"):
        return f"its command runs python {argv[2]} (--run-path)"
    return None


def modules_option(value: str) -> tuple[str, ...]:
    """--preload's MODULE,... (empty names left out); ValueError: not module names."""
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    bad = [n for n in names if not all(part.isidentifier() for part in n.split("."))]
    if bad:
        raise ValueError(f"not a module name: {bad[0]!r}")
    return names
