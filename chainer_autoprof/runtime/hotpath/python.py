"""The pure-Python implementation of the hot path: the twin of the native extension.

Used where the extension cannot be built or imported, and with
``CHAINER_PROF_NATIVE=0``.  Its parts lie beside their C twins: the core
(:mod:`.core`, ``core.c``), the NVTX domain (:mod:`.nvtx_domain`,
``nvtx_domain.c``), the recorder's hook (:mod:`.record`, ``record.c``) and
the wrappers (:mod:`.wrappers`, ``wrappers.c``); this module gathers them as
the protocol names them (:class:`.protocol.HotPath`).
"""

from __future__ import annotations

from .core import Core
from .nvtx_domain import NvtxDomain
from .protocol import PROTOCOL
from .record import RecorderHook
from .wrappers import (
    LINK_ATTR,
    Switch,
    apply_wrapper,
    around,
    backprop_wrapper,
    finish,
    is_wrapper,
    link_wrapper,
    switch_of,
)

#: Its wrappers are plain functions: one Python frame per call (tracebacks leave them out).
WRAPPER_FRAMES = True

__all__ = ["LINK_ATTR", "PROTOCOL", "WRAPPER_FRAMES", "Core", "NvtxDomain", "RecorderHook",
           "Switch", "apply_wrapper", "around", "backprop_wrapper", "finish", "is_wrapper",
           "link_wrapper", "switch_of"]
