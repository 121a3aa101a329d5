"""The NVTX sink: ranges pushed and popped in one NVTX domain, per thread.

Messages are strings registered in the domain and each range's event
attributes are built once, in :meth:`NvtxSink.prepare`; the hot path is one
C call per push and per pop.  With no NVIDIA tool attached the ``nvtx``
package hands out a dummy domain, and :func:`make_nvtx_sink` returns ``None``.
"""

from __future__ import annotations

from typing import Any

try:  # a dependency, but a broken install must cost the NVTX ranges only, not the agent
    import nvtx
    from nvtx._lib import DummyDomain, pop_range, push_range
    from nvtx._lib.lib import EventAttributes, RegisteredString
except ImportError:
    nvtx = None


class NvtxSink:
    """Push/pop NVTX ranges in ``domain``."""

    #: NVTX timestamps ranges itself: the tracer need not read the clock for this sink.
    timed = False

    def __init__(self, domain: Any) -> None:
        self.domain = domain
        self._handle = domain.handle
        self._push = push_range
        self._pop = pop_range
        self.begin = self._make_begin()
        self.end = self._make_end()

    def _make_begin(self):
        push, handle = self._push, self._handle

        def begin(info, ts) -> None:
            push(info.nvtx, handle)

        return begin

    def _make_end(self):
        pop, handle = self._pop, self._handle

        def end(info, t0, t1, ts) -> None:
            pop(handle)

        return end

    def prepare(self, info) -> None:
        info.nvtx = self.domain.get_event_attributes(
            message=_text(info.name), color=info.color, category=info.category)

    def prepare_transient(self, info) -> None:
        """A name beyond the tracer's cap: attributes for this range alone, nothing cached
        (``get_event_attributes`` would keep the registered string forever)."""
        info.nvtx = EventAttributes(self.domain, RegisteredString(self._handle, _text(info.name)),
                                    info.color, self.domain.get_category_id(info.category))

    def mark(self, text: str, color: int = 0xFFFFFFFF) -> None:
        """An instantaneous marker (e.g. the capture window's edges)."""
        self.domain.mark(self.domain.get_event_attributes(message=text, color=color))

    def close(self, tracer) -> None:
        pass


def _text(name: str) -> str:
    """``name`` as NVTX can take it: UTF-8, a lone surrogate (an undecodable file name, a
    link's odd name) written as its escape rather than failing the registration."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return name.encode("utf-8", "backslashreplace").decode("utf-8")
    return name


def make_nvtx_sink(domain_name: str) -> NvtxSink | None:
    """The sink for ``domain_name``, or ``None`` when no NVTX tool listens."""
    if nvtx is None:
        return None
    domain = nvtx.get_domain(domain_name)
    if isinstance(domain, DummyDomain):
        return None
    return NvtxSink(domain)
