"""What a job's ranks use: CPU, memory, processes, GPU (gpulaunch top, status --resources,
the report's usage columns). Read-only: nothing here changes a process or a unit."""
