"""Scenario 11's rank (bench/scenarios/pod_restart.py), run by gpulaunch in a container.

Its first statement stamps the time: `--out DIR` gets a line `TIME ATTEMPT` appended to
`upRANK` each time the rank starts (the directory is bind-mounted from the VM, so the
stamps outlive the container, and every process reads the same VM clock). The first time
(no `DIR/failed` yet) rank 1 waits until rank 0 is up, writes the time of its failure to
`DIR/failed` and exits 3, while rank 0 sleeps (as if in a collective) until it is stopped.
Later (`DIR/failed` exists: a restarted gang, in the same or a restarted container) every
rank exits 0 at once. Plain Python: the lab's image has no torch (scenario 11 says why).
"""

import time

UP = time.time()

import os  # noqa: E402  (after the stamp: its time is the rank's first line)
import sys  # noqa: E402

WAIT_CAP_S = 600.0


def main() -> int:
    out = sys.argv[sys.argv.index("--out") + 1]
    rank = int(os.environ["RANK"])
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
    with open(os.path.join(out, f"up{rank}"), "a") as f:
        f.write(f"{UP:.6f} {attempt}\n")
    failed = os.path.join(out, "failed")
    if os.path.exists(failed):
        return 0  # the restarted gang: up, done
    if rank != 1:
        time.sleep(WAIT_CAP_S)  # until the gang is stopped
        return 0
    deadline = time.monotonic() + WAIT_CAP_S
    while not os.path.exists(os.path.join(out, "up0")) and time.monotonic() < deadline:
        time.sleep(0.02)  # rank 0 up: the failure happens in a running gang
    at = time.time()
    with open(failed + ".tmp", "w") as f:
        f.write(f"{at:.6f}\n")
    os.rename(failed + ".tmp", failed)
    return 3


if __name__ == "__main__":
    sys.exit(main())
