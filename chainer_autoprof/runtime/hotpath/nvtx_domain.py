"""The pure-Python twin's NVTX domain (twin of ``nvtx_domain.c``), through the ``nvtx`` package.

Registered strings and categories through the package's own caches
(``get_event_attributes``); ``begin``/``end`` push a range's prebuilt
attributes (``info.nvtx``) and pop, each one call into the package's C code.
With no NVIDIA tool attached the package hands out a dummy domain: then
``enabled`` is False.  A broken ``nvtx`` install costs the NVTX ranges only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:  # a dependency, but a broken install must cost the NVTX ranges only, not the agent
    import nvtx
    from nvtx._lib import DummyDomain, pop_range, push_range
    from nvtx._lib.lib import EventAttributes, RegisteredString
except ImportError:
    nvtx = None

if TYPE_CHECKING:
    from ..ranges import RangeInfo, ThreadState


class NvtxDomain:
    """``NvtxDomain(name)``: one NVTX domain, its strings, categories and attributes."""

    def __init__(self, name: str) -> None:
        self.name = name
        domain: Any = nvtx.get_domain(name) if nvtx is not None else None
        self.enabled = domain is not None and not isinstance(domain, DummyDomain)
        self._domain = domain
        self._handle = handle = domain.handle if self.enabled else None

        def begin(info: RangeInfo, ts: ThreadState) -> None:
            push_range(info.nvtx, handle)

        def end(info: RangeInfo, t0: int, t1: int, ts: ThreadState) -> None:
            pop_range(handle)

        self.begin = begin
        self.end = end

    def attributes(self, message: str | None = None, color: int | None = None,
                   category: str | None = None, keep: bool = True) -> Any:
        """Event attributes; ``keep=False``: for a name beyond the tracer's cap, nothing
        cached (``get_event_attributes`` would keep the registered string forever)."""
        domain = self._domain
        if keep:
            return domain.get_event_attributes(message=message, color=color, category=category)
        return EventAttributes(domain, RegisteredString(self._handle, message), color,
                               domain.get_category_id(category))

    def push(self, attributes: Any) -> None:
        push_range(attributes, self._handle)

    def pop(self) -> None:
        pop_range(self._handle)

    def mark(self, message: str | None = None, color: int | None = None) -> None:
        """An instantaneous marker."""
        domain = self._domain
        domain.mark(domain.get_event_attributes(message=message, color=color))

    def start_range(self, message: str | None = None, color: int | None = None) -> int:
        """A process-wide range (any thread may end it); returns its id."""
        return int(self._domain.start_range(message=message, color=color))

    def end_range(self, range_id: int) -> None:
        self._domain.end_range(range_id)

    def __repr__(self) -> str:
        return f"NvtxDomain({self.name!r})"
