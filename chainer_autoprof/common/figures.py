"""Every figure printed for people (summary, verdict, advice, HTML) goes through here.

One formatter, so that the same quantity reads the same everywhere and no
figure ever comes out in exponent notation (``5.68 s``, never
``5.68e+03 ms``; ``0.000123``, never ``1.23e-04``).  A value that is not a
finite number (a figure that could not be computed) reads ``?``.
"""

from __future__ import annotations

import math

#: What a figure that is not a finite number reads.
UNKNOWN = "?"


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def num(x: float, digits: int = 3, grouping: bool = True) -> str:
    """``x`` with about ``digits`` significant digits, no exponent, no trailing zeros.

    ``1.5``, ``0.0123``, ``42``, ``12,346`` (values of ``10 ** digits`` and more are
    rounded to integers, with thousands separators unless ``grouping`` is off: a table
    cell that a script parses).
    """
    if not _finite(x):
        return UNKNOWN
    if x == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(x)))
    if magnitude >= digits - 1:
        return f"{x:,.0f}" if grouping else f"{x:.0f}"
    decimals = min(digits - 1 - magnitude, 12)
    text = f"{x:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def fixed(x: float, decimals: int = 1, grouping: bool = True) -> str:
    """``x`` with a fixed number of decimals (a rate such as ``332.2`` it/s)."""
    if not _finite(x):
        return UNKNOWN
    return f"{x:,.{decimals}f}" if grouping else f"{x:.{decimals}f}"


def ms(x: float) -> str:
    """A duration given in milliseconds: ``0.123 ms``, ``12.3 ms``, ``2.43 s``, ``1.2 min``."""
    if not _finite(x):
        return UNKNOWN
    if x < 0:
        return "-" + ms(-x)
    if x >= 7_200_000:
        return f"{x / 3_600_000:.1f} h"
    if x >= 119_950:
        return f"{x / 60_000:.1f} min"
    if x >= 999.5:  # (thresholds at the rounding points: 999.7 ms reads 1.00 s, not 1000 ms)
        return f"{x / 1000:.2f} s"
    if x >= 99.95:
        return f"{x:.0f} ms"
    if x >= 9.995:
        return f"{x:.1f} ms"
    if x >= 0.9995:
        return f"{x:.2f} ms"
    if 0 < x < 0.0005:
        return f"{num(x, 2)} ms"
    return f"{x:.3f} ms"


def us(x: float) -> str:
    """A duration given in microseconds: ``4.3 us``, ``178 us``; from 10 ms on, as :func:`ms`."""
    if not _finite(x):
        return UNKNOWN
    if abs(x) >= 10_000:
        return ms(x / 1000.0)
    return f"{num(x)} us"


def pct(share: float) -> str:
    """A share (0-1) as a percentage: ``12.3%``."""
    if not _finite(share):
        return UNKNOWN
    return f"{100.0 * share:.1f}%"


def factor(x: float) -> str:
    """A ratio: ``5.4x``, ``1.12x`` under 2, ``250x``."""
    if not _finite(x):
        return UNKNOWN
    if abs(x) < 2:
        return f"{x:.2f}x"
    if abs(x) < 100:
        return f"{x:.1f}x"
    return f"{x:,.0f}x"


def count(n: float) -> str:
    """A count: ``1,234`` (a fractional mean keeps up to three significant digits)."""
    if not _finite(n):
        return UNKNOWN
    if float(n).is_integer():
        return f"{int(n):,}"
    return num(n)


def size(n_bytes: float) -> str:
    """A memory size given in bytes: ``812 KiB``, ``12.4 MiB``, ``1.25 GiB`` (negative: a
    shrink)."""
    if not _finite(n_bytes):
        return UNKNOWN
    if n_bytes < 0:
        return "-" + size(-n_bytes)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n_bytes >= 0.9995 * scale:
            value = n_bytes / scale
            return f"{value:.2f} {unit}" if value < 9.995 else f"{value:,.1f} {unit}"
    return f"{n_bytes:.0f} B"
