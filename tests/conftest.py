"""Shared pytest configuration: the hot path's implementations under test.

The suite runs against one implementation of the hot path, named by
``CHAINER_AUTOPROF_TEST_NATIVE`` (``1``, the default: the native extension;
``0``: the pure-Python one), which :mod:`support` passes to every subprocess
as the agent's default.  In a native run the extension is built in place in
the checkout when missing or stale (the tests run the package from the
checkout), and the session fails at once if it cannot be used: never a
silent fall back to Python.

The tests whose point is the hot path's own behaviour (its NVTX stream, the
ranges and waits it records, what its wrappers leave as it was) run on both
implementations in one plain ``pytest`` run: they take the ``twin`` fixture
(``implementation`` in-process), or parametrize their module's fixture over
:func:`support.twins`, and run once per hot path, ``[native]`` and
``[python]``.  Under ``CHAINER_AUTOPROF_TEST_NATIVE=0`` (CI's second pass,
the run for a machine that cannot build C) only ``[python]`` runs, and the
tests that compare the two (``native_module``) skip.  The rest of the suite
runs once, on the hot path under test.

The tests that depend on the hot path carry the ``hotpath`` mark: those
taking ``twin`` (or ``implementation``), those on a fixture parametrized over
:func:`support.twins` (marked here, at collection), and those marked by hand.
CI's pure-Python pass runs those alone (``-m hotpath``): the rest does not
depend on which hot path runs, and ran in the native pass.
tests/test_tests_layout.py keeps the mark honest: a test that reads which hot
path is under test (``native_under_test``, ``twin_env``, ...) carries it.
"""

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, settings
from support import REPO, clean_env, native_under_test, program, twin_env, twins, write_script

from chainer_autoprof.common import log
from chainer_autoprof.runtime import hotpath
from chainer_autoprof.runtime.hotpath import build

# Property-based tests: in CI a fixed, modest number of examples, the same on every machine
# (derandomized); ``--hypothesis-profile explore`` searches far more, at random.
_COMMON = {"deadline": None, "database": None,
           "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}
settings.register_profile("ci", max_examples=60, derandomize=True, **_COMMON)
settings.register_profile("explore", max_examples=3000, **_COMMON)
settings.load_profile("ci")

#: Whether this session tests the native hot path (set once at start; a ``twin`` test's turn
#: changes the environment, not this).
_NATIVE_RUN = native_under_test()


#: The mark of the tests that depend on the hot path (CI's pure-Python pass runs them alone).
HOTPATH = "hotpath"


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and CuPy")
    config.addinivalue_line("markers", f"{HOTPATH}: depends on the hot path's implementation "
                                       "(runs in the pure-Python pass too)")
    # a check of the verdict or the advice, or a summary section, that raises fails the tests
    # (in a user's run it is left out with one line); subprocesses inherit it (support.py)
    os.environ.setdefault(log.ENV_TEST_STRICT, "1")
    mode = os.environ.setdefault(hotpath.ENV_TEST_NATIVE, "1")
    if mode not in ("0", "1"):
        pytest.exit(f"{hotpath.ENV_TEST_NATIVE}={mode!r}: accepted 0 or 1", returncode=2)
    global _NATIVE_RUN
    _NATIVE_RUN = mode == "1"
    if mode == "0":  # the Python hot path under test; SIGTERM's guard is still native
        try:
            build.build_in_place()
        except build.BuildError:
            pass  # without it SIGTERM kills as it would: the tests that need it say so
    if mode == "1":
        try:
            build.build_in_place()
        except build.BuildError as exc:
            pytest.exit(f"native hot path under test, but it cannot be built: {exc}",
                        returncode=1)
        try:  # the native CUPTI reader: its headers come with the test extra
            build.build_cupti_in_place()
        except build.BuildError as exc:
            pytest.exit(f"native CUPTI reader under test, but it cannot be built: {exc}",
                        returncode=1)
        check = subprocess.run(
            [sys.executable, "-c", "from chainer_autoprof.runtime import hotpath; "
             "hotpath.load_native()"], env=clean_env(), cwd=REPO, capture_output=True,
            text=True)
        if check.returncode != 0:
            pytest.exit("native hot path under test, but it cannot be imported: "
                        + (check.stderr.strip().splitlines() or ["?"])[-1], returncode=1)


def on_the_twins(item: pytest.Item) -> bool:
    """Whether ``item`` runs once per hot path: it takes ``twin``, or a fixture parametrized
    over :func:`support.twins`."""
    if "twin" in getattr(item, "fixturenames", ()):
        return True
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(d[-1].params is not None and tuple(d[-1].params) == twins() for d in defs)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects
def pytest_collection_modifyitems(config, items):
    for item in items:
        if on_the_twins(item):
            item.add_marker(HOTPATH)


def pytest_report_header(config):
    mode = os.environ.get(hotpath.ENV_TEST_NATIVE, "1")
    return f"hot path under test: {'native' if mode == '1' else 'python'} " \
           f"({hotpath.ENV_TEST_NATIVE}={mode})"


@pytest.fixture(scope="session")
def made_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One training run's trace, shared by the tests of output paths that only read it (each
    takes a copy)."""
    tmp = tmp_path_factory.mktemp("made")
    script = write_script(tmp, "train.py", program("output_paths_train"))
    made = subprocess.run([sys.executable, "-m", "chainer_autoprof", "--summary", "0", "--trace",
                           "t.json", str(script)], env=clean_env(), cwd=tmp,
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    return tmp / "t.json"


@pytest.fixture(scope="session")
def native_module() -> ModuleType:
    """The native implementation (built in place at the start of a native run); tests that
    need it skip where the native hot path is not under test."""
    if not _NATIVE_RUN:
        pytest.skip(f"the native hot path is not under test ({hotpath.ENV_TEST_NATIVE}=0)")
    return hotpath.load_native()


@pytest.fixture(params=twins())
def twin(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each hot path in turn (``native``, ``python``): the test's subprocesses take it as
    their default (support.clean_env), as does ``native_under_test()``."""
    for name, value in twin_env(request.param).items():
        monkeypatch.setenv(name, value)
    return request.param


@pytest.fixture
def implementation(twin: str, request: pytest.FixtureRequest) -> hotpath.Implementation:
    """The ``twin`` hot path, in-process."""
    if twin == "native":
        return hotpath.Implementation("native", request.getfixturevalue("native_module"))
    return hotpath.PYTHON
