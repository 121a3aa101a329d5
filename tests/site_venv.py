"""A throw-away virtual environment whose site-packages holds the real ``chainer_autoprof.pth``.

Building a venv with Chainer in it takes minutes, so the venv made here
borrows the running interpreter's packages instead: a path file sorted before
ours puts the checkout and the running environment's site-packages on
``sys.path`` (plain path lines: the ``.pth`` files there are not processed).
Then ``chainer_autoprof.pth``, copied from the checkout, is processed by
``site`` at start-up exactly as in an installed environment.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PTH = REPO / "chainer_autoprof.pth"
PREFIXES = ("CHAINER_PROF_", "_CHAINER_PROF_", "NVTX_", "CHAINER_AUTOPROF_")
ENV_TEST_NATIVE = "CHAINER_AUTOPROF_TEST_NATIVE"


class SiteVenv:
    """A venv at ``root``; ``python`` is its interpreter, ``site_packages`` its site dir."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.python = root / "bin" / "python"
        # -I: no user site, no PYTHON* variables; site still runs (it sets the venv's prefix).
        self.site_packages = Path(subprocess.run(
            [str(self.python), "-I", "-c",
             "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True, env=self.env()).stdout.strip())
        if root.resolve() not in self.site_packages.resolve().parents:
            raise RuntimeError(f"{self.site_packages} is not inside the venv {root}")

    def add_pth(self, name: str = "chainer_autoprof.pth", text: str | None = None) -> Path:
        """Put a ``.pth`` file (the real one unless ``text``) into site-packages."""
        path = self.site_packages / name
        if text is None:
            shutil.copyfile(PTH, path)
        else:
            path.write_text(text)
        return path

    def env(self, **extra: str) -> dict[str, str]:
        """The current environment without agent, NVTX or PYTHON* variables, plus ``extra``."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(PREFIXES) and k not in ("PYTHONPATH", "PYTHONHOME",
                                                           "PYTHONSTARTUP", "VIRTUAL_ENV")}
        env[ENV_TEST_NATIVE] = os.environ.get(ENV_TEST_NATIVE, "1")  # the hot path under test
        env.update(extra)
        return env

    def run(self, args: list[str], cwd: Path, env: dict[str, str] | None = None,
            timeout: float = 240) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.python), *args], cwd=cwd, env=env or self.env(),
                              capture_output=True, text=True, timeout=timeout)


def make_site_venv(root: Path, with_pth: bool = True) -> SiteVenv:
    """Create the venv (no pip: fast) with the checkout and the running packages on its path."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    venv = SiteVenv(root)
    paths = [str(REPO)]
    for key in ("purelib", "platlib"):
        path = sysconfig.get_paths()[key]
        if path not in paths:
            paths.append(path)
    # "_" sorts before "c": these paths are in place when chainer_autoprof.pth runs.
    venv.add_pth("_chainer_autoprof_test_paths.pth", "\n".join(paths) + "\n")
    if with_pth:
        venv.add_pth()
    return venv
