"""Keep README.md's generated tables in step with the code.

The settings table comes from ``chainer_autoprof.common.settings.markdown_table()``,
the range-colour table from ``chainer_autoprof.common.names.CATEGORIES``.  Each sits
in README.md between ``<!-- BEGIN name -->`` and ``<!-- END name -->``.

    python .ci/readme.py          # rewrite the tables in README.md
    python .ci/readme.py --check  # exit 1 if README.md is out of date
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
sys.path.insert(0, str(REPO))

from chainer_autoprof.common import names, settings  # noqa: E402

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


def block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- BEGIN {name} -->\n)(.*?)(<!-- END {name} -->)", re.S)


def render(text: str) -> str:
    """``text`` with every generated table replaced by its current version."""
    for name, make in TABLES.items():
        pattern = block(name)
        if not pattern.search(text):
            raise SystemExit(f"README.md has no <!-- BEGIN {name} --> ... <!-- END {name} -->")
        text = pattern.sub(lambda m, make=make: m.group(1) + make() + "\n" + m.group(3), text)
    return text


def main(argv: list[str]) -> int:
    text = README.read_text(encoding="utf-8")
    new = render(text)
    if "--check" in argv:
        if new != text:
            print("README.md is out of date: run python .ci/readme.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        README.write_text(new, encoding="utf-8")
        print("README.md updated")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
