"""The shape every patch set shares: :class:`Instrumentor` of :class:`Patch` targets.

An :class:`Instrumentor` (after OpenTelemetry's ``BaseInstrumentor``) says
which library it instruments and which versions it knows, builds its
targets, applies them when the library is imported and removes them exactly.
A :class:`Patch` is one target (``Link.__call__``, ``Optimizer.update``, ...).
It wraps the target with wrapt, and — for methods that subclasses override,
such as an old-style model's ``__call__`` — every subclass that defines the
method itself, now and later (through ``__init_subclass__`` on the base).
Its status (patched / skipped / failed, with the reason) and hit count feed the
status report.  An error in the agent's own code turns the patch off, is
reported once, and the wrapped call goes on untouched.
"""

from __future__ import annotations

import types
from typing import Any, Callable

import wrapt

from ..common import log

__all__ = ["Instrumentor", "Patch", "qualified_name"]

Wrapper = Callable[[Callable[..., Any], Any, tuple, dict], Any]


def qualified_name(obj: Any) -> str:
    """``package.module.Class`` for a class, ``package.module`` for a module."""
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)
    module = getattr(obj, "__module__", None)
    return f"{module}.{name}" if module else name


class Patch:
    """One instrumented target and its state."""

    def __init__(self, label: str, owner: Any, attr: str,
                 make_wrapper: Callable[[Patch], Wrapper], subclasses: bool = False,
                 also: tuple[str, ...] = ()) -> None:
        self.label = label
        self.owner = owner
        self.attr = attr
        self.also = also              # aliases defined beside attr (e.g. ``next = __next__``)
        self.subclasses = subclasses
        self.status = "pending"
        self.reason = ""
        self.on = True
        self.hits = 0
        self.owners: list[str] = []   # classes (or the module) whose attribute is wrapped
        # (owner, attribute, installed wrapper, original): one per attribute we replaced
        self._handles: list[tuple[Any, str, Any, Any]] = []
        self._wrapper = make_wrapper(self)
        self._prev_init_subclass: Any = None
        self._hooked = False

    # -- errors -------------------------------------------------------------
    def fail(self, exc: BaseException) -> None:
        """Our own code raised: report once, switch this patch off."""
        if not self.on:
            return
        self.on = False
        self.status = "failed"
        self.reason = f"{type(exc).__name__}: {exc}"
        log.error(f"internal error in the {self.label} hook ({self.reason}); "
                  "that hook is now off, training goes on")

    # -- applying -----------------------------------------------------------
    def apply(self) -> None:
        try:
            if not hasattr(self.owner, self.attr):
                self.status, self.reason = "skipped", \
                    f"{qualified_name(self.owner)} has no {self.attr}"
                return
            self._wrap_class(self.owner, wrapt)
            if self.subclasses and isinstance(self.owner, type):
                missed = []
                for cls in _all_subclasses(self.owner):
                    try:
                        self._wrap_class(cls, wrapt, only_own=True)
                    except Exception as exc:  # one odd subclass must not cost the rest
                        missed.append(f"{qualified_name(cls)} ({type(exc).__name__}: {exc})")
                if missed:
                    self.reason = "not wrapped: " + "; ".join(missed)
                self._hook_future_subclasses()
            self.status = "patched"
        except Exception as exc:  # contain: never break the user's import
            self.remove()
            self.status, self.reason = "failed", f"{type(exc).__name__}: {exc}"

    def _wrap_class(self, cls: Any, wrapt: Any, only_own: bool = False) -> None:
        own = getattr(cls, "__dict__", {})
        if only_own and self.attr not in own:
            return
        original = own.get(self.attr)
        if original is None:
            original = getattr(cls, self.attr)
        if getattr(original, "_self_wrapper", None) is self._wrapper:
            return  # already ours (e.g. ``__call__ = Base.__call__``): never wrap twice
        handle = wrapt.wrap_function_wrapper(cls, self.attr, self._wrapper)
        self._handles.append((cls, self.attr, handle, original))
        for alias in self.also:
            if own.get(alias) is original:  # e.g. ``next = __next__``: one wrapper for both
                setattr(cls, alias, handle)
                self._handles.append((cls, alias, handle, original))
        self.owners.append(qualified_name(cls))

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
            if patch.on and patch.status == "patched" and patch.attr in cls.__dict__:
                try:
                    patch._wrap_class(cls, wrapt, only_own=True)
                except Exception as exc:
                    patch.fail(exc)

        __init_subclass__._chainer_autoprof = True  # type: ignore[attr-defined]
        base.__init_subclass__ = classmethod(__init_subclass__)
        self._hooked = True

    # -- removing -------------------------------------------------------------
    def remove(self) -> None:
        """Restore every original exactly; wrappers still referenced call straight through."""
        self.on = False
        for cls, attr, handle, original in reversed(self._handles):
            try:
                if attr != self.attr:  # an alias we pointed at the wrapper
                    if cls.__dict__.get(attr) is handle:
                        setattr(cls, attr, original)
                else:
                    wrapt.unwrap_object(cls, attr, handle)
            except Exception as exc:
                log.warning(f"could not restore {attr} on {qualified_name(cls)}: {exc}")
        self._handles.clear()
        if self._hooked:
            current = self.owner.__dict__.get("__init_subclass__")
            if current is not None and getattr(current.__func__, "_chainer_autoprof", False):
                if self._prev_init_subclass is None:
                    del self.owner.__init_subclass__
                else:
                    self.owner.__init_subclass__ = self._prev_init_subclass
            self._hooked = False
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


class Instrumentor:
    """One set of patches on one library: what is wrapped, which versions, apply / remove.

    Subclasses set :attr:`library` (the top-level module whose import applies
    them), optionally :attr:`supported_majors` and :attr:`requires` (libraries
    whose instrumentors must have applied first), and build their targets in
    :meth:`targets`.  The agent calls :meth:`apply` from the library's
    post-import hook and :meth:`remove` on uninstall.
    """

    #: The module whose import applies this set, and its name in messages.
    library = ""
    name = ""
    #: Whether its targets emit ranges (listed in the status report, counted as overhead).
    reported = True
    #: Major versions known (empty: any); others run uninstrumented.
    supported_majors: tuple[int, ...] = ()
    #: Libraries whose instrumentors must have applied before this one.
    requires: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.patches: list[Patch] = []
        self.module: Any = None  # the instrumented library, while applied

    def targets(self, module: Any) -> list[Patch]:
        """The patches for ``module`` (built, not yet applied)."""
        raise NotImplementedError

    def unsupported(self, module: Any) -> str | None:
        """Why ``module``'s version is not instrumented (``None``: it is)."""
        if not self.supported_majors:
            return None
        version = str(getattr(module, "__version__", ""))
        try:
            major = int(version.split(".")[0])
        except ValueError:
            major = -1
        if major in self.supported_majors:
            return None
        known = ", ".join(f"{m}.x" for m in self.supported_majors)
        return (f"{self.name} {version or '(unknown version)'} is not a version the "
                f"agent knows ({known})")

    def apply(self, module: Any) -> None:
        """Build and apply every target (each one contains its own failure)."""
        self.module = module
        self.patches = self.targets(module)
        for patch in self.patches:
            patch.apply()

    def remove(self) -> None:
        """Restore every original exactly, in reverse order."""
        for patch in reversed(self.patches):
            patch.remove()
        self.module = None
