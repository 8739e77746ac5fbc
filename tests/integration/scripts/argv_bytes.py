"""Writes the bytes of its arguments after `--dir DIR` to DIR/argv<RANK>.hex (NUL-separated)."""

import os
import sys

args = [os.fsencode(a) for a in sys.argv[1:]]
directory = os.fsdecode(args[args.index(b"--dir") + 1])
rest = args[args.index(b"--dir") + 2 :]
with open(os.path.join(directory, f"argv{os.environ['RANK']}.hex"), "w") as f:
    f.write(b"\0".join(rest).hex())
