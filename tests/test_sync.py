"""GPU synchronization per sync level and granularity, counted by the CPU stand-in backend.

Level 0 never synchronizes, 1 at iteration boundaries, 2 also at phase
boundaries, 3 at the boundaries of every range emitted.  Synchronizing
happens at both ends of a range, so a synchronized range costs two calls.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from nvtx_tool import ranges_by_thread
from streams import GRANULARITIES, check_stream, segments
from support import program, run_python, run_with_agent, twin_env, twins, write_script

from chainer_autoprof.common import names

LEVELS = (0, 1, 2, 3)
ITERATIONS = 3  # two of a custom loop, one of optimizer.update(lossfun)

MATRIX_PROGRAM = program("sync_matrix")

CONFIGS = [f"{level}:{g}" for level, g in itertools.product(LEVELS, GRANULARITIES)]


def syncs_by_config(log: list[str]) -> dict[str, list[str]]:
    parts: dict[str, list[str]] = {}
    current: list[str] = []
    for line in log:
        if line.startswith("# "):
            current = parts.setdefault(line[2:], [])
        else:
            current.append(line)
    return parts


def synced_ranges(level: int, ranges: list[tuple[int, str, int]]) -> int:
    """How many of ``ranges`` sync at ``level``: category levels below it, all at 3."""
    level_of_colour = {colour: lvl for lvl, colour in names.CATEGORIES.values()}
    count = 0
    for _depth, _text, colour in ranges:
        lvl = level_of_colour[colour]
        if lvl < level or level >= names.FUNCTION_LEVEL:
            count += 1
    return count


@pytest.fixture(scope="module", params=twins())
def matrix(request: pytest.FixtureRequest, tmp_path_factory):
    """The matrix program's run, on each hot path in turn (conftest.py)."""
    tmp = tmp_path_factory.mktemp("sync")
    script = write_script(tmp, "matrix.py", MATRIX_PROGRAM)
    run = run_python(tmp, [str(script), *CONFIGS], check=True, env=twin_env(request.param))
    assert run.stdout == "False\n"  # NumPy only: CuPy never imported
    return run, syncs_by_config(run.sync_log()), segments(run.events)


@pytest.mark.parametrize("config", CONFIGS)
def test_sync_calls_per_iteration(matrix, config: str):
    _, syncs, parts = matrix
    level, granularity = int(config[0]), config[2:]
    assert set(syncs[config]) <= {"sync"}  # NumPy arrays: no device ids
    ranges = next(iter(ranges_by_thread(parts[config], "chainer").values()))
    assert [text for d, text, _ in ranges if d == 0] == ["iteration"] * ITERATIONS
    assert len(syncs[config]) == 2 * synced_ranges(level, ranges)
    per_iteration = len(syncs[config]) / ITERATIONS
    if level == 0:
        assert per_iteration == 0
    elif level == 1:
        assert per_iteration == 2  # begin and end of the iteration
    elif level == 2:  # and of forward, backward, update when they are emitted
        assert per_iteration == (2 if granularity == "iteration" else 8)
    elif granularity == "link":  # level 3: every range; links Classifier/predictor x 2 ways
        assert per_iteration == 8 + 2 * 4


def test_matrix_stream_is_balanced(matrix):
    run, _, parts = matrix
    check_stream(run.events)
    assert set(parts) == set(CONFIGS)


TRAIN = program("sync_train")


def test_sync_1_means_level_1(tmp_path: Path):
    run = run_with_agent(tmp_path, TRAIN, {"CHAINER_PROF_SYNC": "1"})
    assert run.returncode == 0, run.stderr
    assert run.stdout == "CountingBackend 6 False\n"
    assert run.sync_log() == ["sync"] * 6
    assert run.tree() == ["iteration", "  forward", "  backward", "  update"] * 3


def test_sync_is_a_no_op_for_numpy_and_never_imports_cupy(tmp_path: Path):
    """Without the stand-in, level 3 calls the real backend, which has nothing to wait for."""
    run = run_with_agent(tmp_path, TRAIN, {"CHAINER_PROF_SYNC_LEVEL": "3"},
                         count_device=False)
    assert run.returncode == 0, run.stderr
    backend, calls, cupy = run.stdout.split()
    assert backend in ("LazyBackend", "NullBackend")
    assert int(calls) == 3 * 2 * 4  # iteration and three phases, both ends
    assert cupy == "False"
    check_stream(run.events)
