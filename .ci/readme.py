"""Keep the generated tables of README.md and docs/trace_format.md in step with the code.

README.md: the settings table comes from ``chainer_autoprof.common.settings.markdown_table()``,
the range-colour table from ``chainer_autoprof.common.names.CATEGORIES``.
docs/trace_format.md: the event kinds from ``chainer_autoprof.report.trace_events.KINDS``,
the run record from ``chainer_autoprof.analysis.record.RECORD``.  Each table sits between
``<!-- BEGIN name -->`` and ``<!-- END name -->``.

    python .ci/readme.py          # rewrite the tables
    python .ci/readme.py --check  # exit 1 if a file is out of date
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
sys.path.insert(0, str(REPO))

from chainer_autoprof.analysis import record  # noqa: E402
from chainer_autoprof.common import names, settings  # noqa: E402
from chainer_autoprof.report import trace_events  # noqa: E402

TRACE_FORMAT = REPO / "docs" / "trace_format.md"

#: What each range category covers, in README words.
CATEGORY_RANGES = {
    names.ITERATION: ("`iteration`: one training iteration (`Updater.update`, or a step of a "
                      "loop of your own: [What an iteration is](#what-an-iteration-is))"),
    names.DATA: "`data`: fetching and converting the batch",
    names.FORWARD: "`forward`: the forward pass and the loss",
    names.BACKWARD: "`backward`: `Variable.backward` / `chainer.grad` / `chainer.backward`",
    names.UPDATE: "`update`: the optimizer's update",
    names.EXTENSION: "`extension:<name> (<Class>)`: a trainer extension",
    names.INFERENCE: ("`inference`: a forward pass by hand outside training "
                      "(`train=False` or `no_backprop_mode`); in the trace, "
                      f"`{names.NO_UPDATE}`: what began as an iteration and reached no "
                      "update"),
    names.COMM: "`comm:<op>`: a ChainerMN communication",
    names.USER: "your `annotate(name)` ranges",
    names.GC: ("`gc gen <N>`: a garbage collection inside another range, on the thread "
               "that ran it (`CHAINER_PROF_GC`)"),
    names.LINK: "`predictor/l1 (Linear)`: a Link call (`@gpuN` on a GPU)",
    names.LINK_BACKWARD: "`predictor/l1 (Linear) backward`: a link's part of the backward pass",
    names.FUNCTION: "`<label>.forward` / `<label>.backward`: a FunctionNode",
    names.GPU_WAIT: ("`wait for GPU (<phase>)`: the agent's own wait for the GPU at sync level "
                     "1 and above, in the summary and the trace only, never an NVTX range"),
    names.AGENT: (f"`{names.AGENT_CHECKS}`: the agent's own checks on the training thread "
                  "after the first updates (most of a millisecond once), its overhead: the "
                  "summary's \"agent's own work (overhead)\" row, never idle time, never an "
                  "NVTX range"),
}


def settings_table() -> str:
    return settings.markdown_table()


def colour_table() -> str:
    level_name = {level: name for name, level in names.GRANULARITY_LEVEL.items()}
    rows = ["| Category | Ranges | Granularity | Colour (ARGB) |", "|---|---|---|---|"]
    for category, (level, colour) in names.CATEGORIES.items():
        ranges = CATEGORY_RANGES.get(category, "")
        rows.append(f"| {category} | {ranges} | {level_name.get(level, level)} "
                    f"| `#{colour:08X}` |")
    return "\n".join(rows)


TABLES = {"settings-table": settings_table, "colour-table": colour_table}
#: The other generated files and their tables.
DOC_TABLES = {TRACE_FORMAT: {"trace-events": trace_events.markdown,
                             "run-record": record.markdown}}


def block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- BEGIN {name} -->\n)(.*?)(<!-- END {name} -->)", re.S)


def render(text: str, tables: dict = TABLES, where: str = "README.md") -> str:
    """``text`` with every generated table replaced by its current version."""
    for name, make in tables.items():
        pattern = block(name)
        if not pattern.search(text):
            raise SystemExit(f"{where} has no <!-- BEGIN {name} --> ... <!-- END {name} -->")
        new = make().rstrip("\n") + "\n"
        text = pattern.sub(lambda m, new=new: m.group(1) + new + m.group(3), text)
    return text


def main(argv: list[str]) -> int:
    stale = 0
    for path, tables in {README: TABLES, **DOC_TABLES}.items():
        text = path.read_text(encoding="utf-8")
        new = render(text, tables, path.name)
        if new == text:
            continue
        if "--check" in argv:
            print(f"{path.name} is out of date: run python .ci/readme.py", file=sys.stderr)
            stale = 1
        else:
            path.write_text(new, encoding="utf-8")
            print(f"{path.name} updated")
    return stale


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
