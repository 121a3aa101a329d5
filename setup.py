"""Packaging for chainer_autoprof.

Besides the package and the ``chainer-autoprof`` console script, the
distribution holds the native hot path (the C files of
``chainer_autoprof/runtime/hotpath/``, compiled together into one extension as
described in ``.../hotpath/build.py``; a failed build leaves the pure-Python
implementation, with one line saying why, never a failed install) and puts
``chainer_autoprof.pth`` into site-packages: its one line activates the agent
at interpreter start-up wherever a ``CHAINER_PROF_*`` variable is set (and
only checks ``os.environ`` elsewhere).  The ``build_pth``
command below places it for both kinds of install: into the build tree (so it
lands at the root of the wheel, next to the package) for ``pip install .``,
and into the editable wheel for ``pip install -e .``.
"""

import importlib.util
import os
import re
import sys
from pathlib import Path

from setuptools import Command, Extension, find_namespace_packages, setup
from setuptools.command.build import build
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
PTH = "chainer_autoprof.pth"


def read(name: str) -> str:
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        return f.read()


def version() -> str:
    match = re.search(r'^__version__ = "([^"]+)"', read("chainer_autoprof/common/version.py"),
                      re.M)
    if match is None:
        raise RuntimeError("no __version__ in chainer_autoprof/common/version.py")
    return match.group(1)


class build_pth(Command):  # noqa: N801 - setuptools command names are lower case
    """Copy chainer_autoprof.pth to where the install puts it into site-packages."""

    description = "place chainer_autoprof.pth (start-up activation) beside the package"
    user_options = []

    def initialize_options(self) -> None:
        self.build_lib = None
        self.editable_mode = False  # set by setuptools' editable_wheel (PEP 660 installs)
        self.outputs = []

    def finalize_options(self) -> None:
        self.set_undefined_options("build", ("build_lib", "build_lib"))

    def run(self) -> None:
        if self.editable_mode:
            # An editable wheel is made of what lies in install_lib (the wheel's tree);
            # build_lib is a scratch directory there.
            target = self.get_finalized_command("install").install_lib
        else:
            target = self.build_lib
        self.mkpath(target)
        dest = os.path.join(target, PTH)
        self.copy_file(os.path.join(HERE, PTH), dest)
        self.outputs = [] if self.editable_mode else [dest]

    def get_outputs(self) -> list:
        return self.outputs

    def get_source_files(self) -> list:
        return [PTH]


class build_with_pth(build):  # noqa: N801
    sub_commands = [*build.sub_commands, ("build_pth", None)]


def _native_build():
    """``chainer_autoprof/runtime/hotpath/build.py``, loaded by path (the package is not
    importable while it is being built)."""
    path = os.path.join(HERE, "chainer_autoprof", "runtime", "hotpath", "build.py")
    spec = importlib.util.spec_from_file_location("_chainer_autoprof_native_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class optional_build_ext(build_ext):  # noqa: N801
    """Build the native hot path and the native CUPTI reader; where one cannot be built,
    say why in one line and go on."""

    def build_extension(self, ext) -> None:
        out = Path(self.get_ext_fullpath(ext.name))
        native = _native_build()
        cupti = ext.name == native.CUPTI_MODULE
        try:
            if cupti:
                native.compile_cupti_to(out)
            else:
                native.compile_to(out)
        except Exception as exc:  # BuildError, or anything else: never a failed install  # noqa: BLE001
            if out.exists():
                out.unlink()  # a stale one from an earlier build must not be installed
            what = ("native CUPTI reader not built ({}); GPU activity will read CUPTI through "
                    "cupti-python" if cupti else
                    "native hot path not built ({}); the pure-Python one will run")
            sys.stderr.write(f"chainer_autoprof: {what.format(exc)}\n")


def _native_extension() -> Extension:
    """The native hot path: its C files and headers, as ``build.py`` lists them."""
    native = _native_build()

    def relative(path: Path) -> str:
        return path.relative_to(Path(HERE).resolve()).as_posix()

    return Extension(native.MODULE, [relative(p) for p in native.SOURCES],
                     depends=[relative(p) for p in (*native.HEADERS, native.PROTOCOL_FILE)],
                     optional=True)


def _cupti_extension() -> Extension:
    """The native CUPTI reader (``chainer_autoprof/runtime/cupti_native.c``)."""
    native = _native_build()
    return Extension(native.CUPTI_MODULE, [Path(p).resolve().relative_to(Path(HERE).resolve())
                                           .as_posix() for p in native.CUPTI_SOURCES],
                     optional=True)


setup(
    name="chainer-autoprof",
    version=version(),
    description="Zero-code profiling agent for Chainer: NVTX ranges, GPU sync and a time summary",
    long_description=read("README.md"),
    long_description_content_type="text/markdown",
    # Namespace-style subpackages (no __init__.py) included too.
    packages=find_namespace_packages(include=["chainer_autoprof", "chainer_autoprof.*"],
                                     exclude=["*.__pycache__"]),
    include_package_data=True,
    ext_modules=[_native_extension(), _cupti_extension()],
    # Chainer 7.8.1 imports numpy.distutils, which numpy has no more for Python 3.12.
    python_requires=">=3.8,<3.12",
    install_requires=[
        "chainer>=7,<8",
        "numpy<2",  # Chainer 7 uses NumPy 1 APIs
        "setuptools<81",  # Chainer 7 imports pkg_resources at run time (gone in setuptools 81)
        "wrapt>=2.4,<3",  # handle-based unwrap_object / is_wrapped_by
        "nvtx>=0.2.12,<0.3",  # DummyDomain, Domain.get_event_attributes, push_range(attrs, domain)
    ],
    extras_require={
        # CuPy for CUDA 12 (Chainer 7 asks for CuPy 7; newer ones warn about the mismatch).
        "gpu": ["cupy-cuda12x"],
        # CUPTI for Python: GPU activity (CHAINER_PROF_GPU_ACTIVITY=1).  13.x fits CUDA 13;
        # for CUDA 12 install cupti-python 12.6 or 12.8 (README, "GPU time per link").
        "cupti": ["cupti-python>=12.6"],
        "test": [
            "pytest>=7",
            "ruff>=0.17,<0.18",
            # the package's types ([tool.mypy] in pyproject.toml; mypy 2 runs on Python 3.10+)
            "mypy==2.4.1; python_version >= '3.10'",
            "nvidia-nvtx>=13",  # NVTX headers the tests' NVTX recorder is compiled against
            # CUPTI's headers (and cuda.h's) the tests' libcupti is compiled against
            "nvidia-cuda-cupti>=13", "nvidia-cuda-runtime>=13", "nvidia-cuda-crt>=13",
            "mpi4py>=4",  # MPI tests (they skip where no MPI runtime is installed)
            "hypothesis>=6.100,<7",  # property-based tests of the state machine and the readers
            # the layers contract (tests/test_layers.py; exhaustive layers need a recent one)
            "import-linter>=2.16,<3; python_version >= '3.11'",
            # reads the GPU timeline of a trace as a PyTorch profiler trace
            # (tests/test_gpu_trace.py); it pulls in jupyterlab, which its analyses never import
            "holistictraceanalysis==0.5.0; python_version >= '3.11'",
        ],
    },
    entry_points={"console_scripts": ["chainer-autoprof = chainer_autoprof.cli:main"]},
    cmdclass={"build": build_with_pth, "build_pth": build_pth, "build_ext": optional_build_ext},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Development Status :: 4 - Beta",
        "Environment :: GPU :: NVIDIA CUDA",
        "Intended Audience :: Science/Research",
        "Topic :: Software Development :: Testing",
        "Topic :: System :: Benchmark",
    ],
    zip_safe=False,
)
