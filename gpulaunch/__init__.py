"""gpulaunch: distributed PyTorch ranks supervised by systemd."""
