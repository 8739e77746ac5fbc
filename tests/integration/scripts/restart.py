"""Fails in rank 1 on the first attempt only; records the restart count each rank saw."""

import os
import sys

out = sys.argv[sys.argv.index("--dir") + 1]
rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
with open(os.path.join(out, f"attempt{attempt}-rank{rank}"), "w") as f:
    f.write(os.environ["TORCHELASTIC_MAX_RESTARTS"])
if rank == "1" and attempt == "0":
    sys.exit(4)
