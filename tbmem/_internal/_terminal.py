"""Text from files, made safe to print on a terminal.

Run names (folder names in a shared logdir) and the frame names of a snapshot come from
files anyone may have written. Printed as they are, an escape sequence in one clears the
screen, sets the window title or writes the clipboard (OSC 52), and a newline forges a
line of output. :func:`printable` writes every control character (C0, DEL, C1), the
Unicode line separators and the bidirectional overrides as a visible escape instead,
the way Python's ``repr`` does.

Example:
    >>> from tbmem._internal._terminal import printable
    >>> printable("run\\x1b[2J\\nforged")
    'run\\\\x1b[2J\\\\nforged'
    >>> printable("ünïcode ok")
    'ünïcode ok'
"""

from __future__ import annotations

import re

__all__ = ["printable", "printable_lines"]

# C0 controls, DEL, C1 controls, line/paragraph separators, bidi embeddings/overrides/isolates
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_UNSAFE_BUT_TAB = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    ch = m.group()
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on written as an escape (``\\x1b``, ``\\n``)."""
    return _UNSAFE.sub(_escape, text)


def printable_lines(text: str) -> str:
    """:func:`printable` of each line of ``text``: its own line breaks stay (and tabs, for tables)."""
    return "\n".join(_UNSAFE_BUT_TAB.sub(_escape, line) for line in text.split("\n"))
