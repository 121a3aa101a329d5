"""The NVTX sink: ranges pushed and popped in one NVTX domain, per thread.

Messages are strings registered in the domain and each range's event
attributes are built once, in :meth:`NvtxSink.prepare`; the hot path is one
C call per push and per pop.  With no NVIDIA tool attached the ``nvtx``
package hands out a dummy domain, and :func:`make_nvtx_sink` returns ``None``.
"""

from __future__ import annotations

from functools import partial
from typing import Any


class NvtxSink:
    """Push/pop NVTX ranges in ``domain``.

    The hot path has no Python frame of this sink: :meth:`prepare` attaches to
    each range a ``functools.partial`` of the C-level ``push_range`` with the
    range's attributes and the domain handle, and one of ``pop_range``, which
    the tracer calls directly.
    """

    #: NVTX timestamps ranges itself: the tracer need not read the clock for this sink.
    timed = False

    def __init__(self, domain: Any) -> None:
        from nvtx._lib import pop_range, push_range

        self.domain = domain
        self._handle = domain.handle
        self._push = push_range
        self._pop = partial(pop_range, self._handle)

    def prepare(self, info) -> None:
        info.nvtx = self.domain.get_event_attributes(
            message=info.name, color=info.color, category=info.category)
        info.on_begin = (*info.on_begin, partial(self._push, info.nvtx, self._handle))
        info.on_end = (self._pop, *info.on_end)

    def mark(self, text: str, color: int = 0xFFFFFFFF) -> None:
        """An instantaneous marker (e.g. the capture window's edges)."""
        self.domain.mark(self.domain.get_event_attributes(message=text, color=color))

    def close(self, tracer) -> None:
        pass


def make_nvtx_sink(domain_name: str) -> NvtxSink | None:
    """The sink for ``domain_name``, or ``None`` when no NVTX tool listens."""
    try:
        import nvtx
        from nvtx._lib import DummyDomain
    except ImportError:
        return None
    domain = nvtx.get_domain(domain_name)
    if isinstance(domain, DummyDomain):
        return None
    return NvtxSink(domain)
