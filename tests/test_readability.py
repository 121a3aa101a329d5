"""What people read: lines that fit, one piece of advice once, settings named as they were
given, ties said as ties, the right noun, names for what time is, no noise.

Real runs under the launcher's console script and under activation from the
environment, the real GPU recordings of tests/data/gpu through ``report``, a
trace of a real run edited where a tie needs two equal phases, and the pages
in Chromium.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_live_replay import replay_live
from headless_browser import Browser, find_browser
from support import REPO, clean_env, program

GPU_TRACES = sorted((REPO / "tests" / "data" / "gpu" / "traces").glob("*.json"))
CONSOLE_SCRIPT = Path(sys.executable).parent / "chainer-autoprof"
needs_browser = pytest.mark.skipif(find_browser() is None, reason="needs chromium")


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None):
    return subprocess.run(args, cwd=cwd, env=clean_env(**(env or {})), capture_output=True,
                          text=True, timeout=240)


def _report(*args: str, cwd: Path = REPO) -> str:
    proc = _run([sys.executable, "-m", "chainer_autoprof", "report", *args], cwd)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# -- the GPU summaries and pages ----------------------------------------------------------------
@pytest.fixture(scope="module")
def replayed(tmp_path_factory) -> Path:
    """A real CUPTI recording replayed through the live path: GPU activity, long kernel names."""
    return replay_live("b16", tmp_path_factory.mktemp("readable")).path


def test_gpu_summaries_have_no_line_over_200_characters(replayed):
    """Lines of 300 to 600 characters (the GPU evidence, the cuDNN fix, the agent's-waits note)
    are wrapped under their text; the title keeps the command whole, to paste it."""
    for trace in [*GPU_TRACES, replayed]:
        lines = _report(str(trace)).splitlines()
        long = [line for line in lines[1:] if len(line) > 200]
        assert long == [], (trace.name, long)
        # wrapped, not cut: the note's last words are still there
        assert lines[-1].startswith("  => ")


def test_the_cudnn_fix_is_said_once():
    for trace in GPU_TRACES:
        text = " ".join(_report(str(trace)).split())
        assert text.count("CuPy 14 and later have no cuDNN support") <= 1, trace.name
        if "convolution link(s) run without cuDNN" in text:  # the verdict's suggestion
            assert "see the cudnn advice" in text and "[cudnn]" in text


@needs_browser
def test_pages_fit_their_cards_and_have_no_all_dash_column(replayed, tmp_path):
    """The top-kernels table (kernel names of 120 characters without a space) overflowed its
    card; at sync level 2 the GPU table had an unlabelled column of dashes only."""
    pages = {}
    for trace in [replayed, *GPU_TRACES]:
        page = tmp_path / f"{trace.stem}.html"
        _report(str(trace), "--html", str(page))
        pages[trace.stem] = page
    with Browser() as browser:
        for name, page in pages.items():
            browser.open(page)
            assert browser.problems() == []
            overflow = browser.evaluate(
                "Array.from(document.querySelectorAll('section, header'))"
                ".filter(s => s.scrollWidth > s.clientWidth + 1).map(s => s.id)")
            assert overflow == [], name
            columns = browser.evaluate("""Array.from(document.querySelectorAll('#gpu table'))
                .map(t => Array.from(t.querySelectorAll('th')).map((th, c) => [th.textContent,
                    Array.from(t.tBodies[0].rows).map(r => r.cells[c] ? r.cells[c].textContent
                                                                     : '')]))""")
            for table in columns:
                for head, cells in table:
                    assert head.strip() != "GPU", (name, head)
                    assert any(c not in ("", "\u2013", "-") for c in cells), (name, head)


# -- real runs: under the launcher, and activated from the environment --------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("readable_runs")
    (tmp / "train.py").write_text(program("readability_train"))
    out = {"launcher": _run([str(CONSOLE_SCRIPT), "--status", "--granularity", "link",
                             "--stall", "0.5", "--trace", "run.json", "--record-limit", "1000",
                             "train.py", "1.5"], tmp),
           "environment": _run([sys.executable, "train.py"], tmp,
                               {"CHAINER_PROF_ENABLE": "1", "CHAINER_PROF_GRANULARITY": "link",
                                "CHAINER_PROF_TRACE": "env.json",
                                "CHAINER_PROF_RECORD_LIMIT": "1000"}),
           "tmp": tmp}
    for name in ("launcher", "environment"):
        assert out[name].returncode == 0, out[name].stderr
    return out


def test_hints_take_the_form_the_run_was_started_in(runs):
    launcher, environment = runs["launcher"].stderr, runs["environment"].stderr
    assert "3 warm-up excluded (--warmup 3)" in launcher
    assert "CHAINER_PROF_" not in launcher.split("summary (pid")[1].split("patch status")[0]
    assert "3 warm-up excluded (CHAINER_PROF_WARMUP=3)" in environment


def test_one_call_is_one_call_and_the_classifier_is_named_for_what_its_time_is(runs):
    assert not re.search(r"\b1 calls\b", runs["launcher"].stderr)
    for err in (runs["environment"].stderr,):  # (the launcher's run pauses: extension-bound)
        verdict = err.split("Verdict: ")[1]
        assert not re.search(r"\b1 calls\b", err)
        per_link = re.findall(r"^    (\S.*?): .* of link time\), (\S+) calls?$", verdict, re.M)
        assert per_link and all(n == "1" for _name, n in per_link)  # one call per iteration
        assert re.search(r"of link time\), 1 call$", verdict, re.M)
        top = per_link[0][0]
        advice = " ".join(verdict.split())
        if top == "Classifier":  # its own time: softmax_cross_entropy and accuracy
            assert "work on Classifier first" not in advice
            assert "Classifier's own time is its loss function and its accuracy" in advice
            assert re.search(r"of the layers, work on predictor/l\d \(Linear\) first", advice)
        else:
            assert f"work on {top} first" in advice


def test_status_of_a_healthy_run_flags_nothing(runs):
    """A hand-written loop never calls Trainer.run, an iterator or a converter: not a miss."""
    err = runs["launcher"].stderr
    status = err.split("patch status at exit:\n")[1]
    assert re.search(r"^  Trainer\.run .*hits=0$", status, re.M)
    assert "never hit" not in status
    assert "Config(" not in err
    active = next(line for line in err.splitlines() if line.startswith("chainer_autoprof: active"))
    assert "--log debug" in active and "--granularity link" in active


def test_stall_report_shows_the_program_not_the_launcher(runs):
    err = runs["launcher"].stderr
    report = err.split("stall: no progress")[1].split("reported once per stall")[0]
    frames = re.findall(r"^      (\S+):\d+ in (\S+)$", report, re.M)
    main_frames = report.split("MainThread")[1].split("\n  ")[0]
    assert frames and frames[0][0].endswith("train.py"), report
    assert str(CONSOLE_SCRIPT) not in report and "sys.exit(main())" not in main_frames


def test_a_tie_is_said_as_a_tie(runs):
    """The closing line named one of two phases that print the same share (29.2% and 29.2%)."""
    tmp = runs["tmp"]
    data = json.loads((tmp / "env.json").read_text())
    saved = data["otherData"]["chainer_autoprof"]["run_stats"]  # the record limit dropped ranges
    totals = saved["phase_total_ms"]
    both = (totals["forward"] + totals["backward"]) / 2
    totals["forward"] = totals["backward"] = both
    (tmp / "tie.json").write_text(json.dumps(data))
    last = _report("tie.json", cwd=tmp).strip().splitlines()[-1]
    assert re.fullmatch(r"  => the forward pass and the backward pass take [\d.]+% of each "
                        r"iteration each\.", last), last
