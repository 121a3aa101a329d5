"""The configurations compared: the agent, the alternatives a user would reach for, the floor.

Each :class:`Config` is applied inside a fresh benchmark process (see
``child.py``): ``agent`` settings go to ``chainer_autoprof.install()`` and
``setup`` runs, both before Chainer is imported; ``optimizer`` sets up the
optimizer of each workload's model; ``hook`` makes a context manager that is
entered for the whole process (or around each timed step when it says
``per_step``).  ``visibility`` says what a profiler shows with it.

The agent runs with NVTX on and its recorder off (``summary=0``) unless the
configuration says otherwise; "not activated" runs the package's ``.pth``
start-up line with no ``CHAINER_PROF_*`` variable set.

The alternatives are re-created here with the ``nvtx`` package, since
Chainer's own ``CUDAProfileHook`` and chainer_profutil need CuPy:

* ``fhook`` -- a :class:`chainer.function_hook.FunctionHook` that pushes and
  pops an NVTX range around every function's forward and backward, as
  ``CUDAProfileHook`` does (its attributes cached per label: its best case).
* ``timerhook`` -- :class:`chainer.link_hooks.TimerHook` (timings per link,
  no timeline).
* ``nvtx-auto`` -- ``python -m nvtx``: the ``nvtx`` package's automatic
  annotation of every Python function call (``sys.setprofile``), with that
  command's defaults.
* ``profutil`` -- chainer_profutil's ``create_marked_profile_optimizer``
  pattern: the optimizer's ``setup`` wraps the model's ``forward`` and the
  loss's ``backward`` in ranges with a per-function NVTX hook inside, and
  optimizer hooks push/pop ``update``; ``cupy.cuda.nvtx.RangePushC`` becomes
  ``nvtx.push_range``.
* ``floor-wrapt`` / ``floor-wrapt-nvtx`` -- ``Link.__call__`` wrapped by a
  bare wrapt wrapper, without and with one cached NVTX push+pop pair: the
  least any wrapt-based per-link instrumentation can cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

DOMAIN = "chainer"


@dataclass
class Config:
    """One configuration: how a benchmark process is set up."""

    name: str
    label: str
    visibility: str
    group: str
    agent: dict[str, Any] | None = None          # settings for chainer_autoprof.install()
    setup: Callable[[], None] | None = None       # before Chainer is imported
    optimizer: Callable[[Any, Any], Any] | None = None  # (optimizer, model) -> optimizer
    hook: Callable[[], Any] | None = None         # makes a context manager (see above)


# -- agent ------------------------------------------------------------------

def _agent(**settings: Any) -> dict[str, Any]:
    base = {"summary": False, "advice": False, "log": "error"}
    base.update(settings)
    return base


# -- not activated: the start-up check ran, no CHAINER_PROF_* variable set --------

def _not_activated() -> None:
    from pth_check import run_pth_line

    run_pth_line()


# -- Chainer's function hook (CUDAProfileHook's ranges, with the nvtx package) ----

def _function_hook() -> Any:
    import chainer
    import nvtx
    from nvtx._lib import pop_range, push_range

    domain = nvtx.get_domain(DOMAIN)
    handle = domain.handle
    cache: dict[str, Any] = {}

    def attributes(text: str) -> Any:
        attr = cache.get(text)
        if attr is None:
            attr = cache[text] = domain.get_event_attributes(message=text)
        return attr

    class NvtxFunctionHook(chainer.function_hook.FunctionHook):
        """Push/pop an NVTX range around each function's forward and backward."""

        name = "NvtxFunctionHook"

        def forward_preprocess(self, function, in_data):
            push_range(attributes(function.label + ".forward"), handle)

        def forward_postprocess(self, function, in_data):
            pop_range(handle)

        def backward_preprocess(self, function, in_data, out_grad):
            push_range(attributes(function.label + ".backward"), handle)

        def backward_postprocess(self, function, in_data, out_grad):
            pop_range(handle)

    return NvtxFunctionHook()


def _link_hook() -> Any:
    """A hand-written ``chainer.LinkHook``: one cached NVTX range per Link call."""
    import chainer
    import nvtx
    from nvtx._lib import pop_range, push_range

    domain = nvtx.get_domain(DOMAIN)
    handle = domain.handle
    cache: dict[type, Any] = {}

    class NvtxLinkHook(chainer.LinkHook):
        """Push/pop an NVTX range named after the link's class around each Link call."""

        name = "NvtxLinkHook"

        def forward_preprocess(self, args):
            cls = type(args.link)
            attr = cache.get(cls)
            if attr is None:
                attr = cache[cls] = domain.get_event_attributes(message=cls.__name__)
            push_range(attr, handle)

        def forward_postprocess(self, args):
            pop_range(handle)

    return NvtxLinkHook()


def _timer_hook() -> Any:
    from chainer.link_hooks import TimerHook

    return TimerHook()


class _NvtxAuto:
    """``python -m nvtx``: nvtx.Profile with that command's defaults.

    Entered around each timed step only (``per_step``): it annotates every
    Python call, the benchmark's own loop included.
    """

    per_step = True

    def __init__(self) -> None:
        import nvtx

        self.profile = nvtx.Profile(linenos=True, annotate_cfuncs=False)

    def __enter__(self) -> _NvtxAuto:
        self.profile.enable()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.profile.disable()


# -- chainer_profutil's pattern, re-created from its README -------------------

_FWD, _BWD, _UPD = 0xFF76B900, 0xFF7FDBFF, 0xFFE60012


def _profutil_optimizer(opt: Any, model: Any) -> Any:
    import chainer
    import nvtx

    class MarkHook(chainer.function_hook.FunctionHook):
        name = "FwdBwdProfileMarkHook"

        def __init__(self, color: int) -> None:
            self.color = color

        def forward_preprocess(self, function, in_data):
            nvtx.push_range(function.label + ".forward", color=self.color)

        def forward_postprocess(self, function, in_data):
            nvtx.pop_range()

        def backward_preprocess(self, function, in_data, out_grad):
            nvtx.push_range(function.label + ".backward", color=self.color)

        def backward_postprocess(self, function, in_data, out_grad):
            nvtx.pop_range()

    class PreUpdate:
        name = "preupdate"
        call_for_each_param = False
        timing = "pre"

        def __call__(self, rule):
            nvtx.push_range("update", color=_UPD)

    class PostUpdate:
        name = "postupdate"
        call_for_each_param = False
        timing = "post"

        def __call__(self, rule):
            nvtx.pop_range()

    def add_backward_mark(backward: Callable) -> Callable:
        def backward_wrapper(*args, **kwargs):
            nvtx.push_range("model.backward", color=_BWD)
            try:
                with MarkHook(_BWD):
                    return backward(*args, **kwargs)
            finally:
                nvtx.pop_range()
        return backward_wrapper

    forward = model.forward

    def forward_wrapper(*args, **kwargs):
        nvtx.push_range("model.forward", color=_FWD)
        try:
            with MarkHook(_FWD):
                ret = forward(*args, **kwargs)
        finally:
            nvtx.pop_range()
        ret.backward = add_backward_mark(ret.backward)
        return ret

    model.forward = forward_wrapper
    opt.setup(model)
    opt.add_hook(PreUpdate())
    opt.add_hook(PostUpdate())
    return opt


# -- the floor: a bare wrapt wrapper on Link.__call__, with/without one NVTX pair ---

def _floor_wrapt(with_nvtx: bool) -> Callable[[], None]:
    def setup() -> None:
        import wrapt

        def post_import(chainer: Any) -> None:
            if with_nvtx:
                import nvtx
                from nvtx._lib import pop_range, push_range

                domain = nvtx.get_domain(DOMAIN)
                handle = domain.handle
                attr = domain.get_event_attributes(message="link")

                def wrapper(wrapped, instance, args, kwargs):
                    push_range(attr, handle)
                    try:
                        return wrapped(*args, **kwargs)
                    finally:
                        pop_range(handle)
            else:
                def wrapper(wrapped, instance, args, kwargs):
                    return wrapped(*args, **kwargs)

            wrapt.wrap_function_wrapper(chainer.link.Link, "__call__", wrapper)

        wrapt.register_post_import_hook(post_import, "chainer")

    return setup


CONFIGS: tuple[Config, ...] = (
    Config("uninstrumented", "uninstrumented", "-", "baseline"),
    Config("not-activated", "installed, not activated", "-", "agent", setup=_not_activated),
    Config("agent-iteration", "agent: iteration", "iterations", "agent",
           agent=_agent(granularity="iteration")),
    Config("agent-phase", "agent: phase", "iterations, phases", "agent",
           agent=_agent(granularity="phase")),
    Config("agent-link", "agent: link", "iterations, phases, links", "agent",
           agent=_agent(granularity="link")),
    Config("agent-function", "agent: function", "iterations, phases, links, functions",
           "agent", agent=_agent(granularity="function")),
    Config("agent-recorder", "agent: link + recorder", "iterations, phases, links; summary",
           "agent", agent=_agent(granularity="link", summary=True)),
    Config("agent-sync3", "agent: link, sync level 3", "iterations, phases, links (synced)",
           "agent", agent=_agent(granularity="link", sync_level=3)),
    Config("fhook", "Chainer function hook (NVTX)", "functions", "alternative",
           hook=_function_hook),
    Config("timerhook", "chainer TimerHook", "link timings (no timeline)", "alternative",
           hook=_timer_hook),
    Config("nvtx-auto", "python -m nvtx", "every Python call", "alternative",
           hook=_NvtxAuto),
    Config("profutil", "chainer_profutil pattern", "phases, functions", "alternative",
           optimizer=_profutil_optimizer),
    Config("floor-wrapt", "floor: bare wrapt on Link", "-", "floor",
           setup=_floor_wrapt(False)),
    Config("floor-wrapt-nvtx", "floor: wrapt + NVTX pair", "one range per link", "floor",
           setup=_floor_wrapt(True)),
)

BY_NAME: dict[str, Config] = {c.name: c for c in CONFIGS}
