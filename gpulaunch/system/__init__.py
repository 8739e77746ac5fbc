"""What a machine needs for gpulaunch, and what it has: `gpulaunch setup` and `gpulaunch doctor`.

- `setup.py`: `gpulaunch setup`, from `files.py`, the files the package ships;
- `doctor.py`: `gpulaunch doctor`'s table, from `checks.py` (one `Finding` per question)
  and `cgroupchecks.py` (which limits a job gets), in `findings.py`'s vocabulary.
"""
