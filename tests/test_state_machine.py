"""Property-based: generated programs keep NVTX balanced, results unchanged, unwrap exact.

Hypothesis generates programs over the agent's state machine: nested Link
calls in new- and old-style models, optimizer updates with and without a
lossfun, ``chainer.grad``, updaters, evaluation by hand (test mode, no
backprop, a training-mode forward never backpropagated, inside a Trainer
extension), exceptions raised inside the forward, the loss function, an
extension or an ``annotate`` block, ``annotate`` blocks nesting any of these,
work in another thread (one that leaves a block open when it ends included),
uninstall and reinstall, at every granularity and sync level, with and without a capture
window.  A driver runs a batch of them in one process without the agent and
in one with it (NVTX recorded through the injection library, since NVTX reads
its environment at process start), and:

* every program's results (losses, outputs, parameters, the exceptions
  raised) are the same with the agent as without;
* every patched attribute is exactly the original after each uninstall;
* at the end of every program no NVTX range is open on any thread, and no
  pop ever comes without its push;
* the agent says nothing on stderr (no internal error).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from nvtx_tool import NvtxEvent
from support import run_python

DRIVER = Path(__file__).resolve().parent / "state_machine_driver.py"

RAISES = st.sampled_from([None, None, "forward"])
LEAF = st.one_of(
    st.tuples(st.just("manual"), st.sampled_from([None, None, "forward", "loss"])),
    st.tuples(st.just("lossfun"), st.sampled_from([None, None, "forward", "lossfun"])),
    st.tuples(st.just("grad"), RAISES),
    st.tuples(st.just("updater"), st.integers(1, 3), RAISES),
    st.tuples(st.just("eval"), st.sampled_from(["test", "nobackprop", "train"])),
    st.tuples(st.just("trainer"), st.integers(1, 3), st.booleans()),
    st.just(("raise",)),
)
OPS = st.recursive(
    LEAF,
    lambda inner: st.one_of(
        st.tuples(st.just("annotate"), st.sampled_from(["block", "step"]),
                  st.lists(inner, max_size=3)),
        st.tuples(st.just("thread"), st.lists(st.one_of(inner, st.just(("left open",))),
                                              min_size=1, max_size=3)),
    ),
    max_leaves=6,
)
WINDOW = st.integers(0, 4).flatmap(lambda a: st.integers(a + 1, a + 4).map(lambda b: f"{a}:{b}"))
SETTINGS = st.fixed_dictionaries(
    {"granularity": st.sampled_from(["iteration", "phase", "link", "function"]),
     "sync_level": st.integers(0, 3)},
    optional={"iterations": WINDOW, "link_depth": st.integers(0, 2),
              "warmup": st.integers(0, 2)},
)
PROGRAM = st.fixed_dictionaries({
    "model": st.sampled_from(["new", "old"]),
    "depth": st.integers(1, 3),
    "settings": SETTINGS,
    "ops": st.lists(st.one_of(OPS, OPS, st.just(("reinstall",))), min_size=1, max_size=6),
})


def check_balanced(events: list[NvtxEvent], programs: int) -> None:
    """Push/pop per thread in the agent's domain: never a pop without a push, nothing open
    at any program's end (the driver's ``program N`` marks)."""
    stacks: dict[int, int] = defaultdict(int)
    ended = 0
    for ev in events:
        if ev.domain == "driver" and ev.event == "mark":
            still_open = {tid: n for tid, n in stacks.items() if n}
            assert not still_open, f"open at the end of {ev.text}: {still_open}"
            assert ev.text == f"program {ended}"
            ended += 1
        elif ev.domain == "chainer" and ev.event in ("push", "pop"):
            stacks[ev.tid] += 1 if ev.event == "push" else -1
            assert stacks[ev.tid] >= 0, f"a pop without its push on thread {ev.tid}"
    assert ended == programs


# Each example is a batch of programs run in two fresh processes: a twentieth of the profile's
# examples (3 in CI, see conftest.py).
@settings(max_examples=max(1, settings.default.max_examples // 20))
@given(programs=st.lists(PROGRAM, min_size=10, max_size=10))
def test_generated_programs(tmp_path_factory, programs):
    tmp = tmp_path_factory.mktemp("programs")
    (tmp / "programs.json").write_text(json.dumps(programs))
    args = [str(DRIVER), str(tmp / "programs.json")]
    plain = run_python(tmp / ".", [*args, "plain"], nvtx=False, count_device=False)
    assert plain.returncode == 0, plain.stderr
    profiled = run_python(tmp, [*args, "agent"])
    assert profiled.returncode == 0, profiled.stderr
    assert profiled.stderr == ""
    assert profiled.stdout == plain.stdout  # results, exceptions, and "unwrap ok"
    assert len(plain.stdout.splitlines()) == len(programs)
    check_balanced(profiled.events, len(programs))
    assert any(ev.event == "push" for ev in profiled.events)
