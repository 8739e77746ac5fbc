"""Command-line text where only UTF-8 will do: D-Bus strings, the journal, unit files.

argv is bytes: Python hands an argument that is not UTF-8 over with lone surrogates
(PEP 383), which no UTF-8 encoder takes. The script and its arguments may be any
bytes (the ranks get them unchanged); what gpulaunch shows of them is `printable`.
Every other option must be text (`not_utf8`).
"""

from __future__ import annotations

import os


def not_utf8(text: str) -> bool:
    """Whether `text` came from bytes that are not UTF-8 (or is otherwise not encodable)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def printable(text: str) -> str:
    """`text` as valid UTF-8, the bytes that were not shown as \\xNN."""
    if not not_utf8(text):
        return text
    return os.fsencode(text).decode("utf-8", "backslashreplace")
