"""Activate chainer_autoprof at interpreter start-up, then run the sitecustomize this one hides.

Put this directory first on ``PYTHONPATH``.  Where a ``CHAINER_PROF_*``
variable is set, the agent starts from the environment (as the installed
``chainer_autoprof.pth`` does); then the next ``sitecustomize`` on
``sys.path`` (Debian's, a virtual environment's, your own) runs, exactly once,
and becomes the ``sitecustomize`` module.  An error in it is reported by
``site`` as it would be without this file in front.
"""

import os
import sys


def _activate() -> None:
    if any(key.startswith("CHAINER_PROF_") for key in os.environ):
        from chainer_autoprof.activation import activate

        activate()


def _run_next_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    this_file = os.path.realpath(__file__)
    this_dir = os.path.dirname(this_file)
    entries = [p for p in sys.path if isinstance(p, str)]
    for i, entry in enumerate(entries):
        if os.path.realpath(entry or os.curdir) == this_dir:
            rest = entries[i + 1:]
            break
    else:
        rest = entries
    rest = [p for p in rest if os.path.realpath(p or os.curdir) != this_dir]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    if spec.origin and os.path.realpath(spec.origin) == this_file:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module  # the import of this file returns the user's
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop("sitecustomize", None)
        raise


_activate()
_run_next_sitecustomize()
