"""What a job's ranks use: CPU, memory, processes, GPU (gpulaunch top, status --resources,
the report's usage columns). Read-only: nothing here changes a process or a unit.

- `sample.py`: one look at every rank of a job; `nvml.py`: GPU use per process (optional);
- `view.py`: the resources table of `top` and `status --resources`;
- `controllers.py`: which limits the job's manager can enforce here.
"""
