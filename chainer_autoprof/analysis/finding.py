"""One piece of advice: what a check (:mod:`.advice`, a per-iteration figure) returns and
the renderers show."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Finding:
    """One piece of advice: its key, title, what was seen, the measured cost when there is one,
    the fix and the documentation section."""

    key: str
    title: str
    seen: str
    cost: str
    fix: str
    link: str
