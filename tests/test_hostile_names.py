"""Names from the program or a trace never reach a terminal or a page raw.

A link, a class, a thread, a user range, the script's file name, a kernel
name: each may hold ``ESC ] 0 ; ... BEL`` (retitles the terminal), ``ESC [ 2 J``
(clears it), a carriage return, a C1 control (``U+009B``, CSI on some
terminals), or ``<!--<script`` (changes how a browser parses the page's
embedded JSON).  A real run of such a program (its summary and stall report on
a real stderr), ``report``, ``merge`` and ``report --html`` on its trace, and a
real GPU recording with the same names replayed through the live path and
opened in Chromium: every byte written is printable but the newline, the names
are shown escaped (not dropped), and the page's own script still runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_live_replay import replay_live
from headless_browser import Browser, find_browser
from support import clean_env, program

ESC = "\x1b"
TITLE = ESC + "]0;pwned\x07"
CLEAR = ESC + "[2J\r\x9b31m"
#: The script's own file name: a BEL and an escape sequence.
SCRIPT = "tr" + ESC + "]0;x\x07.py"


def raw_controls(text: str) -> list[str]:
    """The characters of ``text`` a terminal or a browser would act on: C0 but the newline,
    DEL, C1, the line separators and the bidirectional overrides."""
    return sorted({repr(c) for c in text
                   if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0
                   or c in "\u2028\u2029" or 0x202A <= ord(c) <= 0x202E
                   or 0x2066 <= ord(c) <= 0x2069})


def _run(args: list[str], cwd: Path, **env: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=clean_env(**env),
                          capture_output=True, timeout=240)
    return (proc.returncode, proc.stdout.decode("utf-8"), proc.stderr.decode("utf-8"))


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    """One real run: summary and a stall report on stderr, a trace, a second trace to merge."""
    tmp = tmp_path_factory.mktemp("hostile")
    (tmp / SCRIPT).write_text(program("hostile_names_train"))
    outputs = {}
    for name, extra in (("t", ["--granularity", "link"]), ("u", ["--granularity", "phase"])):
        code, out, err = _run(["-m", "chainer_autoprof", "--trace", f"{name}.json", *extra,
                               SCRIPT], tmp, CHAINER_PROF_STALL="0.5")
        assert code == 0, err
        outputs[f"run {name}"] = out + err
    return tmp, outputs


def test_the_run_and_the_readers_write_no_raw_control(hostile_run):
    tmp, outputs = hostile_run
    for label, args in (("report", ["report", "t.json"]),
                        ("report --from-events", ["report", "t.json", "--from-events"]),
                        ("report A B", ["report", "t.json", "u.json"]),
                        ("merge", ["merge", "t.json", "u.json", "-o", "m.json"]),
                        ("report --html", ["report", "t.json", "--html", "r.html"])):
        code, out, err = _run(["-m", "chainer_autoprof", *args], tmp)
        assert code == 0, (label, err)
        outputs[label] = out + err
    outputs["page"] = (tmp / "r.html").read_text(encoding="utf-8")
    for label, text in outputs.items():
        assert raw_controls(text) == [], label
    summary = outputs["run t"]
    # shown escaped, where they were: the links, the user range, the thread, the script
    assert "predictor/l\\x1b]0;pwned\\x07 (Linear)" in summary
    assert "predictor/out\\x1b[2J\\r\\x9b31m (Linear)" in summary
    assert "user:step\\x1b]0;pwned\\x07" in summary
    assert "stall: no progress" in summary and "loader\\x1b[2J\\r\\x9b31m (tid" in summary
    assert "tr\\x1b]0;x\\x07.py" in summary
    assert "predictor/l\\x1b]0;pwned\\x07 (Linear)" in outputs["report"]
    assert "predictor/l\\x1b]0;pwned\\x07 (Linear)" in outputs["page"]


@pytest.fixture(scope="module")
def hostile_gpu_trace(tmp_path_factory) -> Path:
    """A real GPU recording replayed through the live path, its convolutions and a kernel
    renamed as a trace from elsewhere may name them."""
    tmp = tmp_path_factory.mktemp("hostile_gpu")
    path = replay_live("b16", tmp).path

    def rename(value):
        if isinstance(value, str):
            return (value.replace("(Convolution2D)", "(Conv<!--<script>" + TITLE + ")")
                    .replace("momentum_sgd", "sgd</script><!--<script" + CLEAR))
        if isinstance(value, list):
            return [rename(v) for v in value]
        if isinstance(value, dict):
            return {rename(k): rename(v) for k, v in value.items()}
        return value

    data = rename(json.loads(path.read_text()))
    gpu = data["otherData"]["chainer_autoprof"]["gpu_activity"]
    assert "<!--<script>" in gpu["links"][0]["name"]
    assert any("<!--<script" in k["name"] for k in gpu["top_kernels"])
    out = tmp / "hostile.json"
    out.write_text(json.dumps(data))
    return out


def test_gpu_report_escapes_kernel_and_link_names(hostile_gpu_trace):
    code, out, err = _run(["-m", "chainer_autoprof", "report", str(hostile_gpu_trace)],
                          hostile_gpu_trace.parent)
    assert code == 0, err
    assert raw_controls(out + err) == []
    assert "\\x1b]0;pwned\\x07" in out


@pytest.mark.skipif(find_browser() is None, reason="needs chromium")
def test_page_script_survives_names_that_open_a_script(hostile_gpu_trace):
    """``<!--<script`` in the embedded JSON made the parser take the page's own script as
    part of the data element: it never ran, and never marked the page ready."""
    page = hostile_gpu_trace.parent / "hostile.html"
    code, _out, err = _run(["-m", "chainer_autoprof", "report", str(hostile_gpu_trace),
                            "--html", str(page)], hostile_gpu_trace.parent)
    assert code == 0, err
    assert raw_controls(page.read_text(encoding="utf-8")) == []
    with Browser() as browser:
        browser.open(page)
        assert browser.evaluate("document.body.dataset.ready") == "1"
        assert browser.problems() == []
        assert browser.evaluate("document.scripts.length") == 2
        data = browser.evaluate(
            "JSON.parse(document.getElementById('report-data').textContent)")
        # the data keeps the name as it is (JSON escapes it); the page shows it escaped
        assert data["gpu_top_link"] == f"predictor/conv2 (Conv<!--<script>{TITLE}) @gpu0"
        kernels = browser.evaluate("Array.from(document.querySelectorAll('#gpu td.name'))"
                                   ".map(c => c.textContent)")
        assert any(k.startswith("sgd</script><!--<script\\x1b[2J") for k in kernels), kernels
