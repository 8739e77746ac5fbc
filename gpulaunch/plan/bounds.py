"""The largest numbers gpulaunch takes on its command line, checked before anything is made.

A number beyond these is a typo, not a job: refused at once in one line (exit 2),
never planned (a list of 10**8 GPUs, an index-sized overflow, a MemoryError).
"""

from __future__ import annotations

MAX_NPROC = 16384  # ranks on one machine (each is two processes and about 6 open files)
MAX_NNODES = 65536  # nodes of one job (world size = nodes * ranks stays an int32)
MAX_GPU = 1023  # the highest GPU number in the pool (CUDA_VISIBLE_DEVICES' positions)
MAX_RANK = 2**31 - 1  # a global rank (an int32 in torch, and on D-Bus)
MAX_RESTARTS = 1_000_000  # --max-restarts
MIN_NODE_TIMEOUT = 0.5  # --node-timeout: its heartbeat every 1/20 of it (25 ms at least)
MAX_NODE_TIMEOUT = 600.0
