"""GPU leases between the jobs of one machine (`--gpus auto:N`, issue 28).

store.py: the per-GPU lock files under /run/gpulaunch/gpus and taking them;
holders.py: who holds a GPU (the kernel's /proc/locks, the holders' notes);
ask.py, request.py: `--gpus auto:N` and `--wait-for-gpus` turned into a lease before the plan.
"""
