"""Small text helpers every report shares: HTML escaping, the numbers a chart may draw, and plurals."""

from __future__ import annotations

import html
import math
from typing import Any


def escape(text: Any) -> str:
    """``text`` as HTML text (``str()`` first: reports escape numbers and None too)."""
    return html.escape(str(text))


def positive_number(value: Any) -> float | None:
    """``value`` as a finite positive float, or None (a rate or a time that a chart can draw on a log scale)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 element``, ``2 elements`` (``many`` for an irregular plural)."""
    return f"{n} {word if n == 1 else many or word + 's'}"
