"""Names NVTX cannot take as they are (a lone surrogate, as an undecodable file name gives)."""

from __future__ import annotations

from pathlib import Path

from support import program, run_with_agent

PROGRAM = program("odd_names")


def test_a_name_with_a_lone_surrogate_keeps_every_hook_on(tmp_path: Path):
    run = run_with_agent(tmp_path, PROGRAM, {"CHAINER_PROF_GRANULARITY": "link",
                                             "CHAINER_PROF_TRACE": "t.json"})
    assert run.returncode == 0 and run.stdout == "ok\n", run.stderr
    assert run.stderr == ""  # no hook turned off
    pushed = [ev.text for ev in run.events if ev.event == "push"]
    assert pushed.count("forward") == 3  # the Link.__call__ hook stayed on
    assert "odd\\udcffname (Linear)" in pushed and "step \\udcff" in pushed
    assert (tmp_path / "t.json").is_file()
