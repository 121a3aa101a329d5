"""The ``.pth`` start-up check: find its line, run it, time it in fresh interpreters.

``site`` executes a ``.pth`` line that starts with ``import`` in every
interpreter that starts, so its cost when no ``CHAINER_PROF_*`` variable is set
is paid by every Python program on the machine.  The line is looked up, in
order, in a ``*.pth`` file of the repository or of site-packages that mentions
``chainer_autoprof``, as ``chainer_autoprof.activation.PTH_LINE``, or as a
string literal in ``setup.py``.
"""

from __future__ import annotations

import os
import re
import site
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _from_text(text: str) -> str | None:
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(("import ", "import\t")) and "chainer_autoprof" in line:
            return line
    return None


def find_pth_line() -> tuple[str | None, str]:
    """The start-up line and where it was found (``None, reason`` when absent)."""
    dirs = [REPO, *(Path(p) for p in [*site.getsitepackages(), site.getusersitepackages()])]
    for directory in dirs:
        if not directory.is_dir():
            continue
        pattern = "**/*.pth" if directory == REPO else "*.pth"
        for path in sorted(directory.glob(pattern)):
            if ".git" in path.parts:
                continue
            line = _from_text(path.read_text(errors="replace"))
            if line:
                return line, str(path)
    try:  # imported only when no .pth file says it: "not activated" must not load it
        from chainer_autoprof import activation  # type: ignore[attr-defined]

        line = getattr(activation, "PTH_LINE", None)
        if isinstance(line, str) and line.strip():
            return line.strip(), "chainer_autoprof.activation.PTH_LINE"
    except ImportError:
        pass
    setup = REPO / "setup.py"
    if setup.is_file():
        for literal in re.findall(r"""["']([^"'\n]*chainer_autoprof[^"'\n]*)["']""",
                                  setup.read_text()):
            line = _from_text(literal)
            if line:
                return line, str(setup)
    return None, "no .pth line found (*.pth / chainer_autoprof.activation / setup.py)"


def run_pth_line() -> bool:
    """Execute the start-up line as ``site`` would; False when there is none."""
    line, _ = find_pth_line()
    if line is None:
        return False
    exec(line)  # exactly what site.addpackage does with an import line
    return True


_TIMER = ("import time as _t, sys as _s\n"
          "_t0 = _t.perf_counter_ns()\n"
          "exec({line!r})\n"
          "_s.stdout.write(str(_t.perf_counter_ns() - _t0))\n")


def measure_pth(env: dict[str, str], runs: int) -> dict[str, object]:
    """Median cost (ns) of the start-up line in ``runs`` fresh interpreters, agent off."""
    line, where = find_pth_line()
    if line is None:
        return {"found": False, "where": where}
    env = {k: v for k, v in env.items() if not k.startswith("CHAINER_PROF_")}
    code = _TIMER.format(line=line)
    samples = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=60, check=True, cwd=os.getcwd())
        samples.append(int(out.stdout.strip()))
    return {"found": True, "where": where, "line": line,
            "median_ns": statistics.median(samples), "max_ns": max(samples)}
