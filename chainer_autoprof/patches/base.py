"""Patch bookkeeping: wrap, unwrap exactly, count hits, contain our own errors.

A :class:`Patch` is one target (``Link.__call__``, ``Optimizer.update``, ...).
It wraps the target with wrapt, and — for methods that subclasses override,
such as an old-style model's ``__call__`` — every subclass that defines the
method itself, now and later (through ``__init_subclass__`` on the base).
Its status (patched / skipped / failed, with the reason) and hit count feed the
status report.  An error in the agent's own code turns the patch off, is
reported once, and the wrapped call goes on untouched.
"""

from __future__ import annotations

from typing import Any, Callable

Wrapper = Callable[[Callable[..., Any], Any, tuple, dict], Any]


class Patch:
    """One instrumented target and its state."""

    def __init__(self, label: str, owner: Any, attr: str, make_wrapper: Callable[["Patch"], Wrapper],
                 subclasses: bool = False, also: tuple[str, ...] = ()) -> None:
        self.label = label
        self.owner = owner
        self.attr = attr
        self.also = also              # aliases defined beside attr (e.g. Iterator.next)
        self.subclasses = subclasses
        self.status = "pending"
        self.reason = ""
        self.on = True
        self.hits = 0
        self.owners: list[str] = []   # classes whose attribute is wrapped
        self._handles: list[tuple[Any, str, Any]] = []
        self._wrapper = make_wrapper(self)
        self._prev_init_subclass: Any = None

    # -- errors -------------------------------------------------------------
    def fail(self, exc: BaseException) -> None:
        """Our own code raised: report once, switch this patch off."""
        if not self.on:
            return
        self.on = False
        self.status = "failed"
        self.reason = f"{type(exc).__name__}: {exc}"
        from .. import log
        log.error(f"internal error in the {self.label} hook ({self.reason}); "
                  "that hook is now off, training goes on")

    # -- applying -----------------------------------------------------------
    def apply(self) -> None:
        import wrapt

        try:
            if not hasattr(self.owner, self.attr):
                self.status, self.reason = "skipped", f"{self._owner_name()} has no {self.attr}"
                return
            self._wrap_class(self.owner, wrapt)
            if self.subclasses and isinstance(self.owner, type):
                for cls in _all_subclasses(self.owner):
                    self._wrap_class(cls, wrapt, only_own=True)
                self._hook_future_subclasses()
            self.status = "patched"
        except Exception as exc:  # contain: never break the user's import
            self.status, self.reason = "failed", f"{type(exc).__name__}: {exc}"
            self.remove()

    def _owner_name(self) -> str:
        return getattr(self.owner, "__qualname__", None) or getattr(self.owner, "__name__", "?")

    def _wrap_class(self, cls: Any, wrapt: Any, only_own: bool = False) -> None:
        own = getattr(cls, "__dict__", {})
        if only_own and self.attr not in own:
            return
        original = own.get(self.attr) if isinstance(cls, type) else getattr(cls, self.attr)
        if original is None:
            original = getattr(cls, self.attr)
        if getattr(original, "_self_wrapper", None) is self._wrapper:
            return  # already ours: never wrap twice
        handle = wrapt.wrap_function_wrapper(cls, self.attr, self._wrapper)
        self._handles.append((cls, self.attr, handle))
        for alias in self.also:
            if own.get(alias) is original:  # e.g. ``next = __next__``
                setattr(cls, alias, handle)
                self._handles.append((cls, alias, None))
        name = getattr(cls, "__qualname__", getattr(cls, "__name__", "?"))
        self.owners.append(f"{getattr(cls, '__module__', '?')}.{name}")

    def _hook_future_subclasses(self) -> None:
        base = self.owner
        patch = self
        previous = base.__dict__.get("__init_subclass__")
        self._prev_init_subclass = previous

        def __init_subclass__(cls, **kwargs):  # noqa: N807
            if previous is not None:
                previous.__func__(cls, **kwargs)
            else:
                super(base, cls).__init_subclass__(**kwargs)
            if patch.status == "patched" and patch.attr in cls.__dict__:
                try:
                    import wrapt
                    patch._wrap_class(cls, wrapt, only_own=True)
                except Exception as exc:
                    patch.fail(exc)

        __init_subclass__._chainer_autoprof = True  # type: ignore[attr-defined]
        base.__init_subclass__ = classmethod(__init_subclass__)

    # -- removing -------------------------------------------------------------
    def remove(self) -> None:
        """Restore every original exactly."""
        import wrapt

        for cls, attr, handle in reversed(self._handles):
            try:
                if handle is None:  # an alias we set to the wrapper
                    original = cls.__dict__[attr]
                    setattr(cls, attr, getattr(original, "__wrapped__", original))
                else:
                    wrapt.unwrap_object(cls, attr, handle)
            except Exception as exc:
                from .. import log
                log.warning(f"could not restore {attr} on {cls!r}: {exc}")
        self._handles.clear()
        if self.subclasses and isinstance(self.owner, type):
            current = self.owner.__dict__.get("__init_subclass__")
            if current is not None and getattr(current.__func__, "_chainer_autoprof", False):
                if self._prev_init_subclass is None:
                    del self.owner.__init_subclass__
                else:
                    self.owner.__init_subclass__ = self._prev_init_subclass
        if self.status == "patched":
            self.status = "removed"
        self.owners.clear()


def _all_subclasses(cls: type) -> list[type]:
    seen: list[type] = []
    todo = list(type.__subclasses__(cls))
    while todo:
        sub = todo.pop()
        if sub in seen:
            continue
        seen.append(sub)
        todo.extend(type.__subclasses__(sub))
    return seen

