"""User ranges: ``with annotate("name"):`` or ``@annotate("name")``.

Not named ``annotate``: a submodule of that name would replace the package's
``annotate`` function once imported.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable, TypeVar

from . import agent
from .common import log, names

if TYPE_CHECKING:
    from typing import ParamSpec

    P = ParamSpec("P")

R = TypeVar("R")


def _report(exc: Exception) -> None:
    log.error(f"internal error in annotate ({type(exc).__name__}: {exc}); the program goes on")


class Annotation:
    """A named user range in the agent's domain; a no-op while no agent is installed.

    Safe to share between threads and to nest (recursion included): each
    thread keeps the tokens of its open blocks.  Ranges opened inside the
    block and still open at its end (an implicit iteration) end with it, so
    the NVTX stream stays nested.  The agent's own errors never reach the
    caller.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = str(name)

    def __enter__(self) -> Annotation:
        current = agent.current()
        if current is not None:
            try:
                tracer = current.tracer
                ts = tracer.state()
                ts.user.append(None)  # the slot first: a failing begin still pairs with __exit__
                ts.user[-1] = tracer.begin(tracer.info(self.name, names.USER), ts)
            except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
                _report(exc)
        return self

    def __exit__(self, *exc: object) -> None:
        current = agent.current()
        if current is not None:
            try:
                tracer = current.tracer
                ts = tracer.state()
                if ts.user:
                    tracer.end_block(ts.user.pop(), ts)
            except Exception as err:  # our error: reported once, the program's call goes on  # noqa: BLE001
                _report(err)

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with self:
                return func(*args, **kwargs)

        return wrapper
