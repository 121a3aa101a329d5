"""The NVTX sink: ranges pushed and popped in one NVTX domain, per thread.

Messages are strings registered in the domain and each range's event
attributes are built once, in :meth:`NvtxSink.prepare`.  The domain is the hot
path's (:meth:`..runtime.hotpath.Implementation.nvtx_domain`): the native
core pushes and pops it in C (the sink's ``native`` part); the Python core
calls the domain's ``begin``/``end``, one C call each.  With no NVIDIA tool
attached there is no domain, and :func:`make_nvtx_sink` returns ``None``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..runtime.events import RangeInfo, Tracer
    from ..runtime.hotpath import Implementation
    from ..runtime.hotpath.protocol import NvtxDomainLike


class NvtxSink:
    """Push/pop NVTX ranges in ``domain``."""

    #: NVTX timestamps ranges itself: the tracer need not read the clock for this sink.
    timed = False

    def __init__(self, domain: NvtxDomainLike) -> None:
        self.domain = domain  # also start_range/end_range (the rank's range)
        self.native = domain  # the native core pushes and pops it in C
        self.begin = domain.begin
        self.end = domain.end

    def prepare(self, info: RangeInfo) -> None:
        info.nvtx = self.domain.attributes(message=_text(info.name), color=info.color,
                                           category=info.category)

    def prepare_transient(self, info: RangeInfo) -> None:
        """A name beyond the tracer's cap: attributes for this range alone, nothing kept."""
        info.nvtx = self.domain.attributes(message=_text(info.name), color=info.color,
                                           category=info.category, keep=False)

    def mark(self, text: str, color: int = 0xFFFFFFFF) -> None:
        """An instantaneous marker (e.g. the capture window's edges)."""
        self.domain.mark(message=_text(text), color=color)

    def close(self, tracer: Tracer) -> None:
        pass


def _text(name: str) -> str:
    """``name`` as NVTX can take it: UTF-8, a lone surrogate (an undecodable file name, a
    link's odd name) written as its escape rather than failing the registration."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return name.encode("utf-8", "backslashreplace").decode("utf-8")
    return name


def make_nvtx_sink(domain_name: str, implementation: Implementation) -> NvtxSink | None:
    """The sink for ``domain_name``, or ``None`` when no NVTX tool listens."""
    domain = implementation.nvtx_domain(domain_name)
    return NvtxSink(domain) if domain is not None else None
