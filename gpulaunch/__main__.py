"""The `gpulaunch` command (console script and `python -m gpulaunch`).

gpulaunch's imports (jinja2, psutil, D-Bus) take a while on a loaded machine;
a ^C during them must not print a Python traceback. From the first line of
this module (imported only to run the command) until `cli.main` runs, SIGINT
ends the process quietly with 130, as an interrupted job does; then Python's
usual KeyboardInterrupt is back for the commands that catch it. What is left
is the interpreter's own start-up before this line: milliseconds.

SIGTERM and SIGHUP get the same handler from that first line, until a command
installs its own (the watcher's comes after its imports): as a container's PID 1
(`unshare -fp`, `docker run`) the kernel drops every signal PID 1 has no handler
for, so a `docker stop` in those first few hundred milliseconds was lost (issue
22, item 11). One that is ignored (`nohup`) stays ignored. Such a stop says so in one
line; `start` then had made nothing of its job yet (units, ranks, record): it is
"stopped before the job started", with 128+N.
"""

import os
import signal
import sys

# The command (the first word that is not an option), for the line of a stop.
_COMMAND = next((a for a in sys.argv[1:] if not a.startswith("-")), "")
STOPPED_BEFORE_START = "gpulaunch: stopped by {name} before the job started (nothing was made)"


def _interrupted(signum: int, frame: object) -> None:
    if signum != signal.SIGINT:  # (a ^C shows itself on the terminal)
        name = signal.Signals(signum).name
        line = STOPPED_BEFORE_START if _COMMAND == "start" else "gpulaunch: stopped by {name}"
        os.write(2, (line.format(name=name) + "\n").encode())  # not print: no reentrancy
    raise SystemExit(128 + signum)  # no traceback: SystemExit is not an error


_PREVIOUS = signal.signal(signal.SIGINT, _interrupted)  # as early as our code runs
for _stop in (signal.SIGTERM, signal.SIGHUP):
    if signal.getsignal(_stop) == signal.SIG_DFL:
        signal.signal(_stop, _interrupted)


def main() -> None:
    from gpulaunch.cli import main as cli_main

    signal.signal(signal.SIGINT, _PREVIOUS)
    cli_main()


if __name__ == "__main__":
    main()
