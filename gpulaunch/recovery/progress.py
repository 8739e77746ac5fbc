"""Whether an attempt made progress before it failed: the one test of it (crash loops).

An attempt made progress when a rank reported a training step in it (the progress
channel, gpulaunch/progress/), or when it ran at least `--progress-after` seconds
before its failure: a script that dies the same way within seconds of every start
(an import error, a bad path, an OOM while loading the model) is in a crash loop;
one that trained for a while and then failed may well get further after a restart.
"""

from __future__ import annotations

from gpulaunch.recovery.failure import Failure


def made_progress(failure: Failure, progress_after: float) -> bool:
    """Did the attempt that ended in `failure` get anywhere before it failed?"""
    return failure.stepped or failure.runtime >= progress_after
