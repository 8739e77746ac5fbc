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
        from gpulaunch import __version__
        from gpulaunch.cli import build_parser
    finally:
        sys.path.remove(root)
    texts = {
        "gpulaunch.bash": shtab.complete(build_parser(), shell="bash"),
        "_gpulaunch": shtab.complete(build_parser(), shell="zsh"),
        "gpulaunch.1": str(
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
            )
        ),
    }
    paths = {}
    for name, text in texts.items():
        paths[name] = out / name
        paths[name].write_text(text)
    return paths


class GeneratedFilesHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        self._out = Path(tempfile.mkdtemp(prefix="gpulaunch-build-"))
        for name, path in generate(self._out, self.root).items():
            build_data["shared_data"][str(path)] = SHARED[name]

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        shutil.rmtree(self._out, ignore_errors=True)
