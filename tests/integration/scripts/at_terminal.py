"""Run a command at a real terminal and type on it, as a user at a shell would.

    python at_terminal.py PLAN -- ARGV...

The command gets a new session whose controlling terminal is a pty (`pty.fork`: setsid,
then the pty's slave opened as fds 0-2), so it is the terminal's foreground process group,
as a shell's foreground job is. PLAN is a JSON list of steps: `{"expect": TEXT}` waits
until the screen shows TEXT (since the last send), `{"send": TEXT}` types
TEXT on the terminal (`"\\u0003"` is Ctrl-C: the terminal's interrupt character, which the
kernel turns into SIGINT for the foreground group; no signal is sent by this script).

Prints one JSON object: `status` (the command's exit status as a shell reports it, 128+N
for signal N), `screen` (everything the terminal showed) and `failed` (the text an expect
waited for in vain, else null; the command's session is then killed).
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import struct
import sys
import termios
import time

TIMEOUT = float(os.environ.get("TTY_TIMEOUT", "120"))


def main() -> None:
    plan = json.loads(sys.argv[1])
    argv = sys.argv[sys.argv.index("--") + 1 :]
    pid, master = pty.fork()
    if pid == 0:  # the child: its own session, the pty its controlling terminal
        try:
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 250, 0, 0))
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    screen = b""
    open_ = True

    def read(deadline: float) -> None:
        nonlocal screen, open_
        ready, _, _ = select.select([master], [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            return
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: nothing holds the terminal any more
            data = b""
        screen += data
        open_ = bool(data)

    seen, failed = 0, None
    for step in plan:
        if "send" in step:
            os.write(master, step["send"].encode())
            seen = len(screen)
            continue
        want = step["expect"].encode()
        deadline = time.monotonic() + TIMEOUT
        while want not in screen[seen:] and open_ and time.monotonic() < deadline:
            read(deadline)
        if want not in screen[seen:]:
            failed = step["expect"]
            os.killpg(pid, signal.SIGKILL)
            break
    deadline = time.monotonic() + TIMEOUT
    while open_ and time.monotonic() < deadline:  # to the end: every holder of it closed
        read(deadline)
    if open_:  # it did not end
        failed = failed or "the end"
        os.killpg(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    result = {
        "status": 128 - code if code < 0 else code,
        "screen": screen.decode("utf-8", "replace"),
        "failed": failed,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
