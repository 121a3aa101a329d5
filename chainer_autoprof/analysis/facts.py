"""The run-time facts: what the probes record, and the advice, the verdict and the summary read.

The patches put plain JSON values into ``tracer.facts`` while the program runs
(off the hot path); the run record carries them as ``facts``
(:mod:`.record`).  :class:`Facts` and its parts declare each one, once: type
checkers read the classes, and :data:`FACTS` (the writers' check, the readers'
check, the documentation) is derived from them.  Every fact is optional: a
probe that never ran leaves its fact out.
"""

from __future__ import annotations

from typing import Dict, List, Optional, TypedDict

from ..common.typedefs import GcTotals
from .shapes import ANY, NON_NEGATIVE, Annotated, F, Section, section_of, shape

#: Garbage collections (runtime/gc_ranges.py), declared where they are counted.
GcFacts = GcTotals
#: A fact present only once its probe has seen it.
LATER = F(required=False)


class InputQueueFacts(TypedDict, total=False):
    """One prefetching iterator (patches/input_queue.py)."""

    capacity: Annotated[int, F("batches the iterator prefetches at most")]
    fetches: Annotated[int, F("training fetches seen")]
    ready: Annotated[List[int], F("fetches that found N batches ready, by N (0..capacity)")]


class ConfigFacts(TypedDict, total=False):
    """Chainer's configuration at the first update (a bool, int or string each)."""

    train: Annotated[object, LATER, F("chainer.config.train", kind=ANY)]
    enable_backprop: Annotated[object, LATER, F("chainer.config.enable_backprop", kind=ANY)]
    type_check: Annotated[object, LATER, F("chainer.config.type_check", kind=ANY)]
    autotune: Annotated[object, LATER, F("chainer.config.autotune", kind=ANY)]
    use_cudnn: Annotated[object, LATER, F("chainer.config.use_cudnn", kind=ANY)]
    cudnn_deterministic: Annotated[object, LATER, F("chainer.config.cudnn_deterministic",
                                                    kind=ANY)]


class CudaFacts(TypedDict, total=False):
    """Chainer's CUDA backend."""

    available: Annotated[bool, F("chainer.backends.cuda.available")]
    cudnn_enabled: Annotated[bool, F("chainer.backends.cuda.cudnn_enabled")]


class ParamsFacts(TypedDict, total=False):
    """The model's parameters."""

    count: Annotated[int, F("parameters of the optimizer's target")]
    size: Annotated[int, F("their elements in all")]
    dtypes: Annotated[Dict[str, int], F("parameters per dtype", key="dtype")]
    gpu: Annotated[int, F("parameters on a GPU")]
    float64_gpu_examples: Annotated[List[str], LATER, F("up to 5 float64 parameters on a GPU")]


class ConvLinksFacts(TypedDict, total=False):
    """Convolution links of the model."""

    count: Annotated[int, F("convolution links")]
    gpu: Annotated[int, F("of them on a GPU")]


class BlasFacts(TypedDict, total=False):
    """NumPy's BLAS, on a CPU run."""

    name: Annotated[Optional[str], F("NumPy's BLAS library (null: unknown)")]
    optimized: Annotated[Optional[bool], F("whether it is a known optimized one (null: unknown)",
                                        nullable=False)]
    gflops: Annotated[float, F("measured float32 matmul speed", "GFLOP/s", NON_NEGATIVE)]


class EvaluationFacts(TypedDict, total=False):
    """One evaluation extension run."""

    extension: Annotated[str, F("the extension's range name")]
    functions: Annotated[int, F("functions applied in the evaluation")]
    graph_functions: Annotated[int, F("of them building a backward graph")]


class TransfersFacts(TypedDict, total=False):
    """Host <-> device copies (CuPy only)."""

    calls: Annotated[int, F("host <-> device copies inside iterations")]
    by: Annotated[Dict[str, int], F("copies per call (to_cpu, to_gpu, print, item)", key="call")]
    phases: Annotated[Dict[str, int], F("copies per phase", key="phase")]
    iterations: Annotated[int, F("iterations with a copy")]


class ReplayFacts(TypedDict, total=False):
    """The replay-batch experiment (patches/replay.py)."""

    iterator: Annotated[Optional[str], F("the replayed iterator's class")]
    iterator_mode: Annotated[Optional[str], F("how its epoch state advanced")]
    converter: Annotated[bool, F("whether the converted batch was replayed too")]
    replayed: Annotated[int, F("batches replayed")]
    error: Annotated[str, LATER, F("why the replay stopped")]


@shape(ordered=False)
class Facts(TypedDict, total=False):
    """Run-time facts (analysis/facts.py)."""

    gc: Annotated[GcFacts, LATER, F("garbage collections (CHAINER_PROF_GC)")]
    batch_size: Annotated[int, LATER, F("the training batch's length")]
    iterator: Annotated[str, LATER, F("the training iterator's class")]
    iterations: Annotated[int, LATER, F("iterations the run began, warm-up and window included "
                                        "(how far it got)")]
    input_queue: Annotated[Dict[str, InputQueueFacts], LATER, F(
        "batches ready at each training fetch, per prefetching iterator",
        key="iterator class")]
    config: Annotated[ConfigFacts, LATER, F("Chainer's configuration")]
    cuda: Annotated[CudaFacts, LATER, F("Chainer's CUDA backend")]
    params: Annotated[ParamsFacts, LATER, F("the model's parameters")]
    conv_links: Annotated[ConvLinksFacts, LATER, F("convolution links")]
    blas: Annotated[BlasFacts, LATER, F("NumPy's BLAS (CPU runs)")]
    evaluation: Annotated[List[EvaluationFacts], LATER, F("evaluation extensions that ran")]
    transfers: Annotated[TransfersFacts, LATER, F("host <-> device copies inside iterations")]
    functions_per_iteration: Annotated[int, LATER, F("functions applied in one training "
                                                     "iteration")]
    functions_counted_in: Annotated[int, LATER, F("the iteration they were counted in")]
    type_check_us: Annotated[float, LATER, F("median time of a function's type check", "us",
                                             NON_NEGATIVE)]
    type_checks_timed: Annotated[int, LATER, F("type checks timed")]
    function_cpu_us: Annotated[float, LATER, F("mean CPU time of one function call", "us",
                                               NON_NEGATIVE)]
    replay: Annotated[ReplayFacts, LATER, F("the replay-batch experiment")]


#: Every fact, in the order they usually appear (derived from :class:`Facts`).
FACTS: Section = section_of(Facts)
GC = section_of(GcFacts)


def _typed() -> dict[str, tuple[Section, type]]:
    """Each declared section of the facts and the class that declares it."""
    out: dict[str, tuple[Section, type]] = {"facts": (FACTS, Facts)}
    for f in FACTS.fields:
        kind, suffix = f.kind, ""
        while not isinstance(kind, Section) and hasattr(kind, "item"):
            suffix += "[]" if type(kind).__name__ == "ListOf" else ".*"
            kind = kind.item
        if isinstance(kind, Section) and kind.cls is not None:
            out[f"facts.{f.name}{suffix}"] = (kind, kind.cls)
    return out


#: Each declared section and its type (documentation and tests walk this).
TYPED = _typed()
