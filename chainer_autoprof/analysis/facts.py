"""The run-time facts: what the probes record, and the advice, the verdict and the summary read.

The patches put plain JSON values into ``tracer.facts`` while the program runs
(off the hot path); the run record carries them as ``facts``
(:mod:`.record`).  :data:`FACTS` declares each one (the writers' check, the
readers' check, the documentation); :class:`Facts` gives the same shape to
type checkers (``tests/test_record.py`` keeps the two in step).  Every fact is
optional: a probe that never ran leaves its fact out.
"""

from __future__ import annotations

from typing import TypedDict

from ..common.typedefs import GcTotals
from .shapes import ANY, BOOL, INT, NON_NEGATIVE, TEXT, Field, Kind, ListOf, MapOf, Section


def _fact(name: str, kind: Kind, doc: str, unit: str = "") -> Field:
    """A fact: present only once its probe has seen it."""
    return Field(name, kind, doc, unit=unit, required=False)


#: Per generation (0, 1, 2).
_PER_GENERATION = ListOf(INT)

GC = Section([
    Field("collections", _PER_GENERATION, "collections per generation"),
    Field("collected", _PER_GENERATION, "objects freed per generation"),
    Field("uncollectable", _PER_GENERATION, "uncollectable objects found per generation"),
    Field("ms", ListOf(NON_NEGATIVE), "time in collections per generation", "ms"),
    Field("ranges", _PER_GENERATION, "collections recorded as ranges per generation"),
    Field("unranged", INT, "collections outside any recorded range (no range of their own)"),
], doc="garbage collections (runtime/gc_ranges.py)")

INPUT_QUEUE = Section([
    Field("capacity", INT, "batches the iterator prefetches at most"),
    Field("fetches", INT, "training fetches seen"),
    Field("ready", ListOf(INT), "fetches that found N batches ready, by N (0..capacity)"),
], doc="one prefetching iterator (patches/input_queue.py)")

CONFIG = Section([
    _fact("train", ANY, "chainer.config.train"),
    _fact("enable_backprop", ANY, "chainer.config.enable_backprop"),
    _fact("type_check", ANY, "chainer.config.type_check"),
    _fact("autotune", ANY, "chainer.config.autotune"),
    _fact("use_cudnn", ANY, "chainer.config.use_cudnn"),
    _fact("cudnn_deterministic", ANY, "chainer.config.cudnn_deterministic"),
], doc="Chainer's configuration at the first update (a bool, int or string each)")

CUDA = Section([
    Field("available", BOOL, "chainer.backends.cuda.available"),
    Field("cudnn_enabled", BOOL, "chainer.backends.cuda.cudnn_enabled"),
], doc="Chainer's CUDA backend")

PARAMS = Section([
    Field("count", INT, "parameters of the optimizer's target"),
    Field("size", INT, "their elements in all"),
    Field("dtypes", MapOf(INT, key="dtype"), "parameters per dtype"),
    Field("gpu", INT, "parameters on a GPU"),
    _fact("float64_gpu_examples", ListOf(TEXT), "up to 5 float64 parameters on a GPU"),
], doc="the model's parameters")

CONV_LINKS = Section([
    Field("count", INT, "convolution links"),
    Field("gpu", INT, "of them on a GPU"),
], doc="convolution links of the model")

BLAS = Section([
    Field("name", TEXT, "NumPy's BLAS library (null: unknown)"),
    Field("optimized", BOOL, "whether it is a known optimized one (null: unknown)"),
    Field("gflops", NON_NEGATIVE, "measured float32 matmul speed", "GFLOP/s"),
], doc="NumPy's BLAS, on a CPU run")

EVALUATION = Section([
    Field("extension", TEXT, "the extension's range name"),
    Field("functions", INT, "functions applied in the evaluation"),
    Field("graph_functions", INT, "of them building a backward graph"),
], doc="one evaluation extension run")

TRANSFERS = Section([
    Field("calls", INT, "host <-> device copies inside iterations"),
    Field("by", MapOf(INT, key="call"), "copies per call (to_cpu, to_gpu, print, item)"),
    Field("phases", MapOf(INT, key="phase"), "copies per phase"),
    Field("iterations", INT, "iterations with a copy"),
], doc="host <-> device copies (CuPy only)")

REPLAY = Section([
    Field("iterator", TEXT, "the replayed iterator's class"),
    Field("iterator_mode", TEXT, "how its epoch state advanced"),
    Field("converter", BOOL, "whether the converted batch was replayed too"),
    Field("replayed", INT, "batches replayed"),
    _fact("error", TEXT, "why the replay stopped"),
], doc="the replay-batch experiment (patches/replay.py)")

#: Every fact, in the order they usually appear.
FACTS = Section([
    _fact("gc", GC, "garbage collections (CHAINER_PROF_GC)"),
    _fact("batch_size", INT, "the training batch's length"),
    _fact("iterator", TEXT, "the training iterator's class"),
    _fact("iterations", INT, "iterations the run began, warm-up and window included (how far "
          "it got)"),
    _fact("input_queue", MapOf(INPUT_QUEUE, key="iterator class"),
          "batches ready at each training fetch, per prefetching iterator"),
    _fact("config", CONFIG, "Chainer's configuration"),
    _fact("cuda", CUDA, "Chainer's CUDA backend"),
    _fact("params", PARAMS, "the model's parameters"),
    _fact("conv_links", CONV_LINKS, "convolution links"),
    _fact("blas", BLAS, "NumPy's BLAS (CPU runs)"),
    _fact("evaluation", ListOf(EVALUATION), "evaluation extensions that ran"),
    _fact("transfers", TRANSFERS, "host <-> device copies inside iterations"),
    _fact("functions_per_iteration", INT, "functions applied in one training iteration"),
    _fact("functions_counted_in", INT, "the iteration they were counted in"),
    _fact("type_check_us", NON_NEGATIVE, "median time of a function's type check", "us"),
    _fact("type_checks_timed", INT, "type checks timed"),
    _fact("function_cpu_us", NON_NEGATIVE, "mean CPU time of one function call", "us"),
    _fact("replay", REPLAY, "the replay-batch experiment"),
], doc="run-time facts (analysis/facts.py)", ordered=False)

# -- the same shapes for type checkers ----------------------------------------------------------
GcFacts = GcTotals


class InputQueueFacts(TypedDict, total=False):
    capacity: int
    fetches: int
    ready: list[int]


class ConfigFacts(TypedDict, total=False):
    train: object
    enable_backprop: object
    type_check: object
    autotune: object
    use_cudnn: object
    cudnn_deterministic: object


class CudaFacts(TypedDict, total=False):
    available: bool
    cudnn_enabled: bool


class ParamsFacts(TypedDict, total=False):
    count: int
    size: int
    dtypes: dict[str, int]
    gpu: int
    float64_gpu_examples: list[str]


class ConvLinksFacts(TypedDict, total=False):
    count: int
    gpu: int


class BlasFacts(TypedDict, total=False):
    name: str | None
    optimized: bool | None
    gflops: float


class EvaluationFacts(TypedDict, total=False):
    extension: str
    functions: int
    graph_functions: int


class TransfersFacts(TypedDict, total=False):
    calls: int
    by: dict[str, int]
    phases: dict[str, int]
    iterations: int


class ReplayFacts(TypedDict, total=False):
    iterator: str | None
    iterator_mode: str | None
    converter: bool
    replayed: int
    error: str


class Facts(TypedDict, total=False):
    """``facts`` of the run record (:data:`FACTS`)."""

    gc: GcFacts
    batch_size: int
    iterator: str
    iterations: int
    input_queue: dict[str, InputQueueFacts]
    config: ConfigFacts
    cuda: CudaFacts
    params: ParamsFacts
    conv_links: ConvLinksFacts
    blas: BlasFacts
    evaluation: list[EvaluationFacts]
    transfers: TransfersFacts
    functions_per_iteration: int
    functions_counted_in: int
    type_check_us: float
    type_checks_timed: int
    function_cpu_us: float
    replay: ReplayFacts


#: Each declared section and its type (the test that keeps them in step walks this).
TYPED = {"facts": (FACTS, Facts), "facts.gc": (GC, GcFacts),
         "facts.input_queue.*": (INPUT_QUEUE, InputQueueFacts),
         "facts.config": (CONFIG, ConfigFacts), "facts.cuda": (CUDA, CudaFacts),
         "facts.params": (PARAMS, ParamsFacts), "facts.conv_links": (CONV_LINKS, ConvLinksFacts),
         "facts.blas": (BLAS, BlasFacts), "facts.evaluation[]": (EVALUATION, EvaluationFacts),
         "facts.transfers": (TRANSFERS, TransfersFacts), "facts.replay": (REPLAY, ReplayFacts)}
