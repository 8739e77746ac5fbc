"""scripts/: what the README's two commands install (issue 19, item 8)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_setup_takes_demo_unit_or_test_only() -> None:
    res = subprocess.run(
        ["bash", str(REPO / "scripts" / "setup.sh"), "everything"], capture_output=True, text=True
    )
    assert res.returncode == 2 and "use demo, unit or test" in res.stderr


def test_the_demo_installs_only_what_it_needs() -> None:
    demo = (REPO / "scripts" / "demo.sh").read_text()
    assert re.search(r"^bash scripts/setup\.sh demo\b", demo, re.M)
    setup = (REPO / "scripts" / "setup.sh").read_text()
    # the test extra only for `test`; torch once, its CPU build, unless one is installed
    assert re.search(
        r'if \[ "\$WHAT" = demo \]; then\n(\s+#.*\n)*\s+"\$\{PIP\[@\]\}" -e \. numpy\n'
        r'else\n\s+"\$\{PIP\[@\]\}" -e \'\.\[test\]\'',
        setup,
    )
    assert "download.pytorch.org/whl/cpu" in setup and "has_torch .venv/bin/python" in setup


def test_the_unit_tests_need_neither_slurm_nor_the_vm_lab_nor_etc() -> None:
    """`setup.sh unit`: Slurm, qemu, debootstrap (TEST_PACKAGES) only for `test`, and it
    ends before `gpulaunch setup` writes into /etc; scripts/test.sh (CI) still installs all."""
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert 'if [ "$WHAT" = test ]; then PACKAGES+=("${TEST_PACKAGES[@]}"); fi' in setup
    for pkg in ("slurmd", "qemu-system-x86", "debootstrap"):
        assert re.search(rf"^TEST_PACKAGES\+?=\(.*\b{pkg}\b", setup, re.M), pkg
    unit_exit = setup.index('[ "$WHAT" != unit ] || exit 0')
    assert unit_exit < setup.index("\n.venv/bin/gpulaunch setup")
    test_sh = (REPO / "scripts" / "test.sh").read_text()
    assert re.search(r"^bash scripts/setup\.sh$", test_sh, re.M)  # the default: test
