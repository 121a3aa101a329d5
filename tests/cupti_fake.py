"""The tests' libcupti (``cupti_fake/cupti_fake.c``): recorded CUPTI activity served as
CUPTI's own record structs, so the native reader runs its exact live path without a GPU.

:func:`build_library` compiles it into ``tests/_build/`` (like the NVTX recorder), against
the CUPTI headers the extension is built with; :func:`write_stream` writes a recording's
records, in the order CUPTI fills its buffers (by end time, as
:func:`gpu_live_replay.as_cupti_records`), in the file format the library reads;
:class:`FakeCupti` loads and steers it in this process (the agent's ``dlopen`` of the same
path gets the same library: point ``CHAINER_AUTOPROF_CUPTI_LIBRARY`` at :attr:`path`).

Stream file: int64 count of kernel names, then each as int64 length + UTF-8 bytes; int64
count of entries, then each entry ``(int32 CUPTI kind, int32 0, int64 fields[16])``:
kernel ``start end correlation device context stream name grid_xyz block_xyz registers
static_smem dynamic_smem``; memcpy ``start end correlation device context stream bytes
copy_kind src_kind dst_kind``; memset ``start end correlation device context stream bytes
value``; runtime/driver ``start end correlation cbid thread``.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import subprocess
import uuid
from pathlib import Path
from types import ModuleType

import numpy as np

from chainer_autoprof.common import gpu_records as gr
from chainer_autoprof.common.gpu_records import Recording

TESTS_DIR = Path(__file__).resolve().parent
SOURCE = TESTS_DIR / "cupti_fake" / "cupti_fake.c"
BUILD_DIR = TESTS_DIR / "_build"
LIBRARY = BUILD_DIR / "libcupti_fake.so"
ENTRY = np.dtype([("kind", "<i4"), ("pad", "<i4"), ("f", "<i8", (16,))])


def _build_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "_hotpath_build_for_cupti", TESTS_DIR.parent / "chainer_autoprof" / "runtime"
        / "hotpath" / "build.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build


def build_library() -> Path:
    """Compile the library into ``tests/_build/`` unless it is up to date (safe with
    concurrent pytest processes: a private name renamed into place)."""
    if LIBRARY.exists() and LIBRARY.stat().st_mtime >= SOURCE.stat().st_mtime:
        return LIBRARY
    include = _build_module().cupti_include_dirs()
    if include is None:
        raise FileNotFoundError("CUPTI headers not found: pip install nvidia-cuda-cupti "
                                "nvidia-cuda-runtime nvidia-cuda-crt")
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    tmp = str(BUILD_DIR / f".{LIBRARY.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    cmd = [os.environ.get("CC", "gcc"), "-shared", "-fPIC", "-O2", "-pthread", "-Wall",
           "-Wextra", "-fvisibility=hidden", *(f"-I{d}" for d in include), "-o", tmp,
           str(SOURCE)]
    try:
        result = subprocess.run(cmd, check=False, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"building the test libcupti failed: {' '.join(cmd)}\n"
                               f"{result.stderr}")
        os.replace(tmp, LIBRARY)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return LIBRARY


def stream_entries(rec: Recording) -> np.ndarray:
    """The recording's kernels, copies, memsets and API calls as stream entries, by end
    time (ties: operations after calls, each in recorded order)."""
    b = rec.batch
    o, a = b.ops, b.api
    ops = np.zeros(len(o), dtype=ENTRY)
    kinds = np.array([gr.CUPTI_KIND_CONCURRENT_KERNEL, gr.CUPTI_KIND_MEMCPY,
                      gr.CUPTI_KIND_MEMSET])
    ops["kind"] = kinds[o.kind]
    head = (o.start, o.end, o.correlation, o.device, o.context, o.stream)
    for i, col in enumerate(head):
        ops["f"][:, i] = col
    k, c, s = o.kind == gr.KERNEL, o.kind == gr.MEMCPY, o.kind == gr.MEMSET
    for i, col in enumerate((o.name, o.grid_x, o.grid_y, o.grid_z, o.block_x, o.block_y,
                             o.block_z, o.registers, o.static_smem, o.dynamic_smem)):
        ops["f"][k, 6 + i] = col[k]
    for i, col in enumerate((o.bytes, o.copy_kind, o.src_kind, o.dst_kind)):
        ops["f"][c, 6 + i] = col[c]
    ops["f"][s, 6] = o.bytes[s]
    ops["f"][s, 7] = np.maximum(o.value[s], 0)
    api = np.zeros(len(a), dtype=ENTRY)
    api["kind"] = np.where(a.domain == gr.RUNTIME, gr.CUPTI_KIND_RUNTIME, gr.CUPTI_KIND_DRIVER)
    for i, col in enumerate((a.start, a.end, a.correlation, a.cbid, a.thread)):
        api["f"][:, i] = col
    entries = np.concatenate([api, ops])
    ends = np.concatenate([a.end, o.end])
    return entries[np.argsort(ends, kind="stable")]


def write_stream(rec: Recording, path: Path, entries: np.ndarray | None = None) -> int:
    """Write ``rec`` (its names, and ``entries``, by default all its records) as the
    library's stream file; the number of entries."""
    if entries is None:
        entries = stream_entries(rec)
    with open(path, "wb") as f:
        f.write(np.int64(len(rec.batch.names)).tobytes())
        for name in rec.batch.names.names:
            data = name.encode("utf-8")
            f.write(np.int64(len(data)).tobytes())
            f.write(data)
        f.write(np.int64(len(entries)).tobytes())
        f.write(entries.tobytes())
    return len(entries)


class FakeCupti:
    """The test libcupti loaded in this process, serving one recording."""

    def __init__(self, rec: Recording, folder: Path, *, system_ids: bool = False,
                 entries: np.ndarray | None = None) -> None:
        self.path = build_library()
        self.lib = ctypes.CDLL(str(self.path))
        folder.mkdir(parents=True, exist_ok=True)
        stream = folder / "cupti_stream.bin"
        self.entries = write_stream(rec, stream, entries)
        if self.lib.cupti_fake_load(str(stream).encode()) != 0:
            raise RuntimeError(f"the test libcupti could not read {stream}")
        pairs = rec.clock
        last = len(pairs) - 1
        self.lib.cupti_fake_clock(*(ctypes.c_int64(int(v)) for v in (
            pairs.cupti_ns[0], pairs.perf_ns[0], pairs.cupti_ns[last], pairs.perf_ns[last])))
        self.lib.cupti_fake_system_ids(int(system_ids))
        # bound once: a ctypes lookup per call would count in what a benchmark measures
        self._serve, self._wait = self.lib.cupti_fake_serve, self.lib.cupti_fake_wait
        self._served = self.lib.cupti_fake_served

    def prepare(self, pieces: int) -> None:
        """Fill the buffers of the stream cut into ``pieces`` parts (CUPTI's own work)."""
        if self.lib.cupti_fake_prepare(ctypes.c_long(pieces)):
            raise RuntimeError("the test libcupti could not fill its buffers")

    def serve(self, pieces: int, pace_s: float, prepared: bool = False) -> None:
        """Hand the stream over in ``pieces`` buffers, ``pace_s`` apart, on the library's
        own thread (``prepared``: filled already by :meth:`prepare`)."""
        if not prepared:
            self.prepare(pieces)
        if self._serve(ctypes.c_long(int(pace_s * 1e6))):
            raise RuntimeError("the test libcupti could not start its thread")

    def wait(self) -> None:
        self._wait()

    def clock_fails(self, on: bool) -> None:
        """Whether ``cuptiGetTimestamp`` fails from now on."""
        self.lib.cupti_fake_clock_fails(int(on))

    def run(self, count: int) -> None:
        """The program runs on: the stream's next ``count`` entries happen now, kept as what
        is enabled now says, and are handed over at once on this thread."""
        self.lib.cupti_fake_run(ctypes.c_long(count))

    @property
    def enabled_kinds(self) -> set[int]:
        """The CUPTI activity kinds enabled now."""
        bits = int(self.lib.cupti_fake_enabled_kinds())
        return {kind for kind in range(32) if bits >> kind & 1}

    def call_recorded(self, kind: int, cbid: int) -> bool:
        """Whether a runtime or driver call (``kind``) of id ``cbid`` is recorded now."""
        return bool(self.lib.cupti_fake_call_recorded(int(kind), int(cbid)))

    @property
    def served(self) -> int:
        """Records handed over so far (those of the enabled kinds and calls)."""
        return int(self._served())
