"""gpulaunch's benchmark suite: each scenario under gpulaunch and under `torchrun --standalone`.

`python -m bench` runs every scenario (inside the project's systemd box where the host
runs no systemd) and writes `bench/results/<date>.md` and `.json`. See bench/cli.py.
Scenario 11 instead compares gpulaunch's restart inside a podman container with podman
restarting the container, in the VM lab (bench/podlab.py boots it and builds the image).
"""
