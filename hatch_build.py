"""Build hook: generate, from gpulaunch's own argparse parser, what the wheel installs
under share/: bash and zsh completions (shtab) and the man page gpulaunch(1)
(argparse-manpage). Generated at every build, never committed, so they cannot drift
from the parser.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

# Where each generated file lands, relative to the installation prefix (a venv, /usr/local).
SHARED = {
    "gpulaunch.bash": "share/bash-completion/completions/gpulaunch",
    "_gpulaunch": "share/zsh/site-functions/_gpulaunch",
    "gpulaunch.1": "share/man/man1/gpulaunch.1",
}


def generate(out: Path, root: str) -> dict[str, Path]:
    """Write the completions and the man page into `out`; their paths by file name."""
    import shtab
    from argparse_manpage.manpage import Manpage

    sys.path.insert(0, root)
    try:
        from gpulaunch import __version__, errors
        from gpulaunch.cli import build_parser
    finally:
        sys.path.remove(root)
    texts = {
        "gpulaunch.bash": _script_args_are_not_ours(
            shtab.complete(_completing(build_parser(), shtab), shell="bash")
        ),
        "_gpulaunch": shtab.complete(_completing(build_parser(), shtab), shell="zsh"),
        "gpulaunch.1": _with_exit_status(
            Manpage(
                build_parser(),
                {
                    "project_name": "gpulaunch",
                    "prog": "gpulaunch",
                    "version": __version__,
                    "manual_section": "1",
                    "manual_title": "gpulaunch manual",
                    "description": "distributed PyTorch ranks supervised by systemd",
                    "url": "https://pypi.org/project/gpulaunch/",
                },
            ),
            errors.__doc__ or "",
        ),
    }
    paths = {}
    for name, text in texts.items():
        paths[name] = out / name
        paths[name].write_text(text)
    return paths


# Job ids, for the JOB of status, stop, wait, signal, logs, stacks: running and ended jobs.
JOB_IDS = (
    r"""gpulaunch list --all --json 2>/dev/null | sed -n 's/^ *"job": "\(.*\)",\{0,1\}$/\1/p'"""
)


def _completing(parser: Any, shtab: Any) -> Any:
    """`parser` with shtab's completers: the script and paths complete as files and
    directories, a JOB as the ids `gpulaunch list --all` knows."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _completing(sub, shtab)
        elif action.dest in ("script", "args", "machine_root"):
            action.complete = shtab.FILE
        elif action.dest in ("log_dir", "units_dir", "root"):
            action.complete = shtab.DIRECTORY
        elif action.dest == "job" and not action.option_strings:
            action.complete = shtab.cmd(JOB_IDS)
    return parser


# shtab's bash offers the launcher's options for a word that begins with "-" also after the
# script (argparse.REMAINDER: the script's own arguments, which a launcher option there would
# be). zsh's spec excludes them already ("(-)*::").
SHTAB_OPTIONS_BRANCH = '  if [[ $pos_only = 0 && "$completing_word" == -* &&'
NOT_AFTER_SCRIPT = (
    '  if [[ "$current_action_nargs" == "..." && "$completing_word" == -* ]]; then\n'
    "    : # the script's own arguments: not the launcher's options\n"
    '  elif [[ $pos_only = 0 && "$completing_word" == -* &&'
)


def _script_args_are_not_ours(bash: str) -> str:
    """No launcher option offered after the script's name (a shtab upgrade that changes the
    line this hooks into fails the build, never ships the old behaviour silently)."""
    if bash.count(SHTAB_OPTIONS_BRANCH) != 1:
        raise RuntimeError("hatch_build.py: shtab's bash completion changed; update the hook")
    return bash.replace(SHTAB_OPTIONS_BRANCH, NOT_AFTER_SCRIPT)


def _with_exit_status(page: Any, table: str) -> str:
    """The man page with an EXIT STATUS section: gpulaunch/errors.py's table."""
    import re

    rows: list[list[str]] = []
    for line in table.partition("Exit codes:\n")[2].splitlines():
        row = re.match(r"^  (\S+)\s+(.*)$", line)
        if row:
            rows.append([row[1], row[2]])
        elif line.strip() and rows:
            rows[-1][1] += " " + line.strip()
    roff = "".join(f".TP\n.B {code}\n{text.replace(chr(92), chr(92) * 2)}\n" for code, text in rows)
    page.add_section("exit status", "=", roff.rstrip("\n"))
    return str(page)


class GeneratedFilesHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        self._out = Path(tempfile.mkdtemp(prefix="gpulaunch-build-"))
        for name, path in generate(self._out, self.root).items():
            build_data["shared_data"][str(path)] = SHARED[name]

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        shutil.rmtree(self._out, ignore_errors=True)
