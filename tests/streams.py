"""Checks of a recorded NVTX stream: balance, colours, registered names, expected trees.

Shared by the tests that read what a profiler would see (tests/nvtx_tool.py records it).
Expected trees are written at function granularity, each line tagged with the coarsest
granularity that shows it (I iteration, P phase, L link, F function); :func:`prune`
derives the tree a coarser granularity emits.
"""

from __future__ import annotations

from nvtx_tool import NvtxEvent, ranges_by_thread

from chainer_autoprof.common import names

#: The colours the ranges must have (ARGB); the four phases' are chainer_profutil's.
PHASE_COLOURS = {"iteration": 0xFFFFF100, "forward": 0xFF76B900, "backward": 0xFF7FDBFF,
                 "update": 0xFFE60012, "data": names.CATEGORIES[names.DATA][1],
                 "inference": names.CATEGORIES[names.INFERENCE][1]}


def expected_colour(text: str, user: tuple[str, ...] = ()) -> int:
    """The colour a range named ``text`` must have (``user``: annotate() names)."""
    if text in user:
        return names.CATEGORIES[names.USER][1]
    if text in PHASE_COLOURS:
        return PHASE_COLOURS[text]
    if text.startswith("extension:"):
        return names.CATEGORIES[names.EXTENSION][1]
    if names.gc_generation(text) is not None:
        return names.CATEGORIES[names.GC][1]
    if text.endswith(" backward"):
        return names.CATEGORIES[names.LINK_BACKWARD][1]
    if text.endswith((".forward", ".backward")):
        return names.CATEGORIES[names.FUNCTION][1]
    return names.CATEGORIES[names.LINK][1]


def check_stream(events: list[NvtxEvent], domain: str = "chainer",
                 user: tuple[str, ...] = ()) -> None:
    """Balanced, right colours, messages registered in ``domain`` before use."""
    ranges = ranges_by_thread(events, domain)  # raises on a pop without push or a range left open
    registered: set[str] = set()
    for ev in events:
        if ev.domain != domain:
            continue
        if ev.event == "string":
            registered.add(ev.text)
        elif ev.event == "push":
            assert ev.text in registered, f"{ev.text!r} pushed as a plain, unregistered string"
    for thread_ranges in ranges.values():
        for _depth, text, colour in thread_ranges:
            assert colour == expected_colour(text, user), f"{text!r}: colour {colour:#x}"


def segments(events: list[NvtxEvent], domain: str = "chainer") -> dict[str, list[NvtxEvent]]:
    """The events of ``domain`` between the program's ``scenario`` marks, by mark."""
    parts: dict[str, list[NvtxEvent]] = {}
    current: list[NvtxEvent] | None = None
    for ev in events:
        if ev.event == "mark" and ev.domain == "scenario":
            current = parts.setdefault(ev.text, [])
        elif current is not None and ev.domain == domain:
            current.append(ev)
    return parts


def tree_of(events: list[NvtxEvent], domain: str = "chainer") -> list[str]:
    ranges = ranges_by_thread(events, domain)
    assert len(ranges) <= 1, f"ranges on several threads: {sorted(ranges)}"
    return ["  " * d + text for d, text, _ in next(iter(ranges.values()), [])]


# -- expected trees --------------------------------------------------------------
# Written at function granularity; each line is tagged with the coarsest
# granularity that shows it: I iteration, P phase, L link, F function.
# ``prune`` derives the tree a coarser granularity emits.

LEVEL = {"I": names.ITERATION_LEVEL, "P": names.PHASE_LEVEL, "L": names.LINK_LEVEL,
         "F": names.FUNCTION_LEVEL}
GRANULARITIES = ("iteration", "phase", "link", "function")


def prune(tagged: str, granularity: str) -> list[str]:
    """The lines of ``tagged`` a granularity emits, re-indented under their kept ancestors."""
    limit = names.GRANULARITY_LEVEL[granularity]
    out: list[str] = []
    kept: list[tuple[int, bool]] = []  # (indent, kept) of the open ancestors
    for line in tagged.splitlines():
        if not line.strip():
            continue
        indent = (len(line) - len(line.lstrip())) // 2
        tag, text = line.strip().split(" ", 1)
        while kept and kept[-1][0] >= indent:
            kept.pop()
        keep = LEVEL[tag] <= limit
        if keep:
            out.append("  " * sum(1 for _, k in kept if k) + text)
        kept.append((indent, keep))
    return out
