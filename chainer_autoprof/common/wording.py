"""Small pieces of wording the summary and the verdict share: ties said as ties, counts
with their noun in the right number."""

from __future__ import annotations

from typing import Callable, Mapping, Sequence


def leaders(values: Mapping[str, float], shown: Callable[[float], str]) -> list[str]:
    """The keys whose value, as ``shown`` prints it, equals the largest one's (in the order of
    ``values``): a tie the reader would see is said as a tie, not broken by the order of keys."""
    if not values:
        return []
    top = shown(max(values.values()))
    return [key for key, value in values.items() if shown(value) == top]


def joined(words: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]


def counted(number_text: str, noun: str) -> str:
    """``1 call``, ``2 calls``, ``0.5 calls``: the noun singular for exactly one."""
    return f"{number_text} {noun}" if number_text == "1" else f"{number_text} {noun}s"
