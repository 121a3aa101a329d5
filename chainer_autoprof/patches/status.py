"""The status report: each patch target, its owner, state and hit count."""

from __future__ import annotations

from typing import Sequence

from .base import Patch

#: Targets that every training run hits; never hit after iterations ran is a silent miss.
CORE_TARGETS = frozenset({"Link.__call__", "Variable.backward", "Optimizer.update"})


def status_report(patches: Sequence[Patch], chainer_imported: bool, trained: bool,
                  at_exit: bool = False, implementation: str = "") -> str:
    """The hot path's implementation, then one line per patch target; at exit, the core
    targets (:data:`CORE_TARGETS`) never hit while training are flagged: every other target
    serves one way of training (a Trainer, an iterator, ChainerMN), unused by many a healthy
    run."""
    lines = [f"  hot path: {implementation}"] if implementation else []
    for patch in patches:
        owners = ", ".join(patch.owners[:3]) + (f" (+{len(patch.owners) - 3})"
                                                 if len(patch.owners) > 3 else "")
        state = patch.status + (f" ({patch.reason})" if patch.reason else "")
        line = f"  {patch.label:<30} {state:<10} {owners}"
        if at_exit:
            line += f"  hits={patch.hits}"
            if patch.hits == 0 and trained and patch.status == "patched" \
                    and patch.label in CORE_TARGETS:
                line += "  <- never hit while Chainer trained"
        lines.append(line)
    if not chainer_imported:
        lines.append("  (chainer was not imported: nothing instrumented)")
    return "\n".join(lines)


def missed_targets(patches: Sequence[Patch], iterations: int) -> list[str]:
    """Core targets never hit although iterations ran (a silent miss).

    One iteration is not enough evidence: a forward-only script in training
    mode opens one implicit iteration that never closes.
    """
    if iterations < 2:
        return []
    return [p.label for p in patches
            if p.label in CORE_TARGETS and p.status == "patched" and p.hits == 0]
