"""What the build generates (hatch_build.py): completion of the script, --log-dir and job
ids (bash, zsh), and the man page's EXIT STATUS from errors.py (issue 22 item 15)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpulaunch import errors

REPO = Path(__file__).resolve().parents[2]
BASH_COMPLETION = Path("/usr/share/bash-completion/bash_completion")

# Completes a command line the way bash does on TAB (as tests/integration/test_package.py).
COMPLETE = r"""
source /usr/share/bash-completion/bash_completion
source "$1"; shift
fn=$(complete -p gpulaunch | sed -E 's/.*-F ([^ ]+).*/\1/')
COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
read -ra COMP_WORDS <<< "$COMP_LINE"
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
"$fn" gpulaunch "${COMP_WORDS[-1]}" "${COMP_WORDS[-2]}"
printf '%s\n' "${COMPREPLY[@]}"
"""


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    sys.path.insert(0, str(REPO))
    try:
        import hatch_build
    finally:
        sys.path.remove(str(REPO))
    out = tmp_path_factory.mktemp("generated")
    return hatch_build.generate(out, str(REPO))


def complete(generated: dict[str, Path], cwd: Path, line: str) -> list[str]:
    if not BASH_COMPLETION.exists():
        pytest.fail("bash-completion is not installed (scripts/setup.sh test installs it)")
    # A stand-in `gpulaunch` on PATH: what `gpulaunch list --all --json` prints.
    bin_dir = cwd / "bin"
    bin_dir.mkdir(exist_ok=True)
    listing = json.dumps([{"job": "demo-ok", "state": "succeeded"}, {"job": "demo-fail"}], indent=2)
    (bin_dir / "gpulaunch").write_text(f"#!/bin/sh\ncat <<'JSON'\n{listing}\nJSON\n")
    (bin_dir / "gpulaunch").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    res = subprocess.run(
        ["bash", "-c", COMPLETE, "complete", str(generated["gpulaunch.bash"]), *line.split()],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted(res.stdout.split())


def test_bash_completes_the_script_the_log_dir_and_job_ids(
    generated: dict[str, Path], tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "trainer").mkdir()
    (tmp_path / "logs").mkdir()
    (tmp_path / "logbook.txt").write_text("")
    assert complete(generated, tmp_path, "gpulaunch start tra") == ["train.py", "trainer"]
    assert complete(generated, tmp_path, "gpulaunch start --nproc 2 tra") == [
        "train.py",
        "trainer",
    ]
    assert complete(generated, tmp_path, "gpulaunch start --log-dir lo") == ["logs"]
    for command in ("status", "stop", "wait", "logs", "stacks", "signal"):
        assert complete(generated, tmp_path, f"gpulaunch {command} demo") == [
            "demo-fail",
            "demo-ok",
        ], command


def test_no_launcher_option_is_offered_after_the_script(
    generated: dict[str, Path], tmp_path: Path
) -> None:
    """issue 35: after the script's name a word is the script's own argument: `--np<TAB>`
    there completed to --nproc, which would reach the script, not gpulaunch."""
    (tmp_path / "train.py").write_text("")
    assert complete(generated, tmp_path, "gpulaunch start train.py --np") == []
    assert complete(generated, tmp_path, "gpulaunch start --nproc 2 train.py --lr 3 -") == []
    assert "--nproc" in complete(generated, tmp_path, "gpulaunch start --np")  # before it: ours
    assert complete(generated, tmp_path, "gpulaunch start train.py --lr 3 tra") == ["train.py"]


def test_zsh_completes_the_same(generated: dict[str, Path]) -> None:
    zsh = generated["_gpulaunch"].read_text()
    assert ":the training script (run with this Python):_files" in zsh
    assert re.search(r"--log-dir,--log_dir\}\"\[.*\]:DIR:_files -/", zsh)
    assert zsh.count("($(gpulaunch list --all --json") >= 6, zsh


def test_the_man_page_has_every_exit_status(generated: dict[str, Path]) -> None:
    page = generated["gpulaunch.1"].read_text()
    assert ".SH EXIT STATUS" in page
    section = page.split(".SH EXIT STATUS", 1)[1].split("\n.SH", 1)[0]
    codes = re.findall(r"^  (\S+) ", (errors.__doc__ or "").split("Exit codes:")[1], re.M)
    assert codes and re.findall(r"^\.B (\S+)$", section, re.M) == codes
    assert "internal error (a bug: rerun with --debug and report it)" in section
