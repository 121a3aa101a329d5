"""The status report: each patch target, its owner, state and hit count."""

from __future__ import annotations

from typing import Any


def status_report(agent: Any, at_exit: bool) -> str:
    """One line per patch target; at exit, targets never hit while training are flagged."""
    trained = agent.tracer.iterations > 0
    lines = []
    for patch in agent.patches.patches:
        owners = ", ".join(patch.owners[:3]) + (f" (+{len(patch.owners) - 3})"
                                                 if len(patch.owners) > 3 else "")
        state = patch.status + (f" ({patch.reason})" if patch.reason else "")
        line = f"  {patch.label:<30} {state:<10} {owners}"
        if at_exit:
            line += f"  hits={patch.hits}"
            if patch.hits == 0 and trained and patch.status == "patched":
                line += "  <- never hit while Chainer trained"
        lines.append(line)
    if agent.chainer is None:
        lines.append("  (chainer was not imported: nothing instrumented)")
    return "\n".join(lines)


def missed_targets(agent: Any) -> list[str]:
    """Core targets never hit although iterations ran (a silent miss).

    One iteration is not enough evidence: a forward-only script in training
    mode opens one implicit iteration that never closes.
    """
    if agent.tracer.iterations < 2:
        return []
    core = {"Link.__call__", "Variable.backward", "Optimizer.update"}
    return [p.label for p in agent.patches.patches
            if p.label in core and p.status == "patched" and p.hits == 0]
