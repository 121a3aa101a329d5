"""Configuration advice: checks of this run's setup, each only when the run shows it.

Every check reads the run-time facts the probes recorded
(:mod:`chainer_autoprof.patches.probes`) and the run's statistics, and
returns a :class:`Finding` -- what was seen, the measured cost when there is
one, the fix and the Chainer documentation section -- or nothing.  A run with
nothing to say gets no advice.  Thresholds live in :mod:`.verdict`; every figure
goes through :mod:`..common.figures`.  A check that raises (a bug of ours, or a
fact of a shape it does not expect) is left out with one line on stderr, and
fails the tests (:func:`..common.log.contained`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..common import figures as fmt
from ..common import log
from . import verdict as vd
from . import whatif
from .finding import Finding
from .gpu_evidence import on_gpu
from .iteration_figures import FIGURES
from .outliers import OUTLIER_FACTOR, slow_iterations, stutter

if TYPE_CHECKING:
    from ..common.typedefs import Facts
    from .stats import RunStats
    from .verdict import Verdict

PERFORMANCE_DOC = "https://docs.chainer.org/en/stable/performance.html"
GC_DOC = "https://docs.python.org/3/library/gc.html#gc.freeze"
CONFIG_DOC = "https://docs.chainer.org/en/stable/reference/configuration.html"

#: Link class names whose work cuDNN accelerates (besides convolutions).
CUDNN_LINKS = ("Convolution", "BatchNormalization", "LSTM", "GRU", "RNN")


def _config(facts: Facts) -> Facts:
    return facts.get("config") or {}


def _gpu_params(facts: Facts) -> int:
    return int((facts.get("params") or {}).get("gpu") or 0)


# -- the checks ------------------------------------------------------------------------

def check_type_check(stats: RunStats, verdict: Verdict, facts: Facts) -> Finding | None:
    if not _config(facts).get("type_check"):
        return None
    calls = vd.functions_per_iteration(stats)
    check = facts.get("type_check_us")
    call = facts.get("function_cpu_us")
    if not calls or not isinstance(check, (int, float)) or not isinstance(call, (int, float)):
        return None
    share = check / call if call > 0 else 0.0
    if share < vd.ADVICE_MIN_SHARE:
        return None
    counted_in = facts.get("functions_counted_in", "?")
    cost_ms = calls * check / 1000.0
    return Finding(
        "type_check", "chainer.config.type_check is on during training",
        f"{fmt.count(calls)} function calls per iteration, each type-checked; in iteration "
        f"{counted_in} a call took {fmt.us(call)} of host CPU time on average, and its type "
        f"check, timed again, {fmt.us(check)} (median of "
        f"{facts.get('type_checks_timed', '?')})",
        f"{fmt.pct(share)} of the host time of each call: about {fmt.ms(cost_ms)} per "
        "iteration (estimated: calls x the timed check)",
        "chainer.config.type_check = False (or CHAINER_TYPE_CHECK=0) once the model and its "
        "inputs are tested",
        f"{PERFORMANCE_DOC}#fine-tune-configuration")


def check_autotune(stats: RunStats, verdict: Verdict, facts: Facts) -> Finding | None:
    conv = facts.get("conv_links") or {}
    cfg = _config(facts)
    cuda = facts.get("cuda") or {}
    if not conv.get("gpu") or cfg.get("autotune") is not False:
        return None
    if not cuda.get("cudnn_enabled") or cfg.get("use_cudnn") == "never":
        return None  # cuDNN itself is missing: that advice comes first
    return Finding(
        "autotune", "cuDNN autotune is off while convolutions run on the GPU",
        f"{conv['gpu']} convolution link(s) on the GPU, chainer.config.autotune = False",
        "not measured: the default algorithm may be slower than the best one for these shapes",
        "chainer.config.autotune = True (the first batch of each input shape gets slower "
        "while cuDNN tries the algorithms); a larger "
        "chainer.backends.cuda.set_max_workspace_size can allow faster ones",
        f"{PERFORMANCE_DOC}#auto-tuner")


def check_cudnn(stats: RunStats, verdict: Verdict, facts: Facts) -> Finding | None:
    if not _gpu_params(facts):
        return None
    cuda = facts.get("cuda") or {}
    cfg = _config(facts)
    disabled = cfg.get("use_cudnn") == "never"
    if cuda.get("cudnn_enabled", True) and not disabled:
        return None
    conv = int((facts.get("conv_links") or {}).get("gpu") or 0)
    kinds = sorted({kind for link in stats.links for kind in CUDNN_LINKS if kind in link.name})
    if not conv and not kinds:
        return None
    major = vd.cupy_major(stats)
    why = "chainer.config.use_cudnn = 'never'" if disabled else "cuDNN is not available to CuPy"
    if not disabled and major is not None and major >= 14:
        version = ((stats.meta or {}).get("versions") or {}).get("cupy")
        why += f": this is CuPy {version}, and CuPy 14 removed cuDNN support"
    layers = f"{conv} convolution link(s) on the GPU" if conv else ", ".join(kinds) + " links"
    fix = ("chainer.config.use_cudnn = 'auto' (the default)" if disabled
           else vd.cudnn_fix(stats))
    return Finding(
        "cudnn", "cuDNN is not used",
        f"{why}; the model has {layers}",
        "not measured: without cuDNN these layers run CuPy's own, slower kernels"
        + _conv_gpu_share(stats),
        fix,
        f"{PERFORMANCE_DOC}#using-gpu")


def _conv_gpu_share(stats: RunStats) -> str:
    """The convolutions' share of the links' GPU time, where the run tells it (sync level 3
    link ranges, or an activity record)."""
    links, how = vd.gpu_links(stats, n=len(stats.links) or vd.TOP_LINKS)
    total = sum(ms for _name, ms in links)
    conv = sum(ms for name, ms in links if "Convolution" in name or "Deconvolution" in name)
    if not total or not conv:
        return ""
    return (f"; here the convolution links hold {fmt.pct(conv / total)} of the links' GPU "
            f"time ({fmt.ms(conv)} per iteration; {how})")


def check_eval_backprop(stats: RunStats, verdict: Verdict, facts: Facts) -> Finding | None:
    found = [e for e in facts.get("evaluation") or () if e.get("graph_functions")]
    if not found:
        return None
    first = found[0]
    name = first.get("extension", "an extension")
    spent = stats.outside_ms.get(name)
    loop = vd.loop_ms(stats)
    cost = ("not measured separately: the graph's memory and bookkeeping are part of "
            f"{name}'s {fmt.ms(spent)} over the run ({fmt.pct(spent / loop)} of the training "
            "loop)") if spent and loop > 0 else \
        "not measured: keeping the graph costs memory and time in every evaluation"
    return Finding(
        "eval_backprop", "evaluation builds the computational graph (enable_backprop on)",
        f"{name}: {first['graph_functions']} of {first['functions']} function calls with "
        "chainer.config.train off ran with enable_backprop on in its first call",
        cost,
        "evaluate under chainer.no_backprop_mode() (as chainer.training.extensions.Evaluator "
        "does) or with chainer.using_config('enable_backprop', False)",
        f"{PERFORMANCE_DOC}#fine-tune-configuration")


def check_float64_gpu(stats: RunStats, verdict: Verdict, facts: Facts) -> Finding | None:
    params = facts.get("params") or {}
    examples = params.get("float64_gpu_examples")
    if not params.get("gpu") or not examples:
        return None
    count = (params.get("dtypes") or {}).get("float64", len(examples))
    return Finding(
        "float64_gpu", "float64 parameters on the GPU",
        f"{fmt.count(count)} float64 parameter(s) on the GPU, e.g. {', '.join(examples[:3])}",
        "not measured: GPUs run float64 arithmetic at a fraction of the float32 rate and move "
        "twice the bytes",
        "use float32 (chainer.config.dtype = numpy.float32, the default; cast inputs with "
        "x.astype(numpy.float32)) or mixed16 where supported",
        f"{CONFIG_DOC}")


def check_transfers(stats: RunStats, verdict: Verdict, facts: Facts) -> Finding | None:
    info = facts.get("transfers") or {}
    seen_in = int(info.get("iterations") or 0)
    total = stats.iterations + stats.warmup
    if not seen_in or not total or seen_in / total < vd.TRANSFER_ITERATION_SHARE:
        return None
    by = ", ".join(f"{k} x{fmt.count(n)}" for k, n in sorted((info.get("by") or {}).items()))
    where = ", ".join(f"{k} {fmt.count(n)}"
                      for k, n in sorted((info.get("phases") or {}).items()))
    return Finding(
        "transfers", "copies between host and GPU inside the iteration",
        f"{fmt.count(info.get('calls', 0))} copies outside the data phase in {seen_in} of {total} "
        f"training iterations ({by}; by phase: {where})",
        "not measured per copy: each copy to the host waits for all GPU work queued before it",
        "keep values on the GPU during the iteration: report Variables (chainer.report) "
        "instead of printing them or calling to_cpu/item(), and convert once per log interval",
        f"{PERFORMANCE_DOC}#avoid-data-transfer")


def check_blas(stats: RunStats, verdict: Verdict, facts: Facts) -> Finding | None:
    blas = facts.get("blas")
    if not blas or _gpu_params(facts) or on_gpu(stats):
        return None
    optimized = blas.get("optimized")
    gflops = blas.get("gflops")
    slow = isinstance(gflops, (int, float)) and gflops < vd.BLAS_SLOW_GFLOPS
    if not (optimized is False or (optimized is None and slow)):
        return None
    compute = sum(stats.phase_share(k) for k in ("forward", "backward", "update"))
    if compute < vd.BLAS_MIN_COMPUTE_SHARE:
        return None
    name = blas.get("name") or "unknown"
    return Finding(
        "blas", "NumPy without an optimized BLAS on a CPU run",
        f"NumPy's BLAS: {name}; forward/backward/update take {fmt.pct(compute)} of the "
        "iteration time",
        f"measured {fmt.num(gflops)} GFLOP/s on a float32 128x128 matrix product"
        if isinstance(gflops, (int, float)) else "not measured",
        "install a NumPy built with OpenBLAS or MKL (the PyPI wheels bundle OpenBLAS; "
        "check numpy.show_config())",
        f"{PERFORMANCE_DOC}#using-cpu")


def check_serial_iterator(stats: RunStats, verdict: Verdict, facts: Facts) -> Finding | None:
    if facts.get("iterator") != "SerialIterator" or verdict is None:
        return None
    if verdict.kind != "input-bound" and not any(a.startswith("input-bound")
                                                 for a in verdict.also):
        return None
    data = vd.per_iteration(stats, stats.phase_total("data"))
    return Finding(
        "serial_iterator", "SerialIterator while the run is input-bound",
        "the training iterator is a SerialIterator: examples load one after another in the "
        "training process",
        f"data loading {fmt.ms(data)} per iteration ({fmt.pct(stats.phase_share('data'))} of "
        "the iteration time)",
        "chainer.iterators.MultiprocessIterator(dataset, batch_size, n_processes=N) when "
        "loading is CPU work, MultithreadIterator(dataset, batch_size, n_threads=N) when it "
        "waits on I/O",
        f"{PERFORMANCE_DOC}#load-datasets-concurrently")


def check_warmup(stats: RunStats, verdict: Verdict, facts: Facts) -> Finding | None:
    warm_ms = stats.outside_ms.get("warm-up", 0.0)
    if not stats.warmup or not warm_ms or not stats.iterations or vd.is_replay(stats):
        return None  # (a replay run loads its first batch for real: not a warm-up cost)
    median = stats.median()
    mean_warm = warm_ms / stats.warmup
    if median <= 0 or mean_warm < vd.WARMUP_SLOW_FACTOR * median:
        return None
    excess = warm_ms - stats.warmup * median
    training = vd.loop_ms(stats) + warm_ms
    if excess < vd.WARMUP_MIN_MS or training <= 0 or excess / training < vd.WARMUP_MIN_SHARE:
        return None
    autotune = bool(_config(facts).get("autotune"))
    fix = ("one-time costs (lazy parameter initialization, CuPy kernel compilation, memory "
           "pool growth) are paid once: for benchmarks, run more iterations and leave the "
           "first ones out (CHAINER_PROF_WARMUP=N); if input shapes vary, each new shape pays "
           "again -- pad batches to a few fixed shapes")
    if autotune:
        fix = ("cuDNN autotune (on) tries every algorithm for each new input shape: keep input "
               "shapes fixed (pad to a few sizes), or turn autotune off for short runs; " + fix)
    return Finding(
        "warmup", "the first iterations are much slower than the rest",
        f"the first {stats.warmup} iteration(s) took {fmt.ms(mean_warm)} each on average, "
        f"{fmt.factor(mean_warm / median)} the {fmt.ms(median)} median",
        f"{fmt.ms(excess)} more than median iterations would take "
        f"({fmt.pct(excess / training)} of the training time)",
        fix,
        f"{PERFORMANCE_DOC}#auto-tuner")


def check_gc(stats: RunStats, verdict: Verdict, facts: Facts) -> Finding | None:
    """Garbage collection takes a share of the iterations, or makes some of them slow."""
    gc = facts.get("gc")
    if not isinstance(gc, dict) or not stats.iteration_total_ms:
        return None
    st = stutter(stats)
    share = stats.gc_total_ms / stats.iteration_total_ms
    caused = [s for s in slow_iterations(stats) if s.cause == "gc"]
    if share < vd.ADVICE_MIN_SHARE and not (caused and st.share >= vd.ADVICE_MIN_SHARE):
        return None
    caused_ms = sum(s.cause_ms for s in caused)
    if max(stats.gc_total_ms, caused_ms) < vd.GC_MIN_MS:
        return None
    counts = list(gc.get("collections") or [0, 0, 0])
    seen = (f"{fmt.count(sum(counts))} collections in the run (gen 0: {fmt.count(counts[0])}, "
            f"gen 1: {fmt.count(counts[1])}, "
            f"gen 2: {fmt.count(counts[2])}); inside counted iterations they took "
            f"{fmt.ms(stats.gc_total_ms)} ({fmt.pct(share)} of the iteration time)")
    if caused:
        worst = caused[0]
        seen += (f"; iteration {worst.iteration} took {fmt.ms(worst.ms)} "
                 f"({fmt.factor(worst.factor)} the median), {fmt.ms(worst.cause_ms)} of it in "
                 f"gc gen {worst.generation}")
    cost = f"{fmt.ms(stats.gc_total_ms)} of the counted iterations"
    if st.count:
        cost += (f"; iterations above {fmt.ms(st.median_ms * OUTLIER_FACTOR)} "
                 f"({fmt.num(OUTLIER_FACTOR)}x the median) hold {fmt.pct(st.share)} of the "
                 "iteration time above the median")
    return Finding(
        "gc", "garbage collection slows training iterations", seen, cost,
        "call gc.freeze() once the model, the optimizer and the data set are built (just "
        "before trainer.run()): what exists then is never traversed by a collection again; "
        "if collections still hurt, raise the thresholds (gc.set_threshold(50_000, 50, 100)) "
        "or turn automatic collection off in the loop (gc.disable()) and call gc.collect() "
        "between epochs; reference cycles made each iteration (a graph kept in a list, "
        "a Variable stored on the model) are what fills the generations",
        GC_DOC)


def check_slow_extension(stats: RunStats, verdict: Verdict, facts: Facts) -> Finding | None:
    """Slow iterations explained by an extension or an evaluation run inside them."""
    found = [s for s in slow_iterations(stats)
             if s.cause == "range" and (s.name.startswith("extension:") or
                                        s.name == "inference")]
    if not found:
        return None
    worst = found[0]
    return Finding(
        "slow_extension", f"{worst.name} makes some iterations slow",
        f"iteration {worst.iteration} took {fmt.ms(worst.ms)} ({fmt.factor(worst.factor)} the "
        f"median), {fmt.ms(worst.cause_ms)} of it in {worst.name} ({len(found)} of the slowest "
        "iterations alike)",
        f"about {fmt.ms(worst.cause_ms)} each time it runs",
        "run it less often (a larger trigger interval, e.g. trigger=(1, 'epoch')) or outside "
        "the training iteration, or make it cheaper (evaluate on a subset)",
        f"{PERFORMANCE_DOC}")


#: Every check, in the order findings are printed.
CHECKS: tuple[Callable[[RunStats, Verdict, Facts], Finding | None], ...] = (
    check_serial_iterator, check_type_check, check_eval_backprop, check_transfers,
    check_cudnn, check_autotune, check_float64_gpu, check_blas, check_warmup, check_gc,
    check_slow_extension,
)


def check(stats: RunStats, verdict: Verdict | None = None) -> list[Finding]:
    """Every finding for ``stats`` (the verdict is computed when not given)."""
    if not stats.iterations:
        return []
    if verdict is None:
        verdict = vd.decide(stats)
    facts = vd.facts_of(stats)
    findings = []
    for fn in CHECKS:
        try:
            finding = fn(stats, verdict, facts)
        except Exception as exc:  # our bug, or a fact of a shape it does not expect  # noqa: BLE001
            log.warning(log.contained(f"advice check {fn.__name__}", exc), once=True)
            finding = None
        if finding is not None:
            findings.append(finding)
    for fig in FIGURES:  # the figures read at each iteration's end
        samples = stats.per_iteration.get(fig.name)
        try:
            findings += fig.advice(samples) if samples is not None else []
        except Exception as exc:  # our bug  # noqa: BLE001
            log.warning(log.contained(f"advice of {fig.name}", exc), once=True)
    try:
        return whatif.with_predictions(stats, findings, verdict.whatif)
    except Exception as exc:  # our bug: the findings stand without  # noqa: BLE001
        log.warning(log.contained("the advice's what-if costs", exc), once=True)
        return findings
