"""Text from a binary made safe to print on a terminal: its control characters shown as escapes.

Symbol, section and string names are attacker-chosen bytes. Written raw, ESC and the C1 controls
start terminal sequences (a window title set by OSC, a cleared screen, colours), CR and the line
and paragraph separators fake new lines, and the bidirectional overrides reorder what the reader
sees. Every such character is shown as a backslash escape instead (`\\x1b`, `\\n`, `\\u202e`);
the JSON outputs need none of this, as JSON escapes its control characters itself.
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls, the Arabic letter mark, LRM/RLM, U+2028/2029, the bidi embeddings
# and overrides U+202A-202E, the isolates U+2066-2069, and lone surrogates (unencodable on output).
_UNSAFE_RE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    code = ord(char)
    return _SHORT.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def escape_controls(text: str, keep: str = "") -> str:
    """`text` with each terminal control character written as a backslash escape; `keep`: characters
    left as they are (`"\\n"` for text whose lines are its own, such as DOT)."""
    if _UNSAFE_RE.search(text) is None:
        return text
    if keep:
        return _UNSAFE_RE.sub(lambda m: m.group() if m.group() in keep else _escape(m.group()), text)
    return _UNSAFE_RE.sub(lambda m: _escape(m.group()), text)
