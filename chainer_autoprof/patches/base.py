"""The shape every patch set shares: :class:`Instrumentor` of :class:`Patch` targets.

An :class:`Instrumentor` (after OpenTelemetry's ``BaseInstrumentor``) says
which library it instruments and which versions it knows, builds its
targets, applies them when the library is imported and removes them exactly.
A :class:`Patch` is one target (``Link.__call__``, ``Optimizer.update``, ...).
It replaces the target with a wrapper of the hot path's implementation
(:mod:`..runtime.hotpath`: native or pure Python, one protocol), made from
its hooks: :class:`Around` (``enter``/``exit`` called before and after the
original), :class:`Hot` (one of the implementation's specialized wrappers)
or :class:`Body` (a wrapper written in Python, for experiments).  For
methods that subclasses override, such as an old-style model's
``__call__``, every subclass that defines the method itself is wrapped too,
now and later (through ``__init_subclass__`` on the base).  Its status
(patched / skipped / failed, with the reason) and hit count feed the status
report.  An error in the agent's own code turns the patch off, is reported
once, and the wrapped call goes on untouched.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any, Callable, Union

from ..common import log
from ..runtime import hotpath

if TYPE_CHECKING:
    from types import ModuleType

    from ..common.typedefs import AnyFunction, Args, Kwargs
    from ..runtime.hotpath.protocol import SwitchLike

__all__ = ["Around", "Body", "Hot", "Instrumentor", "Patch", "qualified_name"]


class Around:
    """A patch's hooks around the original call.

    ``enter(instance, args, kwargs)`` runs before it and returns None (call
    straight through) or a state for ``exit(state, result, exc)``, which runs
    after it, whether it returned or raised.  With ``replace_args``, enter
    returns ``(state, args, kwargs)``: the original gets those arguments.
    Our own errors go to the patch's ``fail``; the call goes on.
    """

    __slots__ = ("enter", "exit", "replace_args")

    def __init__(self, enter: Callable[[Any, Args, Kwargs], Any],
                 exit: Callable[[Any, Any, BaseException | None], Any] | None = None,
                 replace_args: bool = False) -> None:
        self.enter = enter
        self.exit = exit
        self.replace_args = replace_args


class Hot:
    """One of the hot path's specialized wrappers (``link_wrapper``, ...) and its parameters."""

    __slots__ = ("kind", "params")

    def __init__(self, kind: str, **params: Any) -> None:
        self.kind = kind
        self.params = params


class Body:
    """A wrapper written in Python, ``body(original, instance, args, kwargs)`` (experiments only:
    it keeps a Python frame on the stack in both implementations)."""

    __slots__ = ("body",)

    def __init__(self, body: Callable[[AnyFunction, Any, Args, Kwargs], Any]) -> None:
        self.body = body


Hooks = Union[Around, Hot, Body]


#: A handle's original when the attribute was inherited (the class had none of its own).
_INHERITED = object()


def replace_attribute(owner: Any, attr: str, value: Any) -> None:
    """Put ``value`` at ``owner.attr`` (one place, so that a test can make it refuse)."""
    setattr(owner, attr, value)


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
                 make_hooks: Callable[[Patch], Hooks], subclasses: bool = False,
                 also: tuple[str, ...] = ()) -> None:
        self.label = label
        self.owner = owner
        self.attr = attr
        self.also = also              # aliases defined beside attr (e.g. ``next = __next__``)
        self.subclasses = subclasses
        self.status = "pending"
        self.reason = ""
        self.impl: hotpath.Implementation = hotpath.PYTHON
        self.switch: SwitchLike = self.impl.switch()  # on / hits, read by the wrappers
        self.owners: list[str] = []   # classes (or the module) whose attribute is wrapped
        # (owner, attribute, installed wrapper, original): one per attribute we replaced
        self._handles: list[tuple[Any, str, Any, Any]] = []
        self._hooks = make_hooks(self)
        self._prev_init_subclass: Any = None
        self._hooked = False

    @property
    def on(self) -> bool:
        return self.switch.on

    @on.setter
    def on(self, value: bool) -> None:
        self.switch.on = value

    @property
    def hits(self) -> int:
        """Calls seen (the wrappers count them on the switch)."""
        return self.switch.hits

    def bind(self, impl: hotpath.Implementation) -> None:
        """Make this patch's wrappers with ``impl`` (before :meth:`apply`)."""
        if impl is not self.impl:
            switch = impl.switch()
            switch.on, switch.hits = self.switch.on, self.switch.hits
            self.impl, self.switch = impl, switch

    def _make(self, original: Any, method: bool) -> Any:
        """The wrapper of ``original`` (``method``: it is found in a class)."""
        if method and not isinstance(original, types.FunctionType) \
                and hotpath.wrapper_switch(original) is None:  # (another patch's wrapper)
            original = as_method(original, self.attr)
        hooks, impl = self._hooks, self.impl
        if isinstance(hooks, Around):
            return impl.around(original, self.switch, hooks.enter, hooks.exit, self.fail,
                               method=method, replace_args=hooks.replace_args)
        if isinstance(hooks, Hot):
            return impl.hot_wrapper(hooks.kind, original, self.switch, self.fail, **hooks.params)
        return _body_wrapper(original, self.switch, hooks.body, method)

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
            self._wrap_class(self.owner)
            if self.subclasses and isinstance(self.owner, type):
                for cls in _all_subclasses(self.owner):
                    self._wrap_subclass(cls)
                self._hook_future_subclasses()
            self.status = "patched"
        except Exception as exc:  # contain: never break the user's import  # noqa: BLE001
            self.remove()
            self.status, self.reason = "failed", f"{type(exc).__name__}: {exc}"

    def _wrap_subclass(self, cls: Any) -> None:
        """Wrap a subclass's own attribute; one that cannot be wrapped (``__call__ = None``)
        is left as it is and named in the status, the other classes stay instrumented."""
        try:
            self._wrap_class(cls, only_own=True)
        except Exception as exc:  # one odd subclass must not cost the rest  # noqa: BLE001
            missed = f"{qualified_name(cls)} ({type(exc).__name__}: {exc})"
            self.reason = f"{self.reason}; {missed}" if self.reason else f"not wrapped: {missed}"

    def _wrap_class(self, cls: Any, only_own: bool = False) -> None:
        own = getattr(cls, "__dict__", {})
        if only_own and self.attr not in own:
            return
        original = own.get(self.attr)
        inherited = original is None  # put on this class by us: removed, not restored
        if inherited:
            original = getattr(cls, self.attr)
        if hotpath.wrapper_switch(original) is self.switch:
            return  # already ours (e.g. ``__call__ = Base.__call__``): never wrap twice
        wrapper = self._make(original, method=isinstance(cls, type))
        replace_attribute(cls, self.attr, wrapper)
        self._handles.append((cls, self.attr, wrapper, _INHERITED if inherited else original))
        for alias in self.also:
            if own.get(alias) is original:  # e.g. ``next = __next__``: one wrapper for both
                setattr(cls, alias, wrapper)
                self._handles.append((cls, alias, wrapper, original))
        self.owners.append(qualified_name(cls))

    def _hook_future_subclasses(self) -> None:
        base = self.owner
        patch = self
        previous = base.__dict__.get("__init_subclass__")
        self._prev_init_subclass = previous

        def __init_subclass__(cls: Any, /, **kwargs: Any) -> None:  # noqa: N807
            if previous is not None:
                previous.__func__(cls, **kwargs)
            else:
                super(base, cls).__init_subclass__(**kwargs)
            if patch.on and patch.status == "patched" and patch.attr in cls.__dict__:
                patch._wrap_subclass(cls)

        __init_subclass__._chainer_autoprof = True  # type: ignore[attr-defined]
        base.__init_subclass__ = classmethod(__init_subclass__)
        self._hooked = True

    # -- removing -------------------------------------------------------------
    def remove(self) -> None:
        """Restore every original exactly; wrappers still referenced call straight through."""
        self.on = False
        for cls, attr, wrapper, original in reversed(self._handles):
            try:
                if cls.__dict__.get(attr) is wrapper:
                    if original is _INHERITED:
                        delattr(cls, attr)
                    else:
                        setattr(cls, attr, original)
                # else replaced since by someone else: theirs stays (ours calls straight through)
            except Exception as exc:  # our error: one line, the program goes on  # noqa: BLE001
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


def as_method(attribute: Any, attr: str) -> AnyFunction:
    """A class attribute that is no plain function (a ``functools.partialmethod``, a
    ``staticmethod`` or ``classmethod``, a callable object, any descriptor) as the function
    ``method(self, *args)`` that calls what Python itself would: ``type(self).attr`` bound to
    the instance through its ``__get__``, or, without one, the object as it is.  The
    wrappers take a function of the instance; the original stays the one restored."""
    get = getattr(type(attribute), "__get__", None)
    if get is None and not callable(attribute):
        raise TypeError(f"{attr} is a {type(attribute).__name__}, which cannot be called")
    if get is None:
        def method(self: Any, /, *args: Any, **kwargs: Any) -> Any:
            return attribute(*args, **kwargs)
    else:
        def method(self: Any, /, *args: Any, **kwargs: Any) -> Any:
            return get(attribute, self, type(self))(*args, **kwargs)
    method.__name__ = attr
    method.__qualname__ = str(getattr(attribute, "__qualname__", attr))
    method.__doc__ = getattr(attribute, "__doc__", None)
    method.__wrapped__ = attribute  # type: ignore[attr-defined]  # (what introspection unwraps to)
    return method


def _all_subclasses(cls: type) -> list[type]:
    seen: list[type] = []
    todo: list[type] = list(type.__subclasses__(cls))
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

    def __init__(self, impl: hotpath.Implementation = hotpath.PYTHON) -> None:
        self.patches: list[Patch] = []
        self.module: ModuleType | None = None  # the instrumented library, while applied
        self.impl = impl         # the hot path's implementation its wrappers use

    def targets(self, module: ModuleType) -> list[Patch]:
        """The patches for ``module`` (built, not yet applied)."""
        raise NotImplementedError

    def unsupported(self, module: ModuleType) -> str | None:
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

    def apply(self, module: ModuleType) -> None:
        """Build and apply every target (each one contains its own failure)."""
        self.module = module
        self.patches = self.targets(module)
        for patch in self.patches:
            patch.bind(self.impl)
            patch.apply()

    def remove(self) -> None:
        """Restore every original exactly, in reverse order."""
        for patch in reversed(self.patches):
            patch.remove()
        self.module = None


def _body_wrapper(original: Any, switch: Any, body: AnyFunction, method: bool) -> AnyFunction:
    """A plain-function wrapper running ``body`` (an experiment's own Python wrapper)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        switch.hits += 1
        if not switch.on or (method and not args):
            return original(*args, **kwargs)
        if method:
            bound = types.MethodType(original, args[0])
            return body(bound, args[0], args[1:], kwargs)
        return body(original, None, args, kwargs)

    return hotpath.finish_wrapper(original, wrapper, switch)
