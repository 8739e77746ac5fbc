"""The fault soak's rank (bench/soak/): stamp `ready.<rank>`, then do its part.

The rank `--fault-rank` waits `--after` seconds, stamps `fault.<rank>` and does its
fault: `exit` (exit `--code`), `sigkill` or `sigsegv` (sent to itself; no core file:
the process is made non-dumpable first), or `none` (it sleeps like the others).
Every other rank sleeps `--sleep` seconds and exits 0. Imports nothing heavy: a job
takes about a second. SIGTERM ends it at once (default disposition).

`--children N`: each rank first starts N processes of its own that sleep (as a
dataloader's workers or a `subprocess` do) and stamps `children.<rank>` once they
run; they carry the job's token in their environment, so the soak finds any left.

`--hold S`: a rank told to stop (SIGTERM or SIGINT) stamps `term.<rank>`, ignores any
further SIGTERM/SIGINT and exits 128+signal S seconds later, as a rank that saves a
checkpoint first (the soak's restart-sigterm kind signals the watcher meanwhile).
"""

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import time

from stamp import write_stamp  # sys.path[0] is this directory

PR_SET_DUMPABLE = 4

p = argparse.ArgumentParser()
p.add_argument("--dir", required=True)
p.add_argument("--fault", choices=("none", "exit", "sigkill", "sigsegv"), default="none")
p.add_argument("--fault-rank", type=int, default=0)
p.add_argument("--code", type=int, default=1)
p.add_argument("--after", type=float, default=0.5)
p.add_argument("--sleep", type=float, default=0.5)
p.add_argument("--token", required=True)
p.add_argument("--children", type=int, default=0)
p.add_argument("--hold", type=float, default=0.0)
args = p.parse_args()
rank = int(os.environ["RANK"])


def hold(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    write_stamp(args.dir, "term", rank, time.time())
    time.sleep(args.hold)
    os._exit(128 + signum)


if args.hold:
    signal.signal(signal.SIGTERM, hold)
    signal.signal(signal.SIGINT, hold)
kids = [
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    for _ in range(args.children)
]
if kids:
    write_stamp(args.dir, "children", rank, time.time())
write_stamp(args.dir, "ready", rank, time.time())
if rank != args.fault_rank or args.fault == "none":
    time.sleep(args.sleep)
    raise SystemExit(0)
time.sleep(args.after)
write_stamp(args.dir, "fault", rank, time.time())
if args.fault == "exit":
    os._exit(args.code)
if args.fault == "sigsegv":
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # a core file is not what we test
os.kill(os.getpid(), signal.SIGKILL if args.fault == "sigkill" else signal.SIGSEGV)
