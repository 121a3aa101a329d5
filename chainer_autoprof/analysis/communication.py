"""Communication inside the iterations (ChainerMN's ``comm:*`` ranges): its figures and verdict.

In a data-parallel job the gradient all-reduce lies inside the parameter update (the
multi-node optimizer's ``update`` holds it), and every rank waits there for the slowest one.
Counted as the update phase, a rank's waits would read as its own compute ("the parameter
update takes 80%").  Here the time in ``comm:*`` ranges inside the counted iterations is a
figure of its own (the aggregation's ``comm_total_ms`` per operation, ``comm_ms`` per
iteration), left out of the compute share, and a verdict of its own when it takes
:data:`COMM_SHARE` of the iteration time or more.  One rank's trace cannot say whom it
waited for: the verdict says how to find out (``merge``, whose per-rank table and straggler
line compare the ranks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..common import figures as fmt

if TYPE_CHECKING:
    from .stats import RunStats

#: Communication at a quarter of the iteration time or more is the verdict (when it has more
#: time behind it than any other kind): a quarter of each iteration spent waiting for the
#: other ranks or the network is more than any one phase's tuning usually wins back.
COMM_SHARE = 0.25
#: The operations named in the evidence.
TOP_OPS = 3


def comm_ms(stats: RunStats) -> float:
    """Time in communication inside the counted iterations (ms)."""
    return float(sum(stats.comm_total_ms.values()))


def comm_share(stats: RunStats) -> float:
    """Share (0-1) of the counted iteration time spent in communication."""
    total = stats.iteration_total_ms
    return comm_ms(stats) / total if total > 0 else 0.0


def top_ops(stats: RunStats, n: int = TOP_OPS) -> list[tuple[str, float]]:
    """The operations with the most time, ``(name, ms)``, the most first."""
    return sorted(stats.comm_total_ms.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def title(stats: RunStats) -> str:
    return (f"communication-bound: communication (comm:*) takes {fmt.pct(comm_share(stats))} "
            "of the iteration time")


def evidence(stats: RunStats) -> list[str]:
    """What the verdict shows: per iteration, each operation, the phases holding them."""
    n = stats.iterations or 1
    total = stats.iteration_total_ms or 1.0
    lines = ["mean per iteration: " + ", ".join(
        f"{name} {fmt.ms(ms / n)} ({fmt.pct(ms / total)})" for name, ms in top_ops(stats))]
    own = max(0.0, stats.iteration_total_ms - comm_ms(stats))
    lines.append(f"the rest of the iteration (this rank's own work): {fmt.ms(own / n)} per "
                 f"iteration ({fmt.pct(own / total)})")
    holding = [(key, stats.phase_total(key)) for key in ("forward", "backward", "update")]
    key, ms = max(holding, key=lambda kv: kv[1])
    if ms >= comm_ms(stats) > 0:
        lines.append(f"it lies inside the {key} phase ({fmt.ms(ms / n)} per iteration, of "
                     f"which {fmt.ms(comm_ms(stats) / n)} communication): waiting, not "
                     f"{key} work")
    series = stats.comm_ms
    if len(series) > 1:
        lines.append(f"per iteration: median {fmt.ms(_median(series))}, longest "
                     f"{fmt.ms(max(series))}")
    return lines


def suggestions(stats: RunStats) -> list[str]:
    return [
        "a rank waits in a collective for the slowest rank: merge the ranks' traces "
        "(python -m chainer_autoprof merge rank*.json -o job.json) to see which rank holds "
        "the others back and for how long",
        "where every rank waits alike, the communication itself is slow: a faster "
        "communicator (pure_nccl on GPUs), larger and fewer messages, or overlapping it "
        "with compute (create_multi_node_optimizer(..., double_buffering=True))",
    ]


def sentence(stats: RunStats) -> str | None:
    """The closing sentence when communication dominates (``None`` otherwise)."""
    share = comm_share(stats)
    if share < COMM_SHARE:
        return None
    return (f"communication (comm:*) takes {fmt.pct(share)} of each iteration: waiting for "
            "the other ranks or the network, not this rank's own work.")


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
