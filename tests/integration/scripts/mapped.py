"""A rank that records what DCGM's job map held when it started (`--map DIR`), says it is
ready, and exits 0 once `<dir>/end` exists (or sleeps until it is stopped)."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("--dir", required=True)
p.add_argument("--map", required=True)
args = p.parse_args()
rank = os.environ["RANK"]
seen = {
    entry.name: entry.read_text().split()
    for entry in Path(args.map).iterdir()
    if entry.name.isdigit()
}
out = Path(args.dir)
(out / f"rank{rank}.map").write_text(json.dumps(seen))
(out / f"rank{rank}.pid").write_text(str(os.getpid()))
(out / f"rank{rank}.ready").write_text("")
while not (out / "end").exists():
    time.sleep(0.05)
