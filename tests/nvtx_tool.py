"""Record the NVTX calls of a process, without a GPU or an NVIDIA tool.

``nvtx_inject/nvtx_recorder.c`` is an NVTX v3 injection library: a process
started with :func:`nvtx_env` in its environment writes one line per NVTX call
to the record file, which :func:`read_events` parses.  The environment must be
set before the process starts: NVTX reads it at its first call.

Typical use in a test::

    env = {**os.environ, **nvtx_env(tmp_path / "nvtx.%p.tsv")}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    events = read_events(tmp_path / "nvtx.*.tsv")
    assert tree(events, domain="chainer") == ["forward", "  linear"]

Record line format (tab-separated, see the C source for details)::

    event  pid  tid  domain  text  color  category  id

``%p`` in the record file name is replaced by the pid, so forked and child
processes write files of their own.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import subprocess
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
SOURCE = TESTS_DIR / "nvtx_inject" / "nvtx_recorder.c"
BUILD_DIR = TESTS_DIR / "_build"
LIBRARY = BUILD_DIR / "libnvtx_recorder.so"

# Record kinds: calls that annotate time, and calls that name things.
TIMELINE_EVENTS = ("push", "pop", "mark", "start", "end")
NAMING_EVENTS = ("domain", "string", "category", "threadname")
EVENTS = TIMELINE_EVENTS + NAMING_EVENTS


# --------------------------------------------------------------------------
# Building the injection library
# --------------------------------------------------------------------------


def nvtx_include_dir() -> Path:
    """Directory holding ``nvtx3/nvToolsExt.h``: the one the native hot path is built with
    (the ``nvidia-nvtx`` wheel, else the CUDA toolkit)."""
    # this checkout's build helpers, by file: a benchmark may put another checkout's
    # package (one without them) first on sys.path
    spec = importlib.util.spec_from_file_location(
        "_hotpath_build", Path(__file__).resolve().parent.parent / "chainer_autoprof" / "runtime"
        / "hotpath" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    directory = build.nvtx_include_dir()
    if directory is None:
        raise FileNotFoundError(
            "nvtx3/nvToolsExt.h not found; install the nvidia-nvtx wheel (pip install nvidia-nvtx)")
    return directory


def build_injection_library() -> Path:
    """Compile the recorder into ``tests/_build/`` unless it is up to date.

    Safe with concurrent pytest processes: each compiles to a private temporary
    name and atomically renames it into place.
    """
    if LIBRARY.exists() and LIBRARY.stat().st_mtime >= SOURCE.stat().st_mtime:
        return LIBRARY
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    tmp = str(BUILD_DIR / f".{LIBRARY.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    cmd = [
        os.environ.get("CC", "gcc"),
        "-shared",
        "-fPIC",
        "-O2",
        "-pthread",
        "-Wall",
        f"-I{nvtx_include_dir()}",
        "-o",
        tmp,
        str(SOURCE),
    ]
    try:
        result = subprocess.run(cmd, check=False, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(
                f"building the NVTX recorder failed: {' '.join(cmd)}\n{result.stderr}"
            )
        os.replace(tmp, LIBRARY)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return LIBRARY


def nvtx_env(record_file: os.PathLike | str) -> dict[str, str]:
    """Environment variables that make a new process record its NVTX calls."""
    return {
        "NVTX_INJECTION64_PATH": str(build_injection_library()),
        "NVTX_RECORD_FILE": str(record_file),
    }


# --------------------------------------------------------------------------
# Reading records
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class NvtxEvent:
    """One recorded NVTX call.

    ``color`` is ``0xAARRGGBB`` or None (no ARGB color).  ``id`` is the range
    id for start/end, the named OS thread id for threadname, else None.
    """

    event: str
    pid: int
    tid: int
    domain: str
    text: str
    color: int | None
    category: int
    id: int | None = None


_UNESCAPE = {"\\\\": "\\", "\\t": "\t", "\\n": "\n", "\\r": "\r"}


def _unescape(field: str) -> str:
    return re.sub(r"\\[\\tnr]", lambda m: _UNESCAPE[m.group()], field)


def _parse(line: str) -> NvtxEvent:
    event, pid, tid, domain, text, color, category, ident = line.rstrip("\n").split(
        "\t"
    )
    assert event in EVENTS, f"unknown NVTX record {line!r}"
    return NvtxEvent(
        event=event,
        pid=int(pid),
        tid=int(tid),
        domain=_unescape(domain),
        text=_unescape(text),
        color=None if color == "-" else int(color, 16),
        category=int(category),
        id=None if ident == "-" else int(ident),
    )


def read_events(path_or_glob: os.PathLike | str) -> list[NvtxEvent]:
    """Events of a record file, or of all files matching a glob pattern.

    Files are read in sorted name order; each file in recording order.  A
    missing plain file gives no events (the process made no NVTX call).
    """
    pattern = str(path_or_glob)
    paths = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
    events = []
    for path in paths:
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                events += [_parse(line) for line in f if line.strip()]
    return events


# --------------------------------------------------------------------------
# Reconstructing ranges
# --------------------------------------------------------------------------


#: Garbage collections become ranges wherever one happens to run (``gc gen N``).
GC_PREFIX = "gc gen "


def ranges_by_thread(
    events: list[NvtxEvent],
    domain: str | None = None,
    *,
    allow_open: bool = False,
    keep_gc: bool = False,
) -> dict[tuple[int, int], list[tuple[int, str, int | None]]]:
    """Rebuild push/pop nesting: ``{(pid, tid): [(depth, text, color), ...]}``.

    Ranges are listed in push order, depth 0 being the outermost.  As in NVTX,
    each domain has its own stack per thread; pass ``domain`` ("" for the
    default domain) to look at one domain only.  Raises AssertionError for a
    pop without a matching push, and for ranges left open unless
    ``allow_open`` (open ranges are then left out).  Garbage collection ranges
    (``gc gen N``), which appear wherever the collector happens to run, are
    checked for balance like every range but left out of the result (and of
    the depth of what nests in them) unless ``keep_gc``.
    """
    result: dict[tuple[int, int], list] = defaultdict(list)
    stacks: dict[tuple[int, int, str], list[int]] = defaultdict(list)
    for ev in events:
        if ev.event not in ("push", "pop") or (
            domain is not None and ev.domain != domain
        ):
            continue
        thread = (ev.pid, ev.tid)
        stack = stacks[(ev.pid, ev.tid, ev.domain)]
        if ev.event == "push":
            hidden = not keep_gc and ev.text.startswith(GC_PREFIX)
            depth = sum(1 for i in stack if not result[thread][i][4])
            stack.append(len(result[thread]))
            result[thread].append([depth, ev.text, ev.color, False, hidden])
        else:
            assert stack, f"pop without push in domain {ev.domain!r} on thread {thread}"
            result[thread][stack.pop()][3] = True
    still_open = {
        key: [result[key[:2]][i][1] for i in stack]
        for key, stack in stacks.items()
        if stack
    }
    assert allow_open or not still_open, (
        f"ranges left open (pid, tid, domain): {still_open}"
    )
    return {
        thread: [
            (depth, text, color)
            for depth, text, color, closed, hidden in ranges
            if closed and not hidden
        ]
        for thread, ranges in result.items()
    }


def tree(
    events: list[NvtxEvent],
    domain: str | None = None,
    *,
    thread: tuple[int, int] | None = None,
    allow_open: bool = False,
) -> list[str]:
    """The ranges of one thread as indented lines, ``"  " * depth + text``.

    ``thread`` is a ``(pid, tid)``; it may be omitted when at most one thread
    has ranges.
    """
    ranges = ranges_by_thread(events, domain, allow_open=allow_open)
    if thread is None:
        assert len(ranges) <= 1, (
            f"ranges on several threads {sorted(ranges)}; pass thread="
        )
        thread = next(iter(ranges), None)
    return ["  " * depth + text for depth, text, _ in ranges.get(thread, [])]
