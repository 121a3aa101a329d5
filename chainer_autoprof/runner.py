"""Run a user's script or module as ``__main__``, exactly as ``python`` would.

``run_path`` mirrors ``python script.py`` (also a directory or zip file with a
``__main__.py``), ``run_module`` mirrors ``python -m module``.  Both raise
whatever the user's code raises.  ``exec_target`` wraps them for a launcher's
top level: it reports an uncaught exception like the interpreter does, but
without the launcher's own traceback entries.
"""

from __future__ import annotations

import builtins
import io
import marshal
import os
import pkgutil
import runpy
import sys
import types
from importlib.machinery import SourceFileLoader, SourcelessFileLoader
from importlib.util import MAGIC_NUMBER
from typing import Literal

from .common.tracebacks import drop_own_frames

__all__ = ["exec_target", "run_module", "run_path", "trim_traceback"]

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_displaced_mains: list[types.ModuleType] = []  # keep the launcher's __main__ alive


def _abspath(path: str) -> str:
    """Make ``path`` absolute the way CPython does for its script argument (no normalising)."""
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


def _set_path0(entry: str) -> None:
    """Replace the launcher's own ``sys.path[0]`` with ``entry``."""
    if sys.path:
        sys.path[0] = entry
    else:
        sys.path.insert(0, entry)


def _install_main() -> types.ModuleType:
    """Install and return a fresh, empty ``__main__`` module like the interpreter creates."""
    old = sys.modules.get("__main__")
    if old is not None:
        _displaced_mains.append(old)
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]  # set by the interpreter, untyped
    main.__annotations__ = {}
    sys.modules["__main__"] = main
    return main


def run_path(path: str, argv: list[str]) -> None:
    """Run the script file (or directory / zip file with ``__main__.py``) ``path`` as ``__main__``.

    ``argv`` holds the arguments after the script; ``sys.argv`` becomes ``[path, *argv]``.
    A missing file prints python's "can't open file" message and exits with status 2.
    """
    sys.argv = [path, *argv]
    safe_path = getattr(sys.flags, "safe_path", False)
    # A directory or zip file: put it on sys.path and run its __main__ module.
    if pkgutil.get_importer(path) is not None:
        if safe_path:
            sys.path.insert(0, _abspath(path))
        else:
            _set_path0(_abspath(path))
        _install_main()
        runpy._run_module_as_main("__main__", alter_argv=False)  # type: ignore[attr-defined]
        return

    filename = _abspath(path)
    if not safe_path:
        resolve = os.path.abspath if os.name == "nt" else os.path.realpath
        _set_path0(os.path.dirname(resolve(path)))
    try:
        with io.open_code(filename) as f:
            data = f.read()
    except OSError as exc:
        prog = sys.orig_argv[0] if getattr(sys, "orig_argv", None) else sys.executable
        print(
            f"{prog}: can't open file {filename!r}: [Errno {exc.errno}] {exc.strerror}",
            file=sys.stderr,
        )
        raise SystemExit(2) from None

    main = _install_main()
    if filename.endswith(".pyc") or data[:2] == MAGIC_NUMBER[:2]:
        if data[:4] != MAGIC_NUMBER:
            raise RuntimeError("Bad magic number in .pyc file")
        code = marshal.loads(data[16:])
        main.__loader__ = SourcelessFileLoader("__main__", filename)
    else:
        code = compile(data, filename, "exec", dont_inherit=True)
        main.__loader__ = SourceFileLoader("__main__", filename)
    main.__file__ = filename
    main.__cached__ = None  # type: ignore[attr-defined]  # (same)
    try:
        exec(code, main.__dict__)
    finally:  # python forgets these once the script is done
        main.__dict__.pop("__file__", None)
        main.__dict__.pop("__cached__", None)


def run_module(modname: str, argv: list[str]) -> None:
    """Run module ``modname`` (a package runs its ``__main__``) as ``__main__``, like ``python -m``.

    ``argv`` holds the arguments after the module name; ``sys.argv[0]`` becomes the
    module's file.  An unknown module prints "No module named ..." and exits with status 1.
    """
    sys.argv = ["-m", *argv]
    if not getattr(sys.flags, "safe_path", False):
        _set_path0(os.getcwd())
    _install_main()
    runpy._run_module_as_main(modname, alter_argv=True)  # type: ignore[attr-defined]


def trim_traceback(tb: types.TracebackType | None) -> types.TracebackType | None:
    """Drop the leading traceback entries that belong to this package (the launcher)."""

    def is_launcher(frame: types.FrameType) -> bool:
        filename = frame.f_code.co_filename
        return (
            os.path.isabs(filename)
            and filename.startswith(_PKG_DIR + os.sep)
            and frame.f_globals.get("__name__") != "__main__"
        )

    while tb is not None and is_launcher(tb.tb_frame):
        tb = tb.tb_next
    return tb


def _report(exc: BaseException) -> None:
    """Print ``exc`` through ``sys.excepthook`` as python does for an uncaught exception.

    Without the launcher's frames, nor the pure-Python hot path's (the native one has none).
    """
    exc.__traceback__ = trim_traceback(exc.__traceback__)
    drop_own_frames(exc)
    tb = exc.__traceback__
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
    if sys.version_info >= (3, 12):
        sys.last_exc = exc
    hook = getattr(sys, "excepthook", None) or sys.__excepthook__
    try:
        hook(type(exc), exc, tb)
    except Exception as hook_exc:  # our error: one line, the program goes on  # noqa: BLE001
        print("Error in sys.excepthook:", file=sys.stderr)
        sys.__excepthook__(type(hook_exc), hook_exc, hook_exc.__traceback__)
        print("\nOriginal exception was:", file=sys.stderr)
        sys.__excepthook__(type(exc), exc, tb)


def _silence(exc: BaseException) -> None:
    """Make ``sys.excepthook`` skip ``exc`` (already reported) but nothing else."""
    hook = sys.excepthook

    def excepthook(
        typ: type[BaseException], value: BaseException, tb: types.TracebackType | None
    ) -> None:
        if value is not exc:
            hook(typ, value, tb)

    sys.excepthook = excepthook


def exec_target(kind: Literal["path", "module"], target: str, args: list[str]) -> None:
    """Run ``target`` as ``__main__`` (``kind`` "path": script/dir/zip, "module": like ``-m``).

    Meant to be called from the launcher's top level, e.g. inside ``try/finally`` that
    writes a report.  Returns normally if the user's code does.  ``SystemExit`` propagates
    unchanged.  Any other exception is reported via ``sys.excepthook`` with the launcher's
    frames trimmed, then:

    * ``KeyboardInterrupt`` is re-raised, with ``sys.excepthook`` told to skip it, so the
      interpreter runs atexit handlers and then dies by SIGINT, as ``python`` does;
    * anything else becomes ``SystemExit(1)``.
    """
    runners = {"path": run_path, "module": run_module}
    if kind not in runners:
        raise ValueError(f"kind must be 'path' or 'module', not {kind!r}")
    try:
        runners[kind](target, args)
    except SystemExit:
        raise
    except KeyboardInterrupt as exc:
        _report(exc)
        _silence(exc)
        raise
    except BaseException as exc:  # our error: reported once, the program's call goes on  # noqa: BLE001
        _report(exc)
        raise SystemExit(1) from None
