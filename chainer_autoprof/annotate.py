"""User ranges: ``with annotate("name"):`` or ``@annotate("name")``."""

from __future__ import annotations

import functools
from typing import Any, Callable

from . import agent, names


class Annotation:
    """A named user range in the agent's domain; a no-op while no agent is installed.

    Safe to share between threads: each thread closes its own range.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> "Annotation":
        current = agent.current()
        if current is not None:
            tracer = current.tracer
            tracer.begin(tracer.info(self.name, names.USER))
        return self

    def __exit__(self, *exc: Any) -> None:
        current = agent.current()
        if current is not None:
            tracer = current.tracer
            tracer.end(tracer.info(self.name, names.USER))

    def __call__(self, func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return wrapper
