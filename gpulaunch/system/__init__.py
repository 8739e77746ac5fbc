"""What a machine needs for gpulaunch, and what it has: `gpulaunch setup` and `gpulaunch doctor`."""
