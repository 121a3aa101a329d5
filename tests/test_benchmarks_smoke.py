"""The overhead benchmark runs end to end and prints its table (its figures are not checked)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

from support import REPO, clean_env

BENCH = REPO / "benchmarks"
TARGETS = (
    "Not activated: no Chainer function wrapped",
    "Not activated: .pth start-up check < 1 ms",
    "Phase granularity <= 1% slower on the MLP",
    "Link granularity <= 1.5 µs added per Link call",
    "Link granularity <= 2x a bare NVTX push+pop",
    "Function granularity cheaper than Chainer's function hook",
    "Recorder < 1 µs per range",
    "Recorder < 100 bytes per range",
    "Recorder memory bounded (record_limit)",
    "Every agent configuration cheaper than python -m nvtx",
)


def _configs():
    spec = importlib.util.spec_from_file_location("bench_configs", BENCH / "configs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.CONFIGS


def test_smoke_run_prints_every_configuration_and_target():
    proc = subprocess.run([sys.executable, str(BENCH / "overhead.py"), "--smoke"],
                          env=clean_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    rows = {line.split("|")[1].strip(): line for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| Configuration")}
    for cfg in _configs():
        assert cfg.label in rows, f"no row for {cfg.label!r} in:\n{out}"
        # a timed row: MLP step, deep step, Link call, each with its ratio
        assert len(re.findall(r"\d+\.\d+ (?:ms|µs) \(\d+\.\d+x\)", rows[cfg.label])) == 3, \
            rows[cfg.label]
    verdicts = {}
    for target in TARGETS:
        found = re.search(r"^- \[(met|not met|not measured)\] " + re.escape(target) + ":", out,
                          re.M)
        assert found, f"target {target!r} missing in:\n{out}"
        verdicts[target] = found.group(1)
    # not a timing: with the package installed but no CHAINER_PROF_* set, nothing is wrapped
    assert verdicts["Not activated: no Chainer function wrapped"] == "met", out
    assert "bare NVTX push+pop pair from Python" in out
