"""Exits with `--status` at once, after appending `SLURM_RESTART_COUNT TORCHELASTIC_RESTART_COUNT`
(the Slurm run and gpulaunch's attempt it ran in) to `--dir`/attempts."""

import os
import sys

out = sys.argv[sys.argv.index("--dir") + 1]
status = int(sys.argv[sys.argv.index("--status") + 1])
run, attempt = os.environ.get("SLURM_RESTART_COUNT", "-"), os.environ["TORCHELASTIC_RESTART_COUNT"]
with open(os.path.join(out, "attempts"), "a") as f:
    f.write(f"{run} {attempt}\n")
sys.exit(status)
