"""Range categories: their levels, stable names and NVTX colours.

A range's *level* decides whether the chosen granularity emits it and whether
the sync level synchronizes at its boundaries.  Colours are ARGB integers and
continue chainer_profutil's palette for iteration/forward/backward/update.
"""

from __future__ import annotations

from typing import Iterable

# Levels, coarse to fine.  Granularity G emits every range with level <= G;
# sync level S synchronizes at the boundaries of ranges with level < S (S=3: all).
ITERATION_LEVEL = 0
PHASE_LEVEL = 1
LINK_LEVEL = 2
FUNCTION_LEVEL = 3

GRANULARITY_LEVEL = {"iteration": ITERATION_LEVEL, "phase": PHASE_LEVEL,
                     "link": LINK_LEVEL, "function": FUNCTION_LEVEL}

# Categories.  Phases are the children of an iteration.
ITERATION = "iteration"
DATA = "data"
FORWARD = "forward"
BACKWARD = "backward"
UPDATE = "update"
PHASES = (DATA, FORWARD, BACKWARD, UPDATE)
EXTENSION = "extension"
INFERENCE = "inference"
#: The recorded name (category inference) of what began as an iteration of a loop without an
#: updater but reached no optimizer update (a training-mode forward after the loop): no
#: iteration.  NVTX shows it as the ``iteration`` range it was pushed as.
NO_UPDATE = "inference (no update)"
COMM = "comm"
USER = "user"
GC = "gc"
LINK = "link"
LINK_BACKWARD = "link_backward"
FUNCTION = "function"
#: The agent's own waits for the GPU (sync level 1 and above): recorded for the summary and
#: the trace, never an NVTX range (the CUDA API row already shows the synchronize call).
GPU_WAIT = "gpu_wait"
#: The agent's own work on a program's thread between its iterations (its run-time checks
#: after the first updates): recorded for the summary and the trace as the agent's time,
#: never an NVTX range.
AGENT = "agent"
AGENT_CHECKS = "chainer_autoprof: run-time checks"

#: category -> (level, ARGB colour)
CATEGORIES: dict[str, tuple[int, int]] = {
    ITERATION: (ITERATION_LEVEL, 0xFFFFF100),
    DATA: (PHASE_LEVEL, 0xFFA05DD6),
    FORWARD: (PHASE_LEVEL, 0xFF76B900),
    BACKWARD: (PHASE_LEVEL, 0xFF7FDBFF),
    UPDATE: (PHASE_LEVEL, 0xFFE60012),
    EXTENSION: (PHASE_LEVEL, 0xFFFF8C00),
    INFERENCE: (PHASE_LEVEL, 0xFF3D85C6),
    COMM: (PHASE_LEVEL, 0xFF8B4513),
    USER: (PHASE_LEVEL, 0xFFF4B6C2),
    GC: (PHASE_LEVEL, 0xFF5A5A5A),
    LINK: (LINK_LEVEL, 0xFFB5E38C),
    LINK_BACKWARD: (LINK_LEVEL, 0xFFBDEBFF),
    FUNCTION: (FUNCTION_LEVEL, 0xFFC8C8C8),
    GPU_WAIT: (ITERATION_LEVEL, 0xFFB0413E),
    AGENT: (ITERATION_LEVEL, 0xFF9E9E9E),
}

#: category -> its number (``RangeInfo.category_index``), and its bit in a sink's category mask.
CATEGORY_INDEX: dict[str, int] = {category: i for i, category in enumerate(CATEGORIES)}
CATEGORY_BITS: dict[str, int] = {category: 1 << i for category, i in CATEGORY_INDEX.items()}
#: The mask of a sink that wants every category (one that declares none).
ALL_CATEGORIES = -1


def category_mask(categories: Iterable[str] | None) -> int:
    """The mask of ``categories`` (``None``: every category, :data:`ALL_CATEGORIES`)."""
    if categories is None:
        return ALL_CATEGORIES
    mask = 0
    for category in categories:
        mask |= CATEGORY_BITS[category]
    return mask


def link_text(path: str, cls_name: str, device: str = "") -> str:
    """``predictor/l1 (Linear)``; the outermost link unnamed shows its class only."""
    text = f"{path} ({cls_name})" if path else cls_name
    return f"{text} @{device}" if device else text


_BACKWARD_SUFFIX = " backward"


def link_backward_text(forward_text: str) -> str:
    return f"{forward_text}{_BACKWARD_SUFFIX}"


def link_range_text(link_text: str, backward: bool) -> str:
    """The name of a link's forward or backward range."""
    return link_backward_text(link_text) if backward else link_text


def link_forward_text(backward_text: str) -> str:
    """The link's own range name from its backward range's (:func:`link_backward_text`)."""
    if backward_text.endswith(_BACKWARD_SUFFIX):
        return backward_text[:-len(_BACKWARD_SUFFIX)]
    return backward_text


def function_text(label: str, backward: bool) -> str:
    return f"{label}.backward" if backward else f"{label}.forward"


def extension_text(name: str, cls_name: str) -> str:
    if cls_name and cls_name != name:
        return f"extension:{name} ({cls_name})"
    return f"extension:{name}"


def comm_text(operation: str) -> str:
    return f"comm:{operation}"


#: Where in the iteration the agent waited for the GPU: the phase, or ``iteration`` for a wait
#: between phases (at an iteration's end or at a phase's start).
WAIT_PLACES = (*PHASES, ITERATION)


def gpu_wait_text(place: str | None) -> str:
    """``wait for GPU (forward)``: the agent's wait inside ``place`` (``None``: outside any
    iteration)."""
    return f"wait for GPU ({place})" if place else "wait for GPU"


def gpu_wait_place(name: str) -> str | None:
    """The place in a :func:`gpu_wait_text` name (``None`` outside an iteration or for another
    name)."""
    prefix = "wait for GPU ("
    if name.startswith(prefix) and name.endswith(")"):
        place = name[len(prefix):-1]
        return place if place in WAIT_PLACES else None
    return None


def gc_text(generation: int) -> str:
    """``gc gen 2``: a garbage collection of ``generation`` (and the younger ones)."""
    return f"gc gen {generation}"


def gc_generation(name: str) -> int | None:
    """The generation in a :func:`gc_text` name (``None`` for other names)."""
    prefix = "gc gen "
    if name.startswith(prefix) and name[len(prefix):].isdigit():
        return int(name[len(prefix):])
    return None
