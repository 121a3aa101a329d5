"""The run record is declared once: writers, readers, RunStats and the documentation follow it.

A field added in one place only fails here: written but not declared (the
writers build the record through the declaration), declared as always
written but not written, a RunStats attribute or a fact the declaration does
not know, a type the facts' TypedDicts do not have, or documentation that was
not regenerated.  Real traces (the GPU recordings, and runs made here, final
and killed) hold exactly what the declaration says.
"""

from __future__ import annotations

import dataclasses
import json
import re
import runpy
from pathlib import Path
from typing import TypedDict

import pytest
from support import REPO, program, run_python, write_script

from chainer_autoprof.analysis import facts as facts_module
from chainer_autoprof.analysis import record
from chainer_autoprof.analysis.record import By, RecordError
from chainer_autoprof.analysis.shapes import (
    Annotated,
    F,
    ListOf,
    MalformedError,
    MapOf,
    Section,
    section_of,
)
from chainer_autoprof.analysis.stats import LinkStat, RunStats
from chainer_autoprof.report import partial as partial_format
from chainer_autoprof.report.tracefile import read_trace

GPU_DATA = REPO / "tests" / "data" / "gpu"
GPU_TRACES = sorted((GPU_DATA / "traces").glob("*.json")) + \
    sorted((GPU_DATA / "cupti").glob("*/agent_trace.json"))

TRAIN = program("record_train")


def undeclared(section: Section, value, by: By, where: str = "") -> list[str]:
    """Keys of ``value`` the declaration does not have for writer ``by`` (closed sections)."""
    out: list[str] = []
    for key, item in (value.items() if isinstance(value, dict) else ()):
        f = section.by_name.get(key)
        if f is None or (f.by is not None and not f.by & by):
            out.append(f"{where}.{key}")
        else:
            out += _inside(f.kind, item, by, f"{where}.{key}")
    return out


def _inside(kind, item, by: By, where: str) -> list[str]:
    if isinstance(kind, Section):
        return [] if kind.open else undeclared(kind, item, by, where)
    if isinstance(kind, ListOf) and isinstance(item, list):
        return [x for n, each in enumerate(item) for x in _inside(kind.item, each, by,
                                                                  f"{where}[{n}]")]
    if isinstance(kind, MapOf) and isinstance(item, dict):
        return [x for k, each in item.items() for x in _inside(kind.item, each, by,
                                                               f"{where}.{k}")]
    return []


# -- the declaration covers what traces hold ------------------------------------------------------
@pytest.mark.parametrize("path", GPU_TRACES, ids=lambda p: p.parent.name + "/" + p.name)
def test_traces_recorded_on_a_gpu_hold_exactly_the_declared_record(path):
    meta = json.loads(path.read_text())["otherData"]["chainer_autoprof"]
    assert undeclared(record.RECORD, meta, By.EXIT) == []
    record.build(By.EXIT, meta)  # every field the final trace always has is there
    checked = record.check(meta)
    fields = record.stats_fields(checked)
    assert fields["sync_level"] == meta["sync_level"] and fields["batch_size"] in (512, 16)
    trace = read_trace(str(path))
    assert trace.stats().iterations > 0


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A real run that ends normally, and one SIGKILLed after its trace so far was written."""
    tmp = tmp_path_factory.mktemp("record")
    script = write_script(tmp, "train.py", TRAIN)
    flags = ["-m", "chainer_autoprof", "--summary", "0", "--flush-interval", "0.2",
             "--granularity", "link"]
    done = run_python(tmp, [*flags, "--trace", "done.json", str(script)], nvtx=False)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    killed = run_python(tmp, [*flags, "--trace", "killed.json", str(script), "kill"], nvtx=False)
    assert killed.returncode == -9, killed.stderr
    return tmp


def test_a_final_trace_holds_exactly_the_declared_record(runs):
    meta = json.loads((runs / "done.json").read_text())["otherData"]["chainer_autoprof"]
    assert undeclared(record.RECORD, meta, By.EXIT) == []
    record.build(By.EXIT, meta)
    assert record.check(meta) == meta


def test_the_trace_so_far_holds_exactly_the_declared_record(runs):
    path = runs / "killed.json.partial"
    written = [json.loads(payload) for kind, payload in partial_format.records(path.read_bytes())
               if kind == b"META"][-1]
    assert undeclared(record.RECORD, written, By.SO_FAR) == []
    record.build(By.SO_FAR, written)
    read = partial_format.read_partial(str(path))["otherData"]["chainer_autoprof"]
    added = set(read) - set(written)
    assert added and all(By.READ in record.RECORD.by_name[key].by for key in added)
    assert undeclared(record.RECORD, read, By.SO_FAR | By.READ) == []
    assert read_trace(str(path)).stats().iterations == 12 - 3


# -- writers build through the declaration ------------------------------------------------------
def _final(**changes):
    meta = json.loads(GPU_TRACES[0].read_text())["otherData"]["chainer_autoprof"]
    meta.update(changes)
    return meta


def test_a_writer_cannot_write_an_undeclared_field():
    with pytest.raises(RecordError, match="gpu_wait_ms is not declared"):
        record.build(By.EXIT, _final(gpu_wait_ms=1.0))
    facts = dict(_final()["facts"], new_fact=1)
    with pytest.raises(RecordError, match=r"facts\.new_fact is not declared"):
        record.build(By.EXIT, _final(facts=facts))
    with pytest.raises(RecordError, match="overhead_ms is not written by so far"):
        record.build(By.SO_FAR, {"overhead_ms": 1.0}, complete=False)
    with pytest.raises(RecordError, match="trace_path is not written by read"):
        record.add({}, By.READ, trace_path="t.json")


def test_a_writer_cannot_leave_out_a_field_it_always_writes():
    meta = _final()
    del meta["sync_calls"]
    with pytest.raises(RecordError, match="sync_calls is missing"):
        record.build(By.EXIT, meta)
    del meta["clock"]["duration_ns"]
    with pytest.raises(RecordError, match=r"clock\.duration_ns is missing"):
        record.build(By.EXIT, dict(meta, sync_calls=0))
    record.build(By.EXIT, meta, complete=False)  # the summary's record, before the figures


def test_the_record_is_written_in_declared_order_and_facts_as_seen():
    meta = _final()
    shuffled = dict(reversed(list(meta.items())))
    shuffled["facts"] = dict(reversed(list(meta["facts"].items())))
    built = record.build(By.EXIT, shuffled)
    assert list(built) == list(meta)
    assert list(built["facts"]) == list(shuffled["facts"])


# -- readers follow it ----------------------------------------------------------------------------
def test_a_reader_takes_null_as_absent_and_defaults_from_the_declaration():
    meta = record.check({"warmup_skip": None, "batch_size": None, "sync_ms": None})
    assert "warmup_skip" not in meta and meta["batch_size"] is None
    assert record.value(meta, "warmup_skip") == 0
    assert record.value(meta, "clock.duration_ns") is None
    assert record.stats_fields(meta) == {
        "dropped_ranges": 0, "batch_size": None, "samples": 0, "sampled_iterations": 0,
        "sync_level": 0, "sync_calls": 0, "overhead_ms": 0.0, "overhead_method": "",
        "gpu_phase_ms": None, "gpu_activity": None, "per_iteration": {}}
    with pytest.raises(MalformedError, match=r"chainer_autoprof\.facts\.gc\.ms\[1\] is 'x'"):
        record.check({"facts": {"gc": {"ms": [0.5, "x"]}}})


def test_a_saved_run_stats_is_checked_against_run_stats_own_fields():
    stats = RunStats(iterations=2, warmup=1, iteration_ms=[1.0, 2.0], phase_ms={}, outside_ms={},
                     wall_ms=5.0, links=[LinkStat("l1", 2, 1.0, 0.5, 2, 0.2)], batch_size=None,
                     sync_level=0, sync_calls=0, overhead_ms=0.1, gpu_phase_ms=None, meta={})
    saved = dict(stats.to_dict(), meta={})
    saved["links"][0]["extra"] = "left out"
    del saved["gc_ms"], saved["batch_size"]  # an older version's
    back = RunStats.from_dict(record.check_run_stats(saved))
    assert back.links == stats.links and back.gc_ms == [] and back.batch_size is None
    with pytest.raises(MalformedError, match="run_stats has no wall_ms"):
        record.check_run_stats(dict(saved, wall_ms=None))


# -- one declaration: the typed classes, the sections derived from them --------------------------
def test_run_stats_and_link_stat_fields_are_all_declared():
    assert [f.name for f in record.RUN_STATS.fields] == \
        [f.name for f in dataclasses.fields(RunStats)]
    assert [f.name for f in record.LINK.fields] == [f.name for f in dataclasses.fields(LinkStat)]
    feeding = [f for f in record.RECORD.fields if f.stats]
    assert {f.stats for f in feeding} == {"dropped_ranges", "batch_size", "samples",
                                          "sampled_iterations", "sync_level", "sync_calls",
                                          "overhead_ms", "overhead_method", "gpu_phase_ms",
                                          "gpu_activity", "per_iteration"}
    for f in feeding:  # the record's and the saved copy's kinds are one declaration
        assert record.RUN_STATS.by_name[f.stats].kind is f.kind


def test_a_record_field_of_the_statistics_must_have_their_type():
    """A record field taken from RunStats is checked against RunStats' type when declared."""
    class Wrong(TypedDict, total=False):
        sync_level: Annotated[str, F(stats=True)]

    with pytest.raises(TypeError, match="sync_level"):
        section_of(Wrong, stats=record.RUN_STATS)


def test_the_clock_reference_is_the_one_rank_takes_and_merge_needs_its_perf_counter():
    """``process.clock_reference`` is common/rank.py's ClockReference itself: what rank writes
    is what the record declares; a reader needs ``perf_counter_ns`` (merge aligns by it), any
    other key may be missing."""
    from chainer_autoprof.common import rank

    process = record.RECORD.by_name["process"].kind
    section = process.by_name["clock_reference"].kind
    assert isinstance(section, Section) and section.cls is rank.ClockReference
    rank.forget()
    try:
        rank.note_collective_end("comm:bcast_data", 1234)
        taken = rank.clock_reference()
    finally:
        rank.forget()
    assert taken is not None
    built = record.build(By.EXIT, {"process": {"clock_reference": taken}}, complete=False)
    assert built["process"]["clock_reference"] == taken
    assert [f.name for f in section.fields] == list(taken)
    saved = {"process": {"clock_reference": dict(taken)}}
    del saved["process"]["clock_reference"]["op"], saved["process"]["clock_reference"]["method"]
    assert record.check(saved)["process"]["clock_reference"] == {"perf_counter_ns": 1234,
                                                                 "unix_time_ns": taken[
                                                                     "unix_time_ns"]}
    del saved["process"]["clock_reference"]["perf_counter_ns"]
    with pytest.raises(MalformedError, match="clock_reference has no perf_counter_ns"):
        record.check(saved)


@pytest.mark.parametrize("where", sorted(facts_module.TYPED))
def test_the_facts_types_match_their_declaration(where):
    section, typed = facts_module.TYPED[where]
    assert list(typed.__annotations__) == [f.name for f in section.fields]


def test_the_gpu_activity_record_matches_its_declaration():
    """The run record's ``gpu_activity`` is GpuActivity field for field, its parts too."""
    from chainer_autoprof.analysis import gpu_record as g

    assert [f.name for f in dataclasses.fields(g.GpuActivity)] == \
        [f.name for f in record.GPU_ACTIVITY.fields]
    for typed, section in ((g.LinkGpuDict, record.GPU_LINK), (g.PhaseGpuDict, record.GPU_PHASE),
                           (g.KernelGpuDict, record.GPU_KERNEL),
                           (g.TimelineDict, record.GPU_TIMELINE)):
        assert list(typed.__annotations__) == [f.name for f in section.fields], typed


def test_the_gpu_figures_are_one_typed_object_through_the_record():
    """Written as JSON by the record's build, read back as the same object by its check."""
    from chainer_autoprof.analysis.gpu_record import GpuActivity

    activity = GpuActivity(
        iterations=2, span_ms=10.0, busy_ms=6.0, busy_share=0.6, active_share=0.7,
        idle_ms={"host": 3.0, "other": 1.0}, iteration_ms={"span": [5.0, 5.0]},
        devices=[{"device": 0, "windows": 2, "span_ms": 10.0, "busy_ms": 6.0,
                  "idle_ms": {"host": 3.0}}],
        phases={"forward": {"kernel_ms": 4.0, "kernels": 8, "copy_ms": 0.5}},
        links=[{"name": "l1", "fwd_ms": 4.0, "fwd_kernels": 8, "bwd_ms": 2.0, "bwd_kernels": 4,
                "copy_ms": 0.0}],
        top_kernels=[{"name": "sgemm", "link": None, "backward": False, "ms": 3.0, "calls": 4}],
        ops={"kernel": 12}, clock={"pairs": 3, "drift_ppm": 0.5}, source="CUPTI",
        collector={"buffers": 1}, notes=["a note"])
    built = record.build(By.EXIT, _final(gpu_activity=activity))
    assert built["gpu_activity"] == activity.to_dict()
    read = record.check(json.loads(json.dumps(built)))
    assert record.stats_fields(read)["gpu_activity"] == activity
    with pytest.raises(MalformedError, match=r"gpu_activity\.busy_share is 1\.5, out of range"):
        record.check(dict(read, gpu_activity=dict(read["gpu_activity"], busy_share=1.5)))


def test_every_fact_the_probes_record_is_declared():
    source = "\n".join(p.read_text() for p in (REPO / "chainer_autoprof").rglob("*.py"))
    written = set(re.findall(r"facts\[\"(\w+)\"\]\s*=", source))
    written |= set(re.findall(r"facts\.setdefault\(\"(\w+)\"", source))
    assert written, "the probes record facts"
    declared = {f.name for section, _typed in facts_module.TYPED.values() for f in section.fields}
    assert written <= declared


def test_the_trace_format_document_is_current():
    tool = runpy.run_path(str(REPO / ".ci" / "readme.py"))
    for path, tables in tool["DOC_TABLES"].items():
        text = Path(path).read_text(encoding="utf-8")
        assert tool["render"](text, tables, Path(path).name) == text, "run: python .ci/readme.py"
    text = (REPO / "docs" / "trace_format.md").read_text(encoding="utf-8")
    for f in record.RECORD.fields:
        assert f"| `{f.name}` |" in text
