"""The launcher: ``python -m chainer_autoprof [options] train.py [args]`` (or ``chainer-autoprof``).

Options come first and stop at the first argument that is not one of ours,
as with ``python -m cProfile``: that argument is the script (``-m MODULE``
runs a module), and everything after it belongs to the script.  Each setting
of :data:`chainer_autoprof.settings.SETTINGS` has a flag; flags are validated
together with the ``CHAINER_PROF_*`` environment before the script starts,
then exported as ``CHAINER_PROF_*`` variables so that child processes profile
with the same settings.  ``report``, ``merge`` and ``dump`` as the first
argument are subcommands.
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
import sys
import textwrap
from typing import Literal, Sequence

from .common.one_line import write
from .common.settings import BY_NAME, PREFIX, SETTINGS, Setting, SettingsError, from_environ
from .common.version import __version__
from .runner import exec_target

__all__ = ["LaunchArgs", "UsageError", "help_text", "main", "parse_args", "usage"]

#: Subcommands, recognised only as the very first argument: name -> module with ``main(argv)``.
SUBCOMMANDS = {
    "report": ("chainer_autoprof.report.compare", "print the summary of a recorded trace file"),
    "merge": ("chainer_autoprof.report.merge",
              "merge the trace files of several processes or ranks"),
    "dump": ("chainer_autoprof.report.dump",
             "make running processes report where they are now (also while blocked)"),
}

_FLAGS: dict[str, Setting] = {s.flag: s for s in SETTINGS}
_OWN_OPTIONS = ("-h", "--help", "--version", "--status", "-m", "--")
_ENABLE = next(s for s in SETTINGS if s.name == "enable")
_LOG = next(s for s in SETTINGS if s.name == "log")


class UsageError(Exception):
    """Bad command line or settings: one line for the user, exit status 2."""


class LaunchArgs:
    """What the command line asks for."""

    def __init__(self) -> None:
        self.action = "run"  # run | help | version
        self.kind: Literal["path", "module"] = "path"
        self.target = ""
        self.args: list[str] = []
        self.flags: dict[str, str] = {}  # setting name -> value text, in the order given


def _prog() -> str:
    argv0 = os.path.basename(sys.argv[0]) if sys.argv else ""
    if argv0.startswith("chainer-autoprof"):
        return "chainer-autoprof"
    return "python -m chainer_autoprof"


def usage(prog: str | None = None) -> str:
    prog = prog or _prog()
    return (f"usage: {prog} [options] script.py [args ...]\n"
            f"       {prog} [options] -m module [args ...]\n"
            f"       {prog} {{{','.join(SUBCOMMANDS)}}} [args ...]")


def _wrap(text: str, indent: int = 24) -> str:
    return textwrap.fill(text, width=100, initial_indent=" " * indent,
                         subsequent_indent=" " * indent)


def _option_lines(left: str, text: str) -> list[str]:
    body = _wrap(text).lstrip()
    if len(left) <= 21:
        return [f"  {left:<21} {body}"]
    return [f"  {left}", _wrap(text)]


def help_text(prog: str | None = None) -> str:
    """The ``--help`` text: every setting's flag, generated from the settings table."""
    prog = prog or _prog()
    lines = [
        usage(prog), "",
        "Run a Chainer training script (or module) exactly as python would, with the profiling",
        "agent on: NVTX ranges for iterations, phases, links and functions, GPU synchronization",
        "at the chosen level, and a time summary on stderr at exit. Options stop at the script",
        "(or -m module); everything after it is passed to the script.", "",
        "options:",
    ]
    lines += _option_lines("-h, --help", "show this help and exit")
    lines += _option_lines("--version", "show the version and exit")
    lines += _option_lines("-m MODULE", "run library module MODULE as a script, like python -m "
                                        "(ends the options)")
    lines += _option_lines("--status", "shortcut for --log debug: report every patch target "
                                       "(state, owner, hits) at start and at exit")
    lines += _option_lines("--", "end of options: the next argument is the script, even when "
                                 "it starts with '-' or is named like a subcommand")
    lines += ["", "settings (each also a CHAINER_PROF_* environment variable; a flag wins over "
                  "the variable):"]
    for s in SETTINGS:
        doc = f"{s.doc} [{s.env}; default: {s.default_text}]"
        lines += _option_lines(f"{s.flag} {s.metavar}", doc)
    lines += ["", "Flags are also written --flag=VALUE. The launcher exports each as its "
                  "CHAINER_PROF_* variable,",
              f"and {_ENABLE.env}=1 unless set otherwise, so child processes profile too.",
              "", "subcommands (first argument only; run a script with one of these names as "
                  "./NAME or -- NAME):"]
    for name, (_module, doc) in SUBCOMMANDS.items():
        lines += _option_lines(name, f"{doc} ({prog} {name} --help)")
    lines += ["", "examples:",
              f"  {prog} train.py --epoch 3",
              f"  {prog} --sync 1 --granularity link -m mypkg.train -b 64",
              f"  nsys profile -c nvtx --nvtx-capture=iteration@chainer {prog} "
              "--iterations 10:20 train.py"]
    return "\n".join(lines) + "\n"


def _unknown_option(arg: str) -> UsageError:
    known = [*_FLAGS, *_OWN_OPTIONS]
    guess = difflib.get_close_matches(arg.partition("=")[0], known, n=1, cutoff=0.6)
    hint = f" (did you mean {guess[0]}?)" if guess else ""
    return UsageError(f"unknown option {arg}{hint}; options go before the script, "
                      "see --help")


def parse_args(argv: Sequence[str]) -> LaunchArgs:
    """Parse the launcher's arguments (subcommands excluded); raises :class:`UsageError`."""
    out = LaunchArgs()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if arg in ("-h", "--help"):
            out.action = "help"
            return out
        if arg == "--version":
            out.action = "version"
            return out
        if arg == "--status":
            out.flags.pop(_LOG.name, None)
            out.flags[_LOG.name] = "debug"
            i += 1
            continue
        if arg == "-m" or (arg.startswith("-m") and not arg.startswith("--")):
            module = arg[2:] if arg != "-m" else (argv[i + 1] if i + 1 < len(argv) else "")
            if not module:
                raise UsageError("-m needs a module name")
            out.kind, out.target = "module", module
            out.args = list(argv[i + (1 if arg != "-m" else 2):])
            return out
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            setting = _FLAGS.get(name)
            if setting is None:
                raise _unknown_option(arg)
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"{name} needs a value: {setting.metavar}")
                value = argv[i + 1]
                i += 1
            try:
                setting.parse(value)
            except ValueError as exc:
                raise UsageError(f"{name}={value!r} is not valid: accepted: {exc}") from None
            out.flags.pop(setting.name, None)
            out.flags[setting.name] = value
            i += 1
            continue
        if arg.startswith("-") and arg != "-":
            raise _unknown_option(arg)
        break
    if i >= len(argv):
        raise UsageError("no script given (or -m module); see --help")
    out.target, out.args = argv[i], list(argv[i + 1:])
    return out


_ENV_NAME = re.compile(re.escape(PREFIX) + r"[A-Z0-9_]+")


def settings_environ(flags: dict[str, str], environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with the flags written in as ``CHAINER_PROF_*`` variables, validated.

    Flag values were checked one by one by :func:`parse_args`; here everything is
    checked together with :func:`settings.from_environ`.  Raises :class:`UsageError`
    with one line naming the flag or variable, the value and what is accepted;
    unknown ``CHAINER_PROF_*`` names get a did-you-mean.
    """
    env = dict(environ)
    for name, value in flags.items():
        env[BY_NAME[name].env] = value
    if _ENABLE.name not in flags and _ENABLE.env not in environ:
        env[_ENABLE.env] = "1"
    try:
        from_environ(env)
    except SettingsError as exc:
        from_flags = {BY_NAME[name].env: BY_NAME[name].flag for name in flags}

        def name_it(match: re.Match[str]) -> str:
            return from_flags.get(match.group(0), match.group(0))

        raise UsageError(_ENV_NAME.sub(name_it, str(exc))) from None
    return env


def _install_agent() -> None:
    """Install the agent from ``os.environ``, replacing one that start-up activation made.

    Where the launcher could not be recognised at start-up (``-m`` before Python
    3.10) the ``.pth`` activation may have installed an agent from the inherited
    environment, without the flags; Chainer is not imported yet, so it is replaced.
    """
    from . import agent  # only when the agent starts: --enable 0 runs the script without it

    existing = agent.current()
    if existing is not None:
        if existing.cfg.as_dict() == from_environ().as_dict():
            return
        agent.uninstall()
    agent.install()


def _run_subcommand(name: str, argv: list[str], prog: str) -> int:
    module_name = SUBCOMMANDS[name][0]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if exc.name != module_name:
            raise
        write(sys.stderr, f"{prog} {name}: not available in this installation "
                          f"(no module {module_name}); to run a script named {name!r}, "
                          f"write ./{name} or -- {name}\n")
        return 2
    try:
        result = module.main(argv)
    except BrokenPipeError:  # report ... | head: the reader has gone
        return _reader_gone()
    return 0 if result is None else int(result)


def _reader_gone() -> int:
    """stdout's reader closed the pipe: say nothing more, exit as a killed pipe writer does."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the flush at exit must not fail again
    except (OSError, ValueError):
        pass
    return 128 + 13  # SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m chainer_autoprof`` and the ``chainer-autoprof`` script.

    Runs the target in this process and returns its exit status (0 when it
    returns normally); the target's ``SystemExit`` propagates unchanged.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = _prog()
    if argv and argv[0] in SUBCOMMANDS:
        return _run_subcommand(argv[0], argv[1:], prog)
    try:
        args = parse_args(argv)
        if args.action in ("help", "version"):
            try:
                sys.stdout.write(help_text(prog) if args.action == "help"
                                 else f"chainer_autoprof {__version__}\n")
                sys.stdout.flush()
            except BrokenPipeError:  # --help | head
                return _reader_gone()
            return 0
        env = settings_environ(args.flags, dict(os.environ))
    except UsageError as exc:
        write(sys.stderr, f"{prog}: error: {exc}\n")
        return 2
    for key, value in env.items():
        if key.startswith(PREFIX) and os.environ.get(key) != value:
            os.environ[key] = value
    if from_environ().enable:
        try:
            _install_agent()
        except Exception as exc:  # never keep the script from running  # noqa: BLE001
            write(sys.stderr, f"chainer_autoprof: could not start ({type(exc).__name__}: "
                              f"{exc}); running without the agent\n")
    exec_target(args.kind, args.target, args.args)
    return 0
