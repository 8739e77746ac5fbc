"""gpulaunch: distributed PyTorch ranks supervised by systemd."""

__version__ = "0.1.0"  # the package's version (pyproject.toml reads it from here)
