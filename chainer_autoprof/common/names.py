"""Range categories: their levels, stable names and NVTX colours.

A range's *level* decides whether the chosen granularity emits it and whether
the sync level synchronizes at its boundaries.  Colours are ARGB integers and
continue chainer_profutil's palette for iteration/forward/backward/update.
"""

from __future__ import annotations

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
}


def link_text(path: str, cls_name: str, device: str = "") -> str:
    """``predictor/l1 (Linear)``; the outermost link unnamed shows its class only."""
    text = f"{path} ({cls_name})" if path else cls_name
    return f"{text} @{device}" if device else text


def link_backward_text(forward_text: str) -> str:
    return f"{forward_text} backward"


def function_text(label: str, backward: bool) -> str:
    return f"{label}.backward" if backward else f"{label}.forward"


def extension_text(name: str, cls_name: str) -> str:
    if cls_name and cls_name != name:
        return f"extension:{name} ({cls_name})"
    return f"extension:{name}"


def comm_text(operation: str) -> str:
    return f"comm:{operation}"


def gc_text(generation: int) -> str:
    """``gc gen 2``: a garbage collection of ``generation`` (and the younger ones)."""
    return f"gc gen {generation}"


def gc_generation(name: str) -> int | None:
    """The generation in a :func:`gc_text` name (``None`` for other names)."""
    prefix = "gc gen "
    if name.startswith(prefix) and name[len(prefix):].isdigit():
        return int(name[len(prefix):])
    return None
