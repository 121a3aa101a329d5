"""What the wrappers must leave as it was: bound methods, the recursion limit, tracebacks.

Bound methods of instrumented classes pickle and deepcopy as plain ones (both
implementations of the hot path).  The native one adds no Python frame: a
recursive Chain reaches the depth of the plain run, and an exception raised in
a model shows the user's frames only, wherever it is printed.  The pure-Python
one keeps one frame per wrapped call (README says so): its frames are left
out of uncaught tracebacks (launcher and environment-only), its recursion
limit is lower by what those frames take.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from site_venv import SiteVenv, make_site_venv
from streams import GRANULARITIES
from support import clean_env, native_under_test, program, run_python, write_script

PICKLE_PROGRAM = program("wrappers_pickle")


def test_bound_methods_pickle_and_deepcopy(tmp_path: Path, twin: str):
    """``pickle.dumps(model.__call__)``, deepcopy, ``Pool.map(model.__call__)``, any granularity."""
    script = write_script(tmp_path, "bound.py", PICKLE_PROGRAM)
    run = run_python(tmp_path, [str(script), *GRANULARITIES], nvtx=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [f"{g} 12 of 12" for g in GRANULARITIES]
    assert run.stderr == ""


RECURSION_PROGRAM = program("wrappers_recursion")


def test_recursion_limit(tmp_path: Path, twin: str):
    """A Chain calling itself reaches the plain run's depth (native); one frame less a level
    in the pure-Python path."""
    script = write_script(tmp_path, "recursion.py", RECURSION_PROGRAM)
    run = run_python(tmp_path, [str(script), *GRANULARITIES], nvtx=False)
    assert run.returncode == 0, run.stderr
    plain, *agent = (int(n) for n in run.stdout.split())
    assert plain > 100
    if twin == "native":
        assert agent == [plain] * len(GRANULARITIES)
    else:  # each level: Link.__call__ and forward, plus the wrapper's frame
        assert all(plain * 0.6 <= depth < plain for depth in agent), (plain, agent)


FORWARD_ERROR = program("wrappers_forward_error")

HOW = ("call", "lossfun", "trainer")


def _last_traceback(stderr: str) -> str:
    return "Traceback (most recent call last):" + stderr.rsplit(
        "Traceback (most recent call last):", 1)[-1]


def _frames(text: str) -> list[str]:
    return re.findall(r'^  File "([^"]+)", line \d+, in (\S+)', text, re.M)


def _compare(got: subprocess.CompletedProcess, plain: subprocess.CompletedProcess) -> None:
    assert got.returncode == plain.returncode == 1, got.stderr
    assert plain.stderr.count("ValueError: bad forward")
    if native_under_test():  # no frame of ours anywhere: the same output, byte for byte
        assert got.stderr == plain.stderr
        assert "chainer_autoprof" not in got.stderr
    else:  # the uncaught traceback as printed at the end (Chainer's own print_tb keeps ours)
        assert _last_traceback(got.stderr) == _last_traceback(plain.stderr)
    assert not [f for f in _frames(_last_traceback(got.stderr)) if "chainer_autoprof" in f[0]]


@pytest.mark.parametrize("how", HOW)
def test_no_frame_of_ours_under_the_launcher(tmp_path: Path, how: str, twin: str):
    script = write_script(tmp_path, "broken.py", FORWARD_ERROR)
    plain = run_python(tmp_path, [str(script), how], nvtx=False)
    got = run_python(tmp_path, ["-m", "chainer_autoprof", "--summary", "0",
                                "--granularity", "function", str(script), how], nvtx=False)
    _compare(got, plain)


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> SiteVenv:
    return make_site_venv(tmp_path_factory.mktemp("wrappers") / "venv")


@pytest.mark.parametrize("how", HOW)
def test_no_frame_of_ours_environment_only(venv: SiteVenv, tmp_path: Path, how: str,
                                           twin: str):
    script = tmp_path / "broken.py"
    script.write_text(textwrap.dedent(FORWARD_ERROR))
    plain = venv.run([str(script), how], cwd=tmp_path)
    got = venv.run([str(script), how], cwd=tmp_path,
                   env=venv.env(CHAINER_PROF_SUMMARY="0", CHAINER_PROF_GRANULARITY="link"))
    _compare(got, plain)


def test_launcher_environment_has_the_agent(tmp_path: Path, twin: str):
    """The runs above are profiled runs: the agent was on (its status report says which path)."""
    script = write_script(tmp_path, "broken.py", FORWARD_ERROR)
    proc = subprocess.run([sys.executable, "-m", "chainer_autoprof", "--status", "--summary",
                           "0", str(script), "call"], env=clean_env(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    assert f"hot path: {twin}" in proc.stderr


ODD_CALLS_PROGRAM = program("wrappers_odd_calls")
#: The links of that program whose ``__call__`` is a partialmethod, a callable object, a
#: staticmethod, a classmethod, a descriptor of its own, a functools.partial, a property.
ODD_LINKS = ("scaled", "plain", "static", "by_class", "described", "partial", "proper")


@pytest.mark.parametrize("when", ("launcher", "install"))
def test_links_whose_call_is_no_function_are_profiled(tmp_path: Path, twin: str, when: str):
    """A Link subclass whose ``__call__`` is a functools.partialmethod (or any callable that
    is no plain function) is profiled like any link, defined after the agent wrapped Link or
    before: the same results as without the agent, no hook turned off, a forward phase."""
    script = write_script(tmp_path, "odd.py", ODD_CALLS_PROGRAM)
    trace = tmp_path / "t.json"
    plain = run_python(tmp_path, [str(script)], nvtx=False, check=True)
    if when == "launcher":
        run = run_python(tmp_path, ["-m", "chainer_autoprof", "--summary", "0", "--granularity",
                                    "link", "--trace", str(trace), str(script)], nvtx=False,
                         check=True)
    else:
        run = run_python(tmp_path, [str(script), "install", str(trace)], nvtx=False, check=True)
    assert run.stdout == plain.stdout
    assert run.stderr == ""
    events = [ev for ev in json.loads(trace.read_text())["traceEvents"] if ev.get("ph") == "X"]
    links = {ev["name"].split(" (")[0] for ev in events if ev["cat"] == "link"}
    assert {f"predictor/{name}" for name in ODD_LINKS} <= links
    forward = [ev for ev in events if ev["name"] == "forward"]
    assert len(forward) == 8 and all(ev["dur"] > 0 for ev in forward)
