"""chainer_autoprof: profile an unmodified Chainer training script.

NVTX ranges (iteration, phases, links, functions), GPU synchronization at a
chosen sync level, and an in-process recorder with a summary at exit; applied
by an import hook when ``chainer`` is imported.  This module stays light: it
is imported at start-up by the ``.pth`` hook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .common.version import __version__

if TYPE_CHECKING:
    from .agent import Agent
    from .user_ranges import Annotation

__all__ = ["__version__", "annotate", "install", "uninstall"]


def install(**settings: object) -> Agent | None:
    """Start the agent; keyword settings override ``CHAINER_PROF_*`` variables.

    Returns the agent (``None`` when switched off by ``enable=False``).  A
    second call returns the installed agent without wrapping anything twice.
    """
    from .agent import install as _install  # the .pth line imports this package: stay light

    return _install(**settings)


def uninstall() -> None:
    """Remove the agent and restore every patched Chainer function exactly."""
    from .agent import uninstall as _uninstall  # likewise

    _uninstall()


def annotate(name: str) -> Annotation:
    """A user range ``name`` in the agent's domain: context manager and decorator."""
    from .user_ranges import Annotation  # likewise

    return Annotation(name)
