"""A plain training loop that reports its steps to gpulaunch (docs/progress.md).

    gpulaunch start --nproc 4 --hang-timeout 60 examples/progress_loop.py

`gpulaunch status JOB` and `gpulaunch top` then show each rank's step, steps per
second, the seconds since its last step and the ETA; a rank that falls behind the
others is flagged a straggler; --hang-timeout means "no rank stepped for 60 s". Each
epoch's checkpoint is announced once written (`checkpoint(n)`): with --max-restarts, the
report says the job's goodput and what each failure cost from it. Without gpulaunch
(`python examples/progress_loop.py`) the calls do nothing.

Where gpulaunch is not installed in the ranks' Python, the protocol is short enough to
speak by hand: one datagram `X_GPULAUNCH_STEP=N\\nX_GPULAUNCH_TOTAL=M` (a checkpoint:
`X_GPULAUNCH_CHECKPOINT=N`) to the AF_UNIX socket $NOTIFY_SOCKET names (a leading @ is an
abstract name, sd_notify(3)).
"""

import os
import time

try:
    from gpulaunch.progress import checkpoint, status, step
except ImportError:  # not installed where the ranks run: report nothing

    def step(n: int, total: int | None = None, seconds: float | None = None) -> bool:
        return False

    def checkpoint(n: int) -> bool:
        return False

    def status(text: str) -> bool:
        return False


EPOCHS, BATCHES = 3, 50
rank = int(os.environ.get("RANK", "0"))
n = 0
for epoch in range(EPOCHS):
    status(f"epoch {epoch}")
    for _batch in range(BATCHES):
        time.sleep(0.02)  # forward, backward, optimizer step
        n += 1
        step(n, total=EPOCHS * BATCHES)
    # save the model and optimizer here (written and renamed into place), then say so:
    checkpoint(n)
print(f"rank {rank}: {n} steps done")
