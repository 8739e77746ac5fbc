"""The watcher's command line through systemd, whatever bytes the user's arguments are.

`ExecStart=` goes over D-Bus, whose strings must be UTF-8; a script argument need
not be (argv is bytes). Where one is not, the front end hands the watcher its
arguments after `--job JOB` as one hex string of the NUL-separated bytes
(`--frontend-argv HEX`), and `cli.main` unpacks them before parsing: the ranks get
exactly the bytes the user typed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from gpulaunch.base.argtext import not_utf8

FLAG = "--frontend-argv"


def pack_argv(tail: Sequence[str]) -> list[str]:
    """`tail` unchanged if it is all UTF-8, else `[FLAG, HEX]`."""
    if not any(not_utf8(arg) for arg in tail):
        return list(tail)
    return [FLAG, b"\0".join(os.fsencode(arg) for arg in tail).hex()]


def unpack_argv(argv: Sequence[str]) -> list[str]:
    """The command line with a packed tail (`start --frontend-child --job J FLAG HEX`) undone."""
    args = list(argv)
    if "--frontend-child" not in args or FLAG not in args:
        return args
    at = args.index(FLAG)
    if at + 2 != len(args) or args[at - 3] != "--frontend-child":
        return args  # not ours: argparse says what is wrong
    try:
        raw = bytes.fromhex(args[at + 1])
    except ValueError:
        return args
    return args[:at] + [os.fsdecode(part) for part in raw.split(b"\0")]
