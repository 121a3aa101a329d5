"""Run-time facts for the advice checks, gathered off the hot path.

What is looked at, and when:

* when the first training ``Optimizer.update`` of the run returns (once; this
  and the counting hook's start and end are the agent's own time on the
  program's thread, told to ``own_work``: the summary's "agent's own work",
  not the program's idle time; inside an updater's iteration they wait for
  its end, so that they are never the iteration's time either): the
  Chainer configuration in force (``type_check``, ``autotune``, ``use_cudnn``,
  ``enable_backprop``), CUDA/cuDNN availability, the optimizer's parameters
  (count, dtypes, devices), convolution links and their devices, and NumPy's
  BLAS (library name and a measured matmul rate; CPU runs only);
* during training iteration :data:`COUNT_ITERATION` only: the functions
  applied, counted by a Chainer ``FunctionHook`` present for that iteration,
  which also takes the thread's CPU time per call and times, once more, the
  type checks of the first calls (the advice's cost of ``type_check``, the
  verdict's measure of a call in units of this host's speed);
* during the first call of each ``Extension``: the functions applied while
  ``train`` is off, and how many of them built a graph (``enable_backprop``
  on), i.e. an evaluation that keeps the graph;
* only when CuPy is imported: copies between host and GPU inside training
  iterations outside the data phase (``to_cpu``, ``Variable.to_cpu``,
  ``Variable.item``, printing a GPU variable; ``to_gpu``).

Results are plain JSON values in ``tracer.facts``; the recorder writes them
into the trace.  A probe's own error turns that probe off, reported once.
"""

from __future__ import annotations

import functools
import sys
from time import perf_counter_ns, thread_time_ns
from typing import TYPE_CHECKING, Any, Callable

import numpy

from ..common import log, names
from .base import Around, Instrumentor, Patch

if TYPE_CHECKING:
    from types import ModuleType

    import chainer

    from ..common.typedefs import Args, Kwargs
    from ..runtime.events import Tracer

#: The training iteration (counted from 0) whose function calls are counted.
#: The second one: the first may run lazy initialization, and the count runs
#: inside the summary's warm-up by default.
COUNT_ITERATION = 1
#: NumPy BLAS libraries that count as optimized (substring of the library name).
OPTIMIZED_BLAS = ("openblas", "mkl", "blis", "accelerate", "atlas", "armpl", "nvpl",
                  "essl", "flexiblas", "libsci", "veclib")
#: Type checks timed (a second check of the first calls of the counted iteration).
TIMED_CHECKS = 200
#: Size of the square float32 matmul that measures NumPy's BLAS.
MATMUL_SIZE = 128
_HOOK_NAME = "chainer_autoprof_probe"


class Probes(Instrumentor):
    """The probes of one tracer, applied after the Chainer patches (so that ours run outside)."""

    library = "chainer"
    name = "Chainer (run-time checks)"
    reported = False
    requires = ("chainer",)

    def __init__(self, tracer: Tracer, count_iteration: int = COUNT_ITERATION,
                 own_work: Callable[[int, int], None] | None = None) -> None:
        super().__init__(tracer.hotpath)
        self.tracer = tracer
        #: told of each stretch of the probes' own work on the program's thread (t0, t1 on
        #: the tracer's clock): the agent's time, shown as such (the recorder's row)
        self.own_work = own_work
        self.facts: dict[str, Any] = tracer.facts
        self.count_iteration = count_iteration
        self.chainer: Any = None  # the chainer module once applied (read only after)
        self.snapshot_done = False
        self.update_done = False
        self._count_hook: Any = None
        self._seen_extensions: set[int] = set()
        self._hook_cls: Any = None
        self._last_transfer_iteration = -1

    # -- applying -------------------------------------------------------------
    def targets(self, chainer: ModuleType) -> list[Patch]:
        # Chainer's submodules, once Chainer itself is imported (never imported by us first)
        from chainer import optimizer
        from chainer.training import extension

        self.chainer = chainer
        self._hook_cls = _hook_classes(chainer)
        patches = [
            Patch("probe:Optimizer.update", optimizer.Optimizer, "update", self._wrap_update,
                  subclasses=True),
            Patch("probe:Extension.__call__", extension.Extension, "__call__",
                  self._wrap_extension, subclasses=True),
        ]
        if "cupy" in sys.modules:
            patches += self._transfer_patches()
        return patches

    def apply(self, chainer: ModuleType) -> None:
        """Wrap the probe targets; a probe that cannot be built leaves the checks out."""
        try:
            super().apply(chainer)
        except Exception as exc:  # our error: one line, the program goes on  # noqa: BLE001
            log.warning(f"run-time checks unavailable ({type(exc).__name__}: {exc})")
            self.remove()

    def remove(self) -> None:
        """Undo every probe (call before the Chainer patches are removed)."""
        self.close()
        super().remove()
        self.patches = []

    def close(self) -> None:
        """End of the run: take off a counting hook still present on this thread."""
        hook = self._count_hook
        if hook is not None:
            self._count_hook = None
            _exit_hook(hook)
            self._publish_count(hook, complete=False)

    # -- Optimizer.update: one snapshot, one counted iteration ------------------
    def _wrap_update(self, patch: Patch) -> Around:
        state = self.tracer.state

        def enter(instance: Any, args: Args, kwargs: Kwargs) -> Any:
            if self.update_done:
                return None
            # not inside an extension, inference, a trainer's gap
            return (instance,) if not state().quiet else None

        clock = self.tracer.clock

        def check(optimizer: Any) -> None:
            t0 = clock()
            try:
                self._after_training_update(optimizer)
            except Exception as err:  # our error: reported once, the program's call goes on  # noqa: BLE001
                patch.fail(err)
                self.close()
            own_work = self.own_work
            if own_work is not None:
                own_work(t0, clock())

        def exit(st: Any, result: Any, exc: BaseException | None) -> None:
            if exc is not None:
                return
            ts = state()
            if not ts.iter_busy:  # the step's update ended its iteration: between two
                check(st[0])
                return
            # an updater's iteration (or a step still owing updates): after its end, so that
            # the agent's time is never the iteration's
            waiting = ts.after_iteration
            if waiting is None:
                waiting = ts.after_iteration = []
            waiting.append(functools.partial(check, st[0]))

        return Around(enter, exit)

    def _after_training_update(self, optimizer: chainer.Optimizer) -> None:
        if not self.snapshot_done:
            self.snapshot_done = True
            self._snapshot(optimizer)
        begun = self.tracer.iterations  # iterations begun, the current one included
        hook = self._count_hook
        if hook is None and begun == self.count_iteration:
            hook = self._hook_cls[0](self.tracer, self.count_iteration + 1)
            if _enter_hook(hook):
                self._count_hook = hook
        elif hook is not None and begun > self.count_iteration + 1:
            self._count_hook = None
            _exit_hook(hook)
            self._publish_count(hook, complete=True)
        if begun > self.count_iteration + 1 and self._count_hook is None:
            self.update_done = True

    def _publish_count(self, hook: Any, complete: bool) -> None:
        if hook.functions or complete:
            hook.publish()

    def _snapshot(self, optimizer: chainer.Optimizer) -> None:
        chainer = self.chainer
        facts = self.facts
        cfg = chainer.config
        config = {}
        for key in ("train", "enable_backprop", "type_check", "autotune", "use_cudnn",
                    "cudnn_deterministic"):
            value = getattr(cfg, key, None)
            config[key] = value if isinstance(value, (bool, int, str)) or value is None \
                else str(value)
        facts["config"] = config
        try:
            from chainer.backends import cuda  # Chainer's: never imported by us first

            facts["cuda"] = {"available": bool(cuda.available),
                             "cudnn_enabled": bool(cuda.cudnn_enabled)}
        except Exception:  # the CUDA facts are optional  # noqa: BLE001
            pass
        target = getattr(optimizer, "target", None)
        if target is not None and hasattr(target, "params"):
            facts["params"] = _param_facts(target)
            facts["conv_links"] = _conv_facts(target)
        if not facts.get("params", {}).get("gpu"):
            facts["blas"] = blas_facts()

    # -- Extension.__call__: does an evaluation build the graph? ---------------
    def _wrap_extension(self, patch: Patch) -> Around:
        seen = self._seen_extensions

        def enter(instance: Any, args: Args, kwargs: Kwargs) -> Any:
            if id(instance) in seen:
                return None
            hook = None
            try:
                seen.add(id(instance))
                hook = self._hook_cls[1]()
                if not _enter_hook(hook):
                    hook = None
            except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
                patch.fail(exc)
            return (instance, hook) if hook is not None else None

        def exit(st: Any, result: Any, exc: BaseException | None) -> None:
            instance, hook = st
            try:
                _exit_hook(hook)
                if hook.eval_functions:
                    self._record_evaluation(instance, hook)
            except Exception as err:  # our error: reported once, the program's call goes on  # noqa: BLE001
                patch.fail(err)

        return Around(enter, exit)

    def _record_evaluation(self, extension: Any, hook: Any) -> None:
        cls = type(extension).__name__
        name = getattr(extension, "name", None) or getattr(extension, "default_name", None) \
            or cls
        evaluations = self.facts.setdefault("evaluation", [])
        evaluations.append({"extension": names.extension_text(str(name), cls),
                            "functions": hook.eval_functions,
                            "graph_functions": hook.graph_functions})

    # -- host <-> device copies inside iterations (CuPy only) -------------------
    def _transfer_patches(self) -> list[Patch]:
        # only where the program imported CuPy (never imported by us), after Chainer
        import cupy
        from chainer import variable
        from chainer.backends import _cpu, cuda

        gpu_array = cupy.ndarray

        def to_host(obj: Any) -> bool:
            return type(obj) is gpu_array

        def to_device(obj: Any) -> bool:
            return obj is not None and type(obj) is not gpu_array

        def var_on_gpu(obj: Any) -> bool:
            return type(getattr(obj, "array", None)) is gpu_array

        targets = [
            ("to_cpu", cuda, "_array_to_cpu", to_host),
            ("to_cpu", _cpu, "_array_to_cpu", to_host),
            ("to_gpu", cuda, "_array_to_gpu", to_device),
            ("print", variable, "variable_str", var_on_gpu),
            ("print", variable, "variable_repr", var_on_gpu),
            ("item", variable.Variable, "item", None),
        ]
        patches = []
        for label, owner, attr, test in targets:
            patches.append(Patch(f"probe:{label} ({attr})", owner, attr,
                                 self._transfer_wrapper(label, test, var_on_gpu)))
        return patches

    def _transfer_wrapper(self, label: str, test: Callable[[Any], bool] | None,
                          var_on_gpu: Callable[[Any], bool]) -> Callable[[Patch], Around]:
        state = self.tracer.state
        tracer = self.tracer

        def make(patch: Patch) -> Around:
            def enter(instance: Any, args: Args, kwargs: Kwargs) -> Any:
                try:
                    ts = state()
                    if ts.iter_busy and not ts.quiet and ts.phase != names.DATA:
                        obj = args[0] if args else None
                        hit = var_on_gpu(instance) if test is None else test(obj)
                        if hit:
                            self._record_transfer(label, ts.phase, tracer.iterations)
                except Exception as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
                    patch.fail(exc)
                return None

            return Around(enter)

        return make

    def _record_transfer(self, label: str, phase: str | None, iteration: int) -> None:
        info = self.facts.get("transfers")
        if info is None:
            info = self.facts["transfers"] = {"calls": 0, "by": {}, "phases": {},
                                              "iterations": 0}
        info["calls"] += 1
        info["by"][label] = info["by"].get(label, 0) + 1
        where = phase or "between phases"
        info["phases"][where] = info["phases"].get(where, 0) + 1
        if self._last_transfer_iteration != iteration:
            self._last_transfer_iteration = iteration
            info["iterations"] += 1


# -- function hooks (classes built once Chainer is imported) --------------------

def _hook_classes(chainer: ModuleType) -> tuple[type, type]:
    base: Any = chainer.FunctionHook  # Chainer's class: no type to derive from
    config = chainer.config

    class CountHook(base):  # type: ignore[misc, no-any-unimported]  # Chainer's, at run time
        """Counts functions applied inside one training iteration; times type checks.

        Over the iteration it takes this thread's CPU time from the first call
        to the last (CPU time: the moments the process is preempted do not
        count); for the first :data:`TIMED_CHECKS` calls it runs the call's
        forward type check once more, timed.  Published: the mean CPU time
        per call (without this hook's own time) and the median check -- this
        model's calls and their type checks, on this host.
        """

        name = _HOOK_NAME + "_count"

        def __init__(self, tracer: Tracer, begun: int) -> None:
            self.tracer = tracer
            self.begun = begun
            self.functions = 0
            self.checks: list[int] = []
            self.extra_ns = 0
            self.cpu_first = self.cpu_last = 0

        def forward_preprocess(self, function: Any, in_data: Any) -> None:
            tracer = self.tracer
            if tracer.iterations != self.begun:
                return
            ts = tracer.state()
            if not ts.iter_busy or ts.quiet:
                return
            entry = self.cpu_last = thread_time_ns()
            if not self.functions:
                self.cpu_first = entry
            self.functions += 1
            n = len(self.checks)
            if n < TIMED_CHECKS:
                check = getattr(function, "_check_data_type_forward", None)
                if check is not None:
                    t0 = perf_counter_ns()
                    try:
                        check(in_data)
                        self.checks.append(perf_counter_ns() - t0)
                    except Exception:  # the function raises it itself when it runs  # noqa: BLE001
                        pass
                self.publish(full=not n & (n + 1) or n + 1 == TIMED_CHECKS)
            else:
                self.publish(full=False)
            self.extra_ns += thread_time_ns() - entry  # the hook's own time is not the call's

        def publish(self, full: bool = True) -> None:
            facts = self.tracer.facts
            facts["functions_per_iteration"] = self.functions
            if not full:
                return
            facts["functions_counted_in"] = self.begun - 1
            if self.checks:
                facts["type_check_us"] = round(_median(self.checks) / 1e3, 3)
                facts["type_checks_timed"] = len(self.checks)
            cpu = self.cpu_last - self.cpu_first - self.extra_ns
            if self.functions > 1 and cpu > 0:
                facts["function_cpu_us"] = round(cpu / (self.functions - 1) / 1e3, 3)

    class EvalHook(base):  # type: ignore[misc, no-any-unimported]  # (same)
        """Counts functions applied with ``train`` off, and those that build a graph."""

        name = _HOOK_NAME + "_eval"

        def __init__(self) -> None:
            self.eval_functions = 0
            self.graph_functions = 0

        def forward_preprocess(self, function: Any, in_data: Any) -> None:
            if not config.train:
                self.eval_functions += 1
                if config.enable_backprop:
                    self.graph_functions += 1

    return CountHook, EvalHook


def _median(values: list[int]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return float(ordered[mid]) if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _enter_hook(hook: Any) -> bool:
    """Register ``hook`` on this thread unless one of that name is present."""
    import chainer  # imported by the program already: the probes run inside Chainer calls

    if hook.name in chainer.get_function_hooks():
        return False
    hook.__enter__()
    return True


def _exit_hook(hook: Any) -> None:
    import chainer  # likewise

    hooks = chainer.get_function_hooks()
    if hooks.get(hook.name) is hook:
        hook.__exit__(None, None, None)


# -- one-shot facts ---------------------------------------------------------------

def _on_gpu(array: Any) -> bool:
    return array is not None and type(array).__module__.split(".")[0] == "cupy"


def _param_facts(target: Any) -> dict[str, Any]:
    count = size = gpu = 0
    dtypes: dict[str, int] = {}
    float64_gpu: list[str] = []
    for path, param in target.namedparams():
        array = param.array
        if array is None:
            continue
        count += 1
        size += int(array.size)
        dtype = str(array.dtype)
        dtypes[dtype] = dtypes.get(dtype, 0) + 1
        if _on_gpu(array):
            gpu += 1
            if dtype == "float64" and len(float64_gpu) < 5:
                float64_gpu.append(path)
    facts: dict[str, Any] = {"count": count, "size": size, "dtypes": dtypes, "gpu": gpu}
    if float64_gpu:
        facts["float64_gpu_examples"] = float64_gpu
    return facts


def _conv_facts(target: Any) -> dict[str, int]:
    total = gpu = 0
    for link in target.links():
        if "Convolution" not in type(link).__name__:
            continue
        total += 1
        if any(_on_gpu(p.array) for p in link.params(include_uninit=False)):
            gpu += 1
    return {"count": total, "gpu": gpu}


def blas_facts() -> dict[str, Any]:
    """NumPy's BLAS: library name, whether it is a known optimized one, measured GFLOP/s."""
    name = _blas_name(numpy)
    optimized = None if name is None else any(lib in name.lower() for lib in OPTIMIZED_BLAS)
    return {"name": name, "optimized": optimized, "gflops": round(matmul_gflops(numpy), 2)}


def _blas_name(numpy: ModuleType) -> str | None:
    config = getattr(numpy, "__config__", None)
    deps = getattr(config, "CONFIG", {}).get("Build Dependencies", {})
    blas = deps.get("blas") if isinstance(deps, dict) else None
    if isinstance(blas, dict) and blas.get("name"):
        return str(blas["name"]) if blas.get("found", True) else "none"
    for key in ("blas_opt_info", "blas_ilp64_opt_info", "blas_info"):
        info = getattr(config, key, None)
        if isinstance(info, dict) and info.get("libraries"):
            return ",".join(info["libraries"])
    return None


def matmul_gflops(numpy: ModuleType, n: int = MATMUL_SIZE, repeats: int = 3) -> float:
    """GFLOP/s of the best of ``repeats`` float32 ``n x n`` matmuls."""
    a = numpy.ones((n, n), numpy.float32)
    b = numpy.ones((n, n), numpy.float32)
    a @ b
    best = None
    for _ in range(repeats):
        t0 = perf_counter_ns()
        a @ b
        dt = perf_counter_ns() - t0
        best = dt if best is None else min(best, dt)
    return 2.0 * n ** 3 / max(best or 1, 1)
