"""Shared test helpers: run Python in a fresh subprocess with the agent and NVTX recording.

Every test that checks what a profiler would see runs the program in a real
subprocess: NVTX decides at its first call whether to load the injection
library, and the agent activates at interpreter start-up.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from nvtx_tool import NvtxEvent, build_injection_library, nvtx_env, read_events, tree

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
#: The programs the tests run, one file each (``program(name)`` reads one).
PROGRAMS = Path(__file__).resolve().parent / "programs"
#: examples/train_mnist_synthetic.py's arguments for a short run (two iterations).
TRAINER_ARGS = ["--samples", "20", "--batchsize", "10", "--epoch", "1", "--unit", "5"]
#: The training steps of programs/children_*.py: in the parent, and in each child.
PARENT_STEPS = 3
CHILD_STEPS = 4


#: The hot path's implementation under test (see conftest.py), every subprocess's default.
ENV_TEST_NATIVE = "CHAINER_AUTOPROF_TEST_NATIVE"
#: Errors of the agent's own that its reports contain are raised under the tests (conftest.py).
ENV_TEST_STRICT = "CHAINER_AUTOPROF_TEST_STRICT"


def clean_env(**extra: str) -> dict[str, str]:
    """The current environment without any CHAINER_PROF_* or NVTX variables, plus ``extra``.

    The implementation of the hot path under test stays (``CHAINER_AUTOPROF_TEST_NATIVE``),
    and so does the strict mode of the tests (``CHAINER_AUTOPROF_TEST_STRICT``).
    """
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CHAINER_PROF_", "_CHAINER_PROF_", "NVTX_", "CHAINER_AUTOPROF_"))}
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + path if path else "")
    env[ENV_TEST_NATIVE] = os.environ.get(ENV_TEST_NATIVE, "1")
    env[ENV_TEST_STRICT] = os.environ.get(ENV_TEST_STRICT, "1")
    env.update(extra)
    return env


def native_under_test() -> bool:
    """Whether this run tests the native hot path (else the pure-Python one).

    Inside a test that takes the ``twin`` fixture (conftest.py): whether that test's turn is
    the native one.
    """
    return os.environ.get(ENV_TEST_NATIVE, "1") == "1"


def twins() -> tuple[str, ...]:
    """The hot paths the twin-sensitive tests run on, each in turn (conftest.py): both in a
    native run, the pure-Python one alone under ``CHAINER_AUTOPROF_TEST_NATIVE=0``."""
    return ("native", "python") if native_under_test() else ("python",)


def twin_env(twin: str) -> dict[str, str]:
    """The environment that makes a subprocess's agent take hot path ``twin`` by default."""
    return {ENV_TEST_NATIVE: "1" if twin == "native" else "0"}


@dataclass
class Run:
    """A finished subprocess and what it recorded."""

    proc: subprocess.CompletedProcess
    tmp: Path
    events: list[NvtxEvent] = field(default_factory=list)

    @property
    def stdout(self) -> str:
        return self.proc.stdout

    @property
    def stderr(self) -> str:
        return self.proc.stderr

    @property
    def returncode(self) -> int:
        return self.proc.returncode

    def tree(self, domain: str = "chainer", **kw) -> list[str]:
        return tree(self.events, domain=domain, **kw)

    def sync_log(self) -> list[str]:
        lines: list[str] = []
        for path in sorted(self.tmp.glob("device.*.log")):
            lines += path.read_text().splitlines()
        return lines


#: What the exit's guards print when the summary or the trace could not be made.
BROKEN_REPORT = "chainer_autoprof: no summary"


def run_python(tmp: Path, args: list[str], env: dict[str, str] | None = None,
               nvtx: bool = True, count_device: bool = True, cwd: Path | None = None,
               timeout: float = 240, check: bool = False) -> Run:
    """Run ``python ARGS`` with the NVTX recorder and the counting device backend."""
    run_env = clean_env()
    if nvtx:
        build_injection_library()
        run_env.update(nvtx_env(tmp / "nvtx.%p.tsv"))
    if count_device:
        run_env["CHAINER_AUTOPROF_TEST_DEVICE"] = "counting"
        run_env["CHAINER_AUTOPROF_TEST_DEVICE_LOG"] = str(tmp / "device.%p.log")
    run_env.update(env or {})
    proc = subprocess.run([sys.executable, *args], env=run_env, cwd=cwd or tmp,
                          capture_output=True, text=True, timeout=timeout)
    run = Run(proc, tmp, read_events(tmp / "nvtx.*.tsv") if nvtx else [])
    if run_env.get(ENV_TEST_STRICT) == "1":
        # strict: a check that raised ended the report early (the exit's guard keeps the
        # program going with this one line); it fails the test that ran it
        broken = [line for line in proc.stderr.splitlines() if line.startswith(BROKEN_REPORT)]
        if broken:
            raise AssertionError(f"the agent's report failed: {broken[0]}\nstderr:\n"
                                 f"{proc.stderr}")
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\n"
                             f"stderr:\n{proc.stderr}")
    return run


#: A line of a program file that stands for another program file's whole text (the part
#: several programs share, kept once).
INCLUDE = re.compile(r"^# include: (\S+)\n", re.M)


def program(name: str) -> str:
    """The text of ``tests/programs/NAME`` (``.py`` unless ``name`` has a suffix of its own),
    each ``# include: OTHER`` line replaced by OTHER's text."""
    text = (PROGRAMS / (name if "." in name else name + ".py")).read_text()
    return INCLUDE.sub(lambda m: program(m.group(1)), text)


def write_script(tmp: Path, name: str, source: str) -> Path:
    """Write a dedented script into ``tmp`` and return its path."""
    path = tmp / name
    path.write_text(textwrap.dedent(source))
    return path


def run_with_agent(tmp: Path, source: str, settings: dict[str, str] | None = None,
                   script_args: tuple[str, ...] = (), **kw) -> Run:
    """Run ``source`` as a script with the agent activated from the environment."""
    script = write_script(tmp, "script.py", source)
    env = {"CHAINER_PROF_ENABLE": "1", "CHAINER_PROF_SUMMARY": "0"}
    env.update(settings or {})
    env.update(kw.pop("env", {}) or {})
    boot = ("import chainer_autoprof, runpy, sys; chainer_autoprof.install(); "
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
    return run_python(tmp, ["-c", boot, str(script), *script_args], env=env, **kw)
