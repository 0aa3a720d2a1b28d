"""Text on the ground floor, for every layer: counts and figures said one way (`count`, `figure`,
`number`, `ordinal`, `finite`), and text that came from data (sample keys, shard and class names,
paths, URLs, argv) made safe to print: `visible` is the one escaping helper that every message,
warning and table goes through.

A terminal acts on what it is sent: ESC and CSI sequences move the cursor, clear the screen or
recolour; OSC sets the window title or makes hyperlinks; bidi and zero-width characters make a
name read as another. `visible` shows each such character as its Python escape (`\\x1b`,
`\\u202e`) instead, and the bytes of a name that is not UTF-8 (held by Python as lone
surrogates) as `\\xNN`.
"""

from __future__ import annotations

import math
import re
from typing import Any

# C0 and C1 controls (ESC, CSI, BEL, CR...), DEL, and every format character (Unicode category
# Cf: soft hyphen, zero-width and joiner characters, bidi marks, embeddings, overrides and
# isolates, BOM, interlinear annotation, tag characters), the line and paragraph separators, and
# lone surrogates.
_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"
    "\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e007f\ud800-\udfff]"
)


def visible(value: Any, keep_newlines: bool = False) -> str:
    """`str(value)` with control, bidi and zero-width characters shown as escapes (`\\x1b`,
    `\\u202e`) and undecodable file-name bytes as `\\xNN`; newlines kept with `keep_newlines`."""
    text = str(value)
    if text.isprintable():  # every character _CONTROL matches is non-printable
        return text
    return _CONTROL.sub(_escape_newlines if keep_newlines else _escape, text)


def valid_text(name: str) -> str:
    """`name` as valid UTF-8 text, to store (JSON) rather than print: the bytes of a name that is
    not UTF-8 (lone surrogates) written as `\\xNN`; every other character kept."""
    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that no undecodable byte makes
        raw = name.encode("utf-8", "backslashreplace")
    return raw.decode("utf-8", "backslashreplace")


def _escape(m: re.Match[str]) -> str:
    c = m.group(0)
    if "\udc80" <= c <= "\udcff":  # an undecodable byte of a file name (surrogateescape)
        return f"\\x{ord(c) - 0xDC00:02x}"
    return c.encode("unicode_escape").decode("ascii")


def _escape_newlines(m: re.Match[str]) -> str:
    return "\n" if m.group(0) == "\n" else _escape(m)


MB = 1_000_000  # a megabyte, as sizes are said (`--shard-size 64MB`, reports)
MiB = 1 << 20  # a mebibyte, as buffers and reads are sized
MISSING = "–"


def number(value: float | None, digits: int = 0, unit: str = "", missing: str = MISSING) -> str:
    """`value` with thousands separators, `digits` decimals and `unit`; `missing` where it is None,
    NaN or infinite."""
    if value is None or not math.isfinite(value):
        return missing
    return f"{value:,.{digits}f}{unit}"


def figure(value: float | None, unit: str = "", missing: str = MISSING) -> str:
    """`value` with about three significant digits, whatever its size: "0.45", "11.3", "1,234"
    (a rate of 0.45 steps/s is not "0")."""
    if value is None or not math.isfinite(value):
        return missing
    size = abs(value)
    return number(value, 2 if size < 10 else 1 if size < 100 else 0, unit)


def count(n: int, noun: str) -> str:
    """`n` and `noun`, plural unless n is 1: "1 step", "3 steps", "2 classes"."""
    if n == 1:
        return f"1 {noun}"
    return f"{n:,} {noun}{'es' if noun.endswith(('s', 'x', 'ch', 'sh')) else 's'}"


def ordinal(n: int) -> str:
    """`n` as an ordinal: "2nd", "3rd", "11th", "21st"."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def finite(value: object) -> float | None:
    """A value read from a file (meta.json) as a float where it is a finite number, else None."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None
