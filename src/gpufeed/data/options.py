"""Checks of the Loader's, ShardDataset's and Augment's options when they are given: a value that
cannot work is an `OptionError` naming the option and what to pass, not a torch or numpy error
at the first batch."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable
from typing import Any

from gpufeed.errors import OptionError


def whole(name: str, value: Any, least: int = 0, most: int | None = None) -> int:
    """`value` as an int where it is a whole number >= `least` (and <= `most`): a Python, numpy
    or 0-d torch integer, or a float such as 4.0 (not a bool, not text)."""
    number = _number(value)
    if number is None or not number.is_integer() or number < least:
        bounds = f">= {least}" if most is None else f"from {least} to {most}"
        raise OptionError(f"{name} must be an integer {bounds}, got {value!r}")
    if most is not None and number > most:
        raise OptionError(f"{name} must be an integer from {least} to {most}, got {value!r}")
    return int(number)


def real(
    name: str,
    value: Any,
    low: float,
    high: float,
    *,
    above_low: bool = False,
    flag: bool = False,
) -> float:
    """`value` as a float where it is a finite number in [low, high] ((low, high] with
    `above_low`); with `flag`, False and True read as 0 and 1."""
    number = float(value) if flag and isinstance(value, bool) else _number(value)
    if number is None or number > high or number < low or (above_low and number == low):
        span = f"{'above' if above_low else 'from'} {low:g} {'up ' if above_low else ''}to {high:g}"
        raise OptionError(f"{name} must be a number {span}, got {value!r}")
    return number


def flag(name: str, value: Any) -> bool:
    """`value` where it is True or False (a numpy bool too); text such as "False" from a config
    file or the command line is refused: read by truthiness it would mean True."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise OptionError(f"{name} must be True or False, got {value!r}")


def _number(value: Any) -> float | None:
    """A finite number as a float (numpy and 0-d torch values too); None for a bool, text,
    NaN or anything else."""
    if isinstance(value, (bool, str, bytes)):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a torch tensor of many values
        return None
    return number if math.isfinite(number) else None


def finite(value: Any) -> float | None:
    """`value` as a finite float, None where it is not a number (for checks made elsewhere)."""
    return _number(value)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgtp])(i)?)?b?\s*$", re.IGNORECASE)


def byte_count(name: str, value: Any, least: int = 1) -> int:
    """`value` as a number of bytes >= `least`: a whole number (an int, or a float such as
    4e9), or text with a unit: '4GB', '1.5G' (powers of 1000), '512MiB' (powers of 1024)."""
    n = _number(value)
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m:
            power = 1 + "kmgtp".index(m.group(2).lower()) if m.group(2) else 0
            n = math.floor(float(m.group(1)) * (1024 if m.group(3) else 1000) ** power)
    if n is None or not float(n).is_integer():
        raise OptionError(
            f"{name}={value!r}: give a number of bytes (an int such as 4_000_000_000) or a "
            "size such as '4GB' (powers of 1000) or '512MiB' (powers of 1024)"
        )
    if n < least:
        raise OptionError(f"{name}={value!r} is {int(n):,} bytes: give at least {least:,}")
    return int(n)


def several(
    name: str, value: Any, n: int, low: float, high: float, *, above_low: bool = False
) -> tuple[float, ...]:
    """`value` where it holds `n` numbers, each as `real` checks them."""
    try:
        items = tuple(value)
    except TypeError:
        items = ()
    if len(items) != n:
        raise OptionError(f"{name} must be {n} numbers, got {value!r}")
    return tuple(
        real(f"{name}[{i}]", v, low, high, above_low=above_low) for i, v in enumerate(items)
    )


def ordered(name: str, value: Any, low: float, high: float) -> tuple[float, float]:
    """A (least, most) pair of numbers above `low` and up to `high`, least first."""
    lo, hi = several(name, value, 2, low, high, above_low=True)
    if lo > hi:
        raise OptionError(f"{name}={value!r}: give the least value first, ({hi:g}, {lo:g})")
    return lo, hi


def known(what: str, given: Iterable[str], names: Iterable[str]) -> None:
    """Refuse the keyword options in `given` that are not in `names`, suggesting the closest."""
    names = sorted(set(names))
    unknown = sorted(set(given) - set(names))
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise OptionError(f"{what} has no option {name!r}: {hint}it takes {', '.join(names)}")
