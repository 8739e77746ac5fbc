"""The `gpulaunch` command (console script and `python -m gpulaunch`).

gpulaunch's imports (jinja2, psutil, D-Bus) take a while on a loaded machine;
a ^C during them must not print a Python traceback. Until `cli.main` runs,
SIGINT ends the process quietly with 130, as an interrupted job does; then
Python's usual KeyboardInterrupt is back for the commands that catch it.
"""

import signal
from types import FrameType
from typing import NoReturn


def _interrupted(signum: int, frame: FrameType | None) -> NoReturn:
    raise SystemExit(128 + signum)  # no traceback: SystemExit is not an error


def main() -> NoReturn:
    previous = signal.signal(signal.SIGINT, _interrupted)
    from gpulaunch.cli import main as cli_main

    signal.signal(signal.SIGINT, previous)
    cli_main()


if __name__ == "__main__":
    main()
