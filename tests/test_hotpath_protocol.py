"""The hot path's protocol, its sinks' category masks, and the twin sealed in its package.

Both implementations provide what :class:`~chainer_autoprof.runtime.hotpath.protocol.HotPath`
names, checked when the extension loads (a stale or incomplete one is
reported with the reason, and the Python twin runs); the protocol's version
is defined once, in Python, and reaches the C code through the build.  Each
sink gets the ranges of the categories it asks for, in both cores: the GPU
phase timer is never called for a link or function range.  Nothing outside
``runtime/hotpath/`` branches on which implementation runs.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from support import REPO, clean_env

import chainer_autoprof
from chainer_autoprof.common import names
from chainer_autoprof.common.settings import Config
from chainer_autoprof.runtime import hotpath
from chainer_autoprof.runtime.device import CountingBackend, NullBackend
from chainer_autoprof.runtime.events import Tracer
from chainer_autoprof.runtime.hotpath import build, protocol, python
from chainer_autoprof.runtime.policies import SyncPolicy
from chainer_autoprof.sinks import gpu_phases
from chainer_autoprof.sinks.recorder import Recorder

PHASES = {names.ITERATION, *names.PHASES}


# -- the protocol --------------------------------------------------------------------------

def test_both_implementations_provide_the_protocol(native_module):
    kinds = protocol.members()
    assert {"Core", "Switch", "NvtxDomain", "RecorderHook", "around", "link_wrapper",
            "apply_wrapper", "backprop_wrapper", "switch_of", "is_wrapper", "PROTOCOL",
            "WRAPPER_FRAMES"} <= set(kinds)
    assert protocol.problems(python) == []
    assert protocol.problems(native_module) == []
    assert native_module.PROTOCOL == python.PROTOCOL == protocol.PROTOCOL
    assert native_module.WRAPPER_FRAMES is False and python.WRAPPER_FRAMES is True


def test_a_module_short_of_the_protocol_is_refused_with_the_reason():
    def module(**changes: object) -> types.ModuleType:
        fake = types.ModuleType("chainer_autoprof.runtime.hotpath._native")
        fake.__dict__.update({name: getattr(python, name) for name in protocol.members()})
        for name, value in changes.items():
            if value is None:
                delattr(fake, name)
            else:
                setattr(fake, name, value)
        return fake

    assert protocol.check(module()) is not None
    with pytest.raises(ImportError, match=r"does not implement .*\(no link_wrapper\)"):
        protocol.check(module(link_wrapper=None))
    with pytest.raises(ImportError, match="Core is a function, not a class"):
        protocol.check(module(Core=lambda *args: None))
    with pytest.raises(ImportError, match=r"the built extension is stale \(protocol 2, "
                                          rf"expected {protocol.PROTOCOL}\)"):
        protocol.check(module(PROTOCOL=2))


def test_the_protocol_version_reaches_the_c_code_from_one_place(tmp_path: Path, monkeypatch):
    """An extension built for another protocol loads, is found stale and is not used."""
    assert build.protocol_version() == protocol.PROTOCOL
    monkeypatch.setattr(build, "protocol_version", lambda: protocol.PROTOCOL - 1)
    old = tmp_path / build.target().name
    build.compile_to(old)
    program = (
        "import importlib.util, sys\n"
        "name = 'chainer_autoprof.runtime.hotpath._native'\n"
        f"spec = importlib.util.spec_from_file_location(name, {str(old)!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "sys.modules[name] = module\n"
        "from chainer_autoprof.runtime import hotpath\n"
        "print(module.PROTOCOL)\n"
        "print(hotpath.select(native=True).describe())\n")
    run = subprocess.run([sys.executable, "-c", program], env=clean_env(), cwd=REPO,
                         capture_output=True, text=True, check=True)
    version, described = run.stdout.splitlines()
    assert int(version) == protocol.PROTOCOL - 1
    assert described == ("python (native extension unavailable: ImportError: the built "
                         f"extension is stale (protocol {protocol.PROTOCOL - 1}, expected "
                         f"{protocol.PROTOCOL}))")


def test_an_in_place_build_is_stale_when_a_source_or_the_protocol_is_newer(tmp_path: Path):
    built = tmp_path / "native.so"
    built.write_bytes(b"")
    newest = max(f.stat().st_mtime for f in (*build.SOURCES, *build.HEADERS,
                                              build.PROTOCOL_FILE))
    os.utime(built, (newest + 10, newest + 10))
    assert not build.is_stale(built)
    os.utime(built, (build.PROTOCOL_FILE.stat().st_mtime - 10,) * 2)
    assert build.is_stale(built)


# -- category masks --------------------------------------------------------------------------

class Calls:
    """A sink recording what it is called for (``categories``: None is every category)."""

    def __init__(self, log: list, label: str, categories=None, fail_begin=False) -> None:
        self.log, self.label, self.fail_begin = log, label, fail_begin
        if categories is not None:
            self.categories = frozenset(categories)

    def prepare(self, info) -> None:
        pass

    def begin(self, info, ts) -> None:
        if self.fail_begin:
            raise RuntimeError("sink failed")
        self.log.append((self.label, "begin", info.name))

    def end(self, info, t0, t1, ts) -> None:
        self.log.append((self.label, "end", info.name, t0 == t1))

    def close(self, tracer) -> None:
        pass


def _tracer(impl: hotpath.Implementation, backend=None) -> Tracer:
    return Tracer(names.FUNCTION_LEVEL, SyncPolicy(0, backend or NullBackend()),
                  implementation=impl)


def test_each_sink_gets_the_ranges_of_its_categories(implementation: hotpath.Implementation):
    log: list = []
    tracer = _tracer(implementation)
    tracer.add_sink(Calls(log, "all"))
    tracer.add_sink(Calls(log, "phases", PHASES))
    tracer.add_sink(Calls(log, "links", {names.LINK}))
    ts = tracer.state()
    tracer.begin_phase(ts, names.FORWARD)  # an implicit iteration, then the phase
    link = tracer.begin(tracer.info("l1 (Linear)", names.LINK), ts)
    tracer.end(tracer.begin(tracer.info("linear.forward", names.FUNCTION), ts), ts)
    tracer.end(link, ts)
    tracer.confirm_iteration(ts)  # a step that reached its update: an iteration
    tracer.end_iteration(ts)
    seen = {label: [entry[1:3] for entry in log if entry[0] == label]
            for label in ("all", "phases", "links")}
    assert seen["all"] == [("begin", "iteration"), ("begin", "forward"),
                           ("begin", "l1 (Linear)"), ("begin", "linear.forward"),
                           ("end", "linear.forward"), ("end", "l1 (Linear)"),
                           ("end", "forward"), ("end", "iteration")]
    assert seen["phases"] == [("begin", "iteration"), ("begin", "forward"),
                              ("end", "forward"), ("end", "iteration")]
    assert seen["links"] == [("begin", "l1 (Linear)"), ("end", "l1 (Linear)")]
    # in the order the sinks were added, per range
    assert [entry[0] for entry in log[:3]] == ["all", "phases", "all"]
    tracer.forget_thread()


def test_a_failed_begin_is_undone_in_the_sinks_that_took_the_range(
        implementation: hotpath.Implementation):
    log: list = []
    tracer = _tracer(implementation)
    tracer.add_sink(Calls(log, "all"))
    tracer.add_sink(Calls(log, "links", {names.LINK}))
    tracer.add_sink(Calls(log, "failing", fail_begin=True))
    ts = tracer.state()
    with pytest.raises(RuntimeError, match="sink failed"):
        tracer.begin(tracer.info("l1 (Linear)", names.LINK), ts)
    assert log == [("all", "begin", "l1 (Linear)"), ("links", "begin", "l1 (Linear)"),
                   ("all", "end", "l1 (Linear)", True), ("links", "end", "l1 (Linear)", True)]
    log.clear()
    with pytest.raises(RuntimeError, match="sink failed"):
        tracer.begin(tracer.info("u", names.USER), ts)
    assert log == [("all", "begin", "u"), ("all", "end", "u", True)]  # links: never called
    assert ts.stack == []
    tracer.forget_thread()


def _drive(tracer: Tracer, iterations: int) -> None:
    """A training loop's ranges: iteration, phases, links and functions."""
    ts = tracer.state()
    link = tracer.info("predictor/l1 (Linear)", names.LINK)
    backward = tracer.info("predictor/l1 (Linear) backward", names.LINK_BACKWARD)
    func = tracer.info("linear.forward", names.FUNCTION)
    for _ in range(iterations):
        tracer.begin_phase(ts, names.FORWARD)
        tok = tracer.begin(link, ts)
        tracer.end(tracer.begin(func, ts), ts)
        tracer.end(tok, ts)
        tracer.end_phase(ts)
        tracer.begin_phase(ts, names.BACKWARD)
        tracer.end(tracer.begin(backward, ts), ts)
        tracer.end_phase(ts)
        tracer.begin_phase(ts, names.UPDATE)
        tracer.end_phase(ts)
        tracer.end_iteration(ts)


def test_the_gpu_phase_timer_is_never_called_for_a_link_or_function_range(
        implementation: hotpath.Implementation, monkeypatch):
    seen: list[str] = []
    timer_begin, timer_end = gpu_phases.GpuPhaseTimer.begin, gpu_phases.GpuPhaseTimer.end

    def begin(self, info, ts) -> None:
        seen.append(info.category)
        timer_begin(self, info, ts)

    def end(self, info, t0, t1, ts) -> None:
        seen.append(info.category)
        timer_end(self, info, t0, t1, ts)

    monkeypatch.setattr(gpu_phases.GpuPhaseTimer, "begin", begin)
    monkeypatch.setattr(gpu_phases.GpuPhaseTimer, "end", end)
    backend = CountingBackend()
    tracer = _tracer(implementation, backend)
    cfg = Config({"summary": True, "trace": None, "warmup": 0})
    recorder = Recorder(cfg, tracer)
    tracer.add_sink(recorder)
    tracer.sync.add_devices([0])  # the patches saw the model's arrays on GPU 0
    _drive(tracer, 6)
    assert recorder.gpu is not None and backend.timers_created == 1
    # started at the first iteration's end: five iterations timed, each with three phases
    assert sorted(set(seen)) == sorted({names.ITERATION, names.FORWARD, names.BACKWARD,
                                        names.UPDATE})
    assert len(seen) == 5 * 2 * 4
    tracer.close()
    gpu = recorder.gpu.result()
    assert gpu is not None and len(gpu["iteration"]) == 5
    recorder.flush_all()
    assert recorder.agg.ranges == 6 * 7  # the recorder got every range
    tracer.forget_thread()


# -- the twins' parts ----------------------------------------------------------------------

def test_both_recorder_hooks_append_the_same_rows(native_module):
    """The recorder's append, called from Python, and the native core's own, in C."""
    rows = {}
    for name, impl in (("native", hotpath.Implementation("native", native_module)),
                       ("python", hotpath.PYTHON)):
        tracer = _tracer(impl)
        recorder = Recorder(Config({"summary": True, "trace": None}), tracer)
        tracer.add_sink(recorder)
        ts = tracer.state()
        outer, inner = tracer.info("outer", names.USER), tracer.info("inner", names.LINK)
        tok = tracer.begin(outer, ts)
        tracer.end(tracer.begin(inner, ts), ts)  # through the core
        recorder.end(inner, 5, 7, ts)  # the hook's end, from Python, at depth 1
        tracer.end(tok, ts)
        block = recorder.pending_blocks()[0][1]
        assert block.dtype == np.int64 and block.shape == (3, 4)
        assert block[1].tolist() == [inner.index, 5, 7, 1]
        rows[name] = block[:, [0, 3]].tolist()
        tracer.forget_thread()
        assert rows[name] == [[inner.index, 1], [inner.index, 1], [outer.index, 0]]
    assert rows["native"] == rows["python"]


def test_either_recorder_hook_hands_over_its_buffer_as_int64_rows(
        implementation: hotpath.Implementation):
    """``copy(ts)`` and ``take(ts)``: the rows, whichever twin's buffer holds them (the
    recorder never looks at which); ``take`` leaves the buffer empty, ``copy`` as it was."""
    tracer = _tracer(implementation)
    recorder = Recorder(Config({"summary": True, "trace": None}), tracer)
    tracer.add_sink(recorder)
    ts = tracer.state()
    info = tracer.info("inner", names.LINK)
    assert len(recorder.native.copy(ts)) == 0  # nothing buffered yet
    recorder.end(info, 5, 7, ts)
    recorder.end(info, 8, 9, ts)
    expected = [info.index, 5, 7, 0, info.index, 8, 9, 0]
    assert np.frombuffer(recorder.native.copy(ts), dtype=np.int64).tolist() == expected
    assert np.frombuffer(recorder.native.take(ts), dtype=np.int64).tolist() == expected
    assert not ts.record and len(recorder.native.copy(ts)) == 0
    recorder.end(info, 10, 11, ts)  # the thread goes on appending after a take
    assert np.frombuffer(recorder.native.take(ts), dtype=np.int64).tolist() == [
        info.index, 10, 11, 0]
    tracer.forget_thread()


# -- sealed: nothing outside runtime/hotpath/ branches on which twin runs ---------------------

def _outside_hotpath() -> list[Path]:
    package = Path(chainer_autoprof.__file__).parent
    return [path for path in sorted(package.rglob("*.py"))
            if "hotpath" not in path.relative_to(package).parts]


#: The hot path's modules that are its own business (the twins' parts, the build).
PRIVATE = {"python", "_native", "core", "wrappers", "record", "nvtx_domain", "build"}


def test_nothing_outside_the_hot_path_branches_on_the_twin():
    """Outside ``runtime/hotpath/``: no import of a twin's parts, no ``.native`` or
    ``.module`` read of the implementation."""
    found = []
    for path in _outside_hotpath():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.name}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.ImportFrom) and "hotpath" in (node.module or ""):
                parts = set((node.module or "").split("."))
                found += [f"{where}: imports {node.module}.{alias.name}"
                          for alias in node.names if (parts | {alias.name}) & PRIVATE]
            if isinstance(node, ast.Attribute) and node.attr in ("module", "native"):
                value = node.value
                owner = value.attr if isinstance(value, ast.Attribute) else \
                    value.id if isinstance(value, ast.Name) else ""
                if owner in ("hotpath", "impl", "implementation"):
                    found.append(f"{where}: {owner}.{node.attr}")
    assert found == []


def test_a_patch_asks_for_a_hot_wrapper_the_protocol_names(
        implementation: hotpath.Implementation):
    with pytest.raises(ValueError, match="no hot wrapper 'around'"):
        implementation.hot_wrapper("around", len, implementation.switch(), print)
