"""The NVTX sink: ranges pushed and popped in one NVTX domain, per thread.

Messages are strings registered in the domain and each range's event
attributes are built once, in :meth:`NvtxSink.prepare`; the hot path is one
C call per push and per pop.  With no NVIDIA tool attached the ``nvtx``
package hands out a dummy domain, and :func:`make_nvtx_sink` returns ``None``.

With the native hot path, :class:`NativeNvtxSink` does the same through the
extension's own NVTX domain (the same registered strings, categories and
attributes, in the same order), and the tracer's core pushes and pops in C.
"""

from __future__ import annotations

from typing import Any

try:  # a dependency, but a broken install must cost the NVTX ranges only, not the agent
    import nvtx
    from nvtx._lib import DummyDomain, pop_range, push_range
    from nvtx._lib.lib import EventAttributes, RegisteredString
except ImportError:
    nvtx = None


#: The native NVTX domains made in this process, by name.
_native_domains: dict[str, Any] = {}


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


class NativeNvtxSink:
    """NVTX through the native hot path: ``native`` tells the tracer's core to push/pop in C."""

    timed = False

    def __init__(self, domain: Any) -> None:
        self.domain = domain  # the extension's NvtxDomain (start_range/end_range/mark)
        self.native = ("nvtx", domain)
        self.begin = self._make_begin()
        self.end = self._make_end()

    def _make_begin(self):
        push = self.domain.push

        def begin(info, ts) -> None:
            push(info.nvtx)

        return begin

    def _make_end(self):
        pop = self.domain.pop

        def end(info, t0, t1, ts) -> None:
            pop()

        return end

    def prepare(self, info) -> None:
        info.nvtx = self.domain.attributes(message=_text(info.name), color=info.color,
                                           category=info.category)

    def prepare_transient(self, info) -> None:
        """A name beyond the tracer's cap: attributes for this range alone, nothing kept."""
        info.nvtx = self.domain.attributes(message=_text(info.name), color=info.color,
                                           category=info.category, keep=False)

    def mark(self, text: str, color: int = 0xFFFFFFFF) -> None:
        """An instantaneous marker (e.g. the capture window's edges)."""
        self.domain.mark(message=_text(text), color=color)

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


def make_nvtx_sink(domain_name: str, implementation: Any = None) -> Any:
    """The sink for ``domain_name``, or ``None`` when no NVTX tool listens."""
    if implementation is not None and implementation.native:
        # one per name and process, as the nvtx package's: registered once, reused on reinstall
        domain = _native_domains.get(domain_name)
        if domain is None:
            domain = _native_domains[domain_name] = implementation.module.NvtxDomain(domain_name)
        return NativeNvtxSink(domain) if domain.enabled else None
    if nvtx is None:
        return None
    domain = nvtx.get_domain(domain_name)
    if isinstance(domain, DummyDomain):
        return None
    return NvtxSink(domain)
