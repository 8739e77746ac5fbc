"""scripts/: what the README's two commands install (issue 19, item 8)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_setup_takes_demo_or_test_only() -> None:
    res = subprocess.run(
        ["bash", str(REPO / "scripts" / "setup.sh"), "everything"], capture_output=True, text=True
    )
    assert res.returncode == 2 and "use demo or test" in res.stderr


def test_the_demo_installs_only_what_it_needs() -> None:
    demo = (REPO / "scripts" / "demo.sh").read_text()
    assert re.search(r"^bash scripts/setup\.sh demo\b", demo, re.M)
    setup = (REPO / "scripts" / "setup.sh").read_text()
    # the test extra only for `test`; torch once, its CPU build, unless one is installed
    assert re.search(
        r'if \[ "\$WHAT" = test \]; then\n\s+"\$\{PIP\[@\]\}" -e \'\.\[test\]\'', setup
    )
    assert "download.pytorch.org/whl/cpu" in setup and "has_torch .venv/bin/python" in setup
