"""How the native hot path is built: one description for ``setup.py`` and in-place builds.

``setup.py`` builds ``_native`` as an optional extension (a failure leaves the
pure-Python implementation, with one line saying why); the tests and the
benchmarks run the package from the checkout and build it there with
:func:`build_in_place`.  Nothing here is imported at run time, and nothing of
the package: ``setup.py`` loads this file by its path.

The C files (:data:`SOURCES`, one per concern, with ``native.h``) are compiled
together into one module; the protocol's version, defined in ``protocol.py``
alone, is handed to the compiler (``-DCHAINER_AUTOPROF_PROTOCOL=N``).

NVTX v3 is header-only: its headers come from the ``nvidia-nvtx`` wheel (a
build requirement), or from a CUDA toolkit.

A second, separate extension reads CUPTI's activity buffers in C
(``chainer_autoprof/runtime/cupti_native.c`` -> :data:`CUPTI_MODULE`): built against
CUPTI's headers (the ``nvidia-cuda-cupti`` wheel, with ``cuda.h`` and its includes from
``nvidia-cuda-runtime`` and ``nvidia-cuda-crt``; or a CUDA toolkit), it loads libcupti
itself at run time (dlopen), so it builds and imports on a machine without a GPU.  Where
it cannot be built, GPU activity reads CUPTI through cupti-python instead.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
#: The C files of the extension, compiled together (``module.c`` holds its init).
SOURCES = tuple(HERE / name for name in ("module.c", "util.c", "core.c", "nvtx_domain.c",
                                         "record.c", "wrappers.c", "term_guard.c"))
#: What they include of ours.
HEADERS = (HERE / "native.h",)
#: Where the protocol's version is defined (and nowhere else).
PROTOCOL_FILE = HERE / "protocol.py"
MODULE = "chainer_autoprof.runtime.hotpath._native"
#: Compiler flags beyond the platform's own for extensions: every warning of ``-Wall
#: -Wextra`` is on (a user's build keeps going with them; CI's fails, :func:`compile_to`).
EXTRA_COMPILE_ARGS = ["-O2", "-std=gnu11", "-Wall", "-Wextra"]
LIBRARIES = ["dl"]  # NVTX loads the tool with dlopen


#: The CUPTI reader: its C file and module (an extension of its own, see the docstring).
CUPTI_SOURCES = (HERE.parent / "cupti_native.c", HERE.parent / "cupti_locate.c")
CUPTI_MODULE = "chainer_autoprof.runtime._cupti"
#: The header the reader's sources share.
CUPTI_OWN_HEADER = HERE.parent / "cupti_locate.h"
#: The calls that put work on a stream (kernels, copies, memsets, graphs), by the prefix of
#: CUPTI's callback names, per domain and the header naming them: the only API records GPU
#: activity needs where it asks CUPTI for no others (``CHAINER_AUTOPROF_CUPTI_CALLS``).
LAUNCH_CALLS = {
    "RUNTIME": ("cupti_runtime_cbid.h", ("cudaLaunch", "cudaMemcpy", "cudaMemset",
                                         "cudaGraphLaunch")),
    "DRIVER": ("cupti_driver_cbid.h", ("cuLaunch", "cuMemcpy", "cuMemset", "cuGraphLaunch")),
}
#: What ``cupti_native.c`` includes, and from where.
CUPTI_HEADERS = ("cupti_activity.h", "cuda.h", "builtin_types.h", "crt/host_defines.h")


class BuildError(RuntimeError):
    """The extension could not be built; ``str(err)`` is one line saying why."""


def _include_candidates(*cuda_subdirs: str) -> list[Path]:
    """Where headers may be, in order: the nvidia wheels' include dirs, then under CUDA_HOME
    (or CUDA_PATH) and /usr/local/cuda each of ``cuda_subdirs``."""
    candidates: list[Path] = []
    for key in ("purelib", "platlib"):
        candidates += sorted(Path(sysconfig.get_paths()[key]).glob("nvidia/*/include"))
    for entry in sys.path:
        candidates += sorted(Path(entry or ".").glob("nvidia/*/include"))
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    for root in ([Path(cuda_home)] if cuda_home else []) + [Path("/usr/local/cuda")]:
        candidates += [root / sub for sub in cuda_subdirs]
    return candidates


def nvtx_include_dir() -> Path | None:
    """The directory holding ``nvtx3/nvToolsExt.h`` (the nvidia-nvtx wheel, else CUDA)."""
    for directory in _include_candidates("include"):
        if (directory / "nvtx3" / "nvToolsExt.h").is_file():
            return directory
    return None


def cupti_include_dirs() -> list[Path] | None:
    """Directories holding :data:`CUPTI_HEADERS` (the nvidia wheels, else CUDA), or None."""
    candidates = _include_candidates("include", "extras/CUPTI/include")
    found: list[Path] = []
    for header in CUPTI_HEADERS:
        where = next((d for d in candidates if (d / header).is_file()), None)
        if where is None:
            return None
        if where not in found:
            found.append(where)
    return found


def protocol_version() -> int:
    """``PROTOCOL`` of ``protocol.py``, read from its text (the package is not imported)."""
    found = re.search(r"^PROTOCOL = (\d+)$", PROTOCOL_FILE.read_text(encoding="utf-8"), re.M)
    if found is None:
        raise BuildError(f"no PROTOCOL = N line in {PROTOCOL_FILE}")
    return int(found.group(1))


def defines() -> list[str]:
    """The compiler's ``-D`` flags."""
    return [f"-DCHAINER_AUTOPROF_PROTOCOL={protocol_version()}"]


def target() -> Path:
    """Where the in-place build goes (next to the source, this Python's suffix)."""
    return HERE / ("_native" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))


def is_stale(path: Path | None = None) -> bool:
    """Whether the build at ``path`` is missing or older than a file it is made from."""
    path = path or target()
    if not path.exists():
        return True
    built = path.stat().st_mtime
    return any(built < f.stat().st_mtime for f in (*SOURCES, *HEADERS, PROTOCOL_FILE))


def cupti_target() -> Path:
    """Where the CUPTI reader's in-place build goes."""
    return HERE.parent / ("_cupti" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))


def build_cupti_in_place(force: bool = False) -> Path:
    """Compile the CUPTI reader next to its source unless up to date; raises
    :class:`BuildError`."""
    out = cupti_target()
    if force or not out.exists() or any(
            out.stat().st_mtime < f.stat().st_mtime
            for f in (*CUPTI_SOURCES, CUPTI_OWN_HEADER, Path(__file__))):
        compile_cupti_to(out)
    return out


def compile_cupti_to(out: Path, *, warnings_fail: bool = False) -> None:
    """Compile the CUPTI reader into ``out``; raises :class:`BuildError` (one line: why);
    ``warnings_fail`` as for :func:`compile_to`."""
    include = cupti_include_dirs()
    if include is None:
        raise BuildError("the CUPTI headers (cupti_activity.h, cuda.h) were not found: pip "
                         "install nvidia-cuda-cupti nvidia-cuda-runtime nvidia-cuda-crt")
    _compile(out, CUPTI_SOURCES, [sysconfig.get_paths()["include"], *map(str, include)],
             launch_defines(include), ["dl", "pthread"], warnings_fail)


def launch_cbids(include: list[Path]) -> dict[str, list[int]]:
    """The callback ids of the calls that put work on a stream (:data:`LAUNCH_CALLS`), by
    domain, read from the cbid headers the reader is compiled against (none where a header
    is missing)."""
    found: dict[str, list[int]] = {}
    for domain, (header, prefixes) in LAUNCH_CALLS.items():
        path = next((d / header for d in include if (d / header).is_file()), None)
        text = path.read_text(encoding="utf-8", errors="replace") if path else ""
        found[domain] = sorted({int(cbid) for name, cbid in re.findall(
            rf"CUPTI_{domain}_TRACE_CBID_(\w+)\s*=\s*(\d+)", text)
            if name.startswith(prefixes)})
    return found


def launch_defines(include: list[Path]) -> list[str]:
    """``-DLAUNCH_<DOMAIN>_CBIDS=id,id,...,`` for ``cupti_native.c``'s tables."""
    return [f"-DLAUNCH_{domain}_CBIDS=" + "".join(f"{c}," for c in ids)
            for domain, ids in launch_cbids(include).items()]


def build_in_place(force: bool = False) -> Path:
    """Compile the extension next to its sources unless up to date; raises
    :class:`BuildError`."""
    out = target()
    if force or is_stale(out):
        compile_to(out)
    return out


def compile_to(out: Path, include_dirs: tuple[str, ...] = (), *,
               warnings_fail: bool = False) -> None:
    """Compile the extension into ``out``; raises :class:`BuildError` (one line: why).

    Safe with concurrent builds: each compiles to a private name and renames
    it into place.  The compiler's own output is kept, not shown.
    ``warnings_fail``: a warning fails the build (``-Werror``; the tests' check
    of the C code), the error naming the first one.
    """
    include = nvtx_include_dir()
    if include is None:
        raise BuildError("the NVTX headers (nvtx3/nvToolsExt.h) were not found: "
                         "pip install nvidia-nvtx")
    _compile(out, SOURCES, [sysconfig.get_paths()["include"], *include_dirs, str(include)],
             defines(), LIBRARIES, warnings_fail)


def _compile(out: Path, sources: tuple[Path, ...], include_dirs: list[str], flags: list[str],
             libraries: list[str], warnings_fail: bool) -> None:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "gcc"
    out.parent.mkdir(parents=True, exist_ok=True)
    includes = [f"-I{d}" for d in include_dirs]
    with _outputs().replaced_by(str(out)) as tmp:  # renamed into place once it is whole
        cmd = [*cc.split(), "-shared", "-fPIC", *EXTRA_COMPILE_ARGS,
               *(["-Werror"] if warnings_fail else []), *flags, *includes, "-o", tmp,
               *map(str, sources), *(f"-l{lib}" for lib in libraries)]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except OSError as exc:
            raise BuildError(f"no C compiler ({cmd[0]}: {exc.strerror})") from None
        if result.returncode != 0:
            lines = result.stderr.strip().splitlines()
            first = next((line for line in lines if "error" in line),
                         lines[-1] if lines else "no output")
            raise BuildError(f"{cmd[0]} failed: {first}")


def _outputs() -> ModuleType:
    """``chainer_autoprof/common/outputs.py``, where every file the package writes is replaced:
    loaded by path, as this file is (``setup.py`` builds before the package is importable)."""
    spec = importlib.util.spec_from_file_location(
        "_chainer_autoprof_outputs", HERE.parent.parent / "common" / "outputs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
