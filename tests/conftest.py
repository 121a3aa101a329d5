"""Shared pytest configuration: the hot path's implementation under test.

The suite runs against one implementation of the hot path, named by
``CHAINER_AUTOPROF_TEST_NATIVE`` (``1``, the default: the native extension;
``0``: the pure-Python one), which :mod:`support` passes to every subprocess
as the agent's default.  In a native run the extension is built in place in
the checkout when missing or stale (the tests run the package from the
checkout), and the session fails at once if it cannot be used: never a
silent fall back to Python.
"""

import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, settings
from support import REPO, clean_env

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


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and CuPy")
    # a check of the verdict or the advice, or a summary section, that raises fails the tests
    # (in a user's run it is left out with one line); subprocesses inherit it (support.py)
    os.environ.setdefault(log.ENV_TEST_STRICT, "1")
    mode = os.environ.setdefault(hotpath.ENV_TEST_NATIVE, "1")
    if mode not in ("0", "1"):
        pytest.exit(f"{hotpath.ENV_TEST_NATIVE}={mode!r}: accepted 0 or 1", returncode=2)
    if mode == "1":
        try:
            build.build_in_place()
        except build.BuildError as exc:
            pytest.exit(f"native hot path under test, but it cannot be built: {exc}",
                        returncode=1)
        check = subprocess.run(
            [sys.executable, "-c", "from chainer_autoprof.runtime import hotpath; "
             "hotpath.load_native()"], env=clean_env(), cwd=REPO, capture_output=True,
            text=True)
        if check.returncode != 0:
            pytest.exit("native hot path under test, but it cannot be imported: "
                        + (check.stderr.strip().splitlines() or ["?"])[-1], returncode=1)


def pytest_report_header(config):
    mode = os.environ.get(hotpath.ENV_TEST_NATIVE, "1")
    return f"hot path under test: {'native' if mode == '1' else 'python'} " \
           f"({hotpath.ENV_TEST_NATIVE}={mode})"
