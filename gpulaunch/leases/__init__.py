"""Shared GPU machines (issue 28): leases between jobs, a health gate, GPU accounting.

request.py: `--gpus auto:N` and `--wait-for-gpus` turned into a lease before the plan;
store.py: the per-GPU lock files under /run/gpulaunch/gpus and taking them;
holders.py: who holds a GPU (the kernel's /proc/locks, else the open files' fdinfo), for
refusals and `gpulaunch list`;
notes.py: the holders' notes naming their jobs (root's in /run/gpulaunch/holders, a user's in
their own runtime directory);
health.py: the NVML gate before the start and each restart;
accounting.py: the GPU use of a finished job, for its report and record;
part.py: all three as one of the job's parts (gpulaunch/parts.py), called by the watcher.
"""
