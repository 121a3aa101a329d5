"""The one table of settings, and everything derived from it.

Each :class:`Setting` has an attribute name, a ``CHAINER_PROF_*`` environment
variable, a launcher flag, a parser (the type), a default and one line of
documentation.  Parsing the environment, validating it, building the
launcher's options and the README table all come from :data:`SETTINGS`.

This module is imported by the ``.pth`` start-up check of every interpreter
where a ``CHAINER_PROF_*`` variable is set, so it imports nothing heavy.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .paths import check_writable, variables
from .shared_paths import shared_trace

PREFIX = "CHAINER_PROF_"

#: Variables of ours that are not user settings (set by the agent itself).
INTERNAL_PREFIX = "_CHAINER_PROF_"


class SettingsError(ValueError):
    """A bad setting; ``str(err)`` is the one line shown to the user."""


# -- parsers: str -> value, raising ValueError("accepted ...") ---------------

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_bool(text: str) -> bool:
    """Parse 1/0, true/false, yes/no, on/off (any case)."""
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("1/0, true/false, yes/no or on/off")


def _int_range(lo: int, hi: int | None, blank_unset: bool = False) -> Callable[[str], int | None]:
    """An integer in ``lo..hi``; with ``blank_unset`` an empty value means unset (``None``)."""
    accepted = f"an integer from {lo} to {hi}" if hi is not None else f"an integer >= {lo}"

    def parse(text: str) -> int | None:
        if blank_unset and not text.strip():
            return None
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError(accepted) from None
        if value < lo or (hi is not None and value > hi):
            raise ValueError(accepted)
        return value

    parse.accepted = accepted  # type: ignore[attr-defined]
    return parse


def _choice(*choices: str) -> Callable[[str], str]:
    accepted = "one of " + ", ".join(choices)

    def parse(text: str) -> str:
        low = text.strip().lower()
        if low not in choices:
            raise ValueError(accepted)
        return low

    parse.accepted = accepted  # type: ignore[attr-defined]
    return parse


def parse_str(text: str) -> str:
    """Any non-empty string."""
    if not text.strip():
        raise ValueError("a non-empty string")
    return text.strip()


def parse_optional_path(text: str) -> str | None:
    """A file path (may use %p, %h, %r, %q{VAR}); empty means none."""
    return text.strip() or None


def parse_trace_path(text: str) -> str | None:
    """A trace file path that can be written (checked now, before the program runs), taken
    as given: white space at either end is refused, not dropped (empty means none)."""
    path = text if text.strip() else None
    if path is not None:
        try:
            check_writable(path)
        except ValueError as exc:
            raise ValueError(f"a file path in a writable directory ({exc})") from None
    return path


def parse_window(text: str) -> tuple[int, int] | None:
    """``START:STOP`` or ``START:+COUNT`` (iterations counted from 0, STOP excluded)."""
    accepted = "START:STOP or START:+COUNT with 0 <= START < STOP, e.g. 10:20 or 10:+5"
    raw = text.strip()
    if not raw:
        return None
    start_s, sep, stop_s = raw.partition(":")
    try:
        if not sep:
            raise ValueError
        start = int(start_s)
        stop = start + int(stop_s[1:]) if stop_s.startswith("+") else int(stop_s)
    except ValueError:
        raise ValueError(accepted) from None
    if start < 0 or stop <= start:
        raise ValueError(accepted)
    return (start, stop)


def parse_ranks(text: str) -> frozenset[int] | None:
    """``all`` or a comma-separated list of MPI ranks such as ``0,3``."""
    raw = text.strip().lower()
    if raw in ("", "all"):
        return None
    try:
        ranks = frozenset(int(part) for part in raw.split(","))
    except ValueError:
        raise ValueError("'all' or a comma-separated list of ranks such as 0,3") from None
    if any(r < 0 for r in ranks):
        raise ValueError("'all' or a comma-separated list of ranks such as 0,3")
    return ranks


def parse_stall(text: str) -> float | str | None:
    """Seconds without a new iteration that make a stall (a number > 0), ``auto``, or off."""
    raw = text.strip().lower()
    if raw in ("", "0", "off", "no", "false"):
        return None
    if raw == "auto":
        return "auto"
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("seconds (a number > 0), auto, or 0/off") from None
    if not value > 0 or value == float("inf"):
        raise ValueError("seconds (a number > 0), auto, or 0/off")
    return value


def parse_seconds(text: str) -> float:
    """A number of seconds >= 0."""
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError("a number of seconds >= 0") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError("a number of seconds >= 0")
    return value


GRANULARITIES = ("iteration", "phase", "link", "function")
LOG_LEVELS = ("error", "warning", "info", "debug")

parse_bool.accepted = "1/0, true/false, yes/no or on/off"  # type: ignore[attr-defined]
parse_str.accepted = "a non-empty string"  # type: ignore[attr-defined]
parse_optional_path.accepted = "a file path"  # type: ignore[attr-defined]
parse_trace_path.accepted = "a file path in a writable directory"  # type: ignore[attr-defined]
parse_window.accepted = "START:STOP or START:+COUNT"  # type: ignore[attr-defined]
parse_ranks.accepted = "'all' or a list such as 0,3"  # type: ignore[attr-defined]
parse_stall.accepted = "seconds (a number > 0), auto, or 0/off"  # type: ignore[attr-defined]
parse_seconds.accepted = "a number of seconds >= 0"  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Setting:
    """One row of the settings table."""

    name: str
    parse: Callable[[str], object]
    default: object
    doc: str
    metavar: str = "VALUE"
    env: str = field(default="", init=False)
    flag: str = field(default="", init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", PREFIX + self.name.upper())
        object.__setattr__(self, "flag", "--" + self.name.replace("_", "-"))

    @property
    def accepted(self) -> str:
        return getattr(self.parse, "accepted", "")

    @property
    def default_text(self) -> str:
        if self.default is None:
            return "unset"
        if isinstance(self.default, bool):
            return "1" if self.default else "0"
        if isinstance(self.default, float) and self.default.is_integer():
            return str(int(self.default))
        return str(self.default)


def _switch(name: str, default: bool, doc: str) -> Setting:
    """A setting that is on or off (``0|1``; :func:`parse_bool` takes the other spellings)."""
    return Setting(name, parse_bool, default, doc, "0|1")


SETTINGS: tuple[Setting, ...] = (
    _switch("enable", True,
            "Master switch: 0 keeps the agent off even where other CHAINER_PROF_* "
            "variables are set."),
    _switch("sync", False,
            "Shorthand: 1 means sync level 1 unless CHAINER_PROF_SYNC_LEVEL says otherwise."),
    Setting("sync_level", _int_range(0, 3, blank_unset=True), None,
            "GPU synchronization: 0 none, 1 at iteration boundaries, 2 also at phase "
            "boundaries, 3 also at every finer range emitted (default 0, or 1 with SYNC=1).",
            "0-3"),
    Setting("granularity", _choice(*GRANULARITIES), "phase",
            "Finest ranges emitted: iteration, phase, link (each Link call) or function "
            "(each FunctionNode forward and backward).", "|".join(GRANULARITIES)),
    Setting("link_depth", _int_range(0, None), 0,
            "Deepest link range emitted, counting the outermost link as 1 (0: no limit).", "N"),
    Setting("domain", parse_str, "chainer", "NVTX domain of every range.", "NAME"),
    Setting("log", _choice(*LOG_LEVELS), "warning",
            "Agent messages on stderr: error, warning, info, or debug (adds the patch "
            "status report at start and exit).", "|".join(LOG_LEVELS)),
    _switch("summary", True, "Print the time summary on stderr when the program ends."),
    Setting("trace", parse_trace_path, None,
            "Write a Chrome/Perfetto trace-event JSON file here at exit (%p pid, %h host, "
            "%r MPI rank, %q{VAR} environment variable, which must be set); the ranks of an "
            "MPI job need a path each (rank%r.json).", "PATH"),
    Setting("iterations", parse_window, None,
            "Capture window START:STOP or START:+COUNT: ranges, recording and GPU activity "
            "only for those iterations, CUDA profiler started/stopped at its edges.",
            "START:STOP"),
    _switch("exit_after_window", False,
            "End the program cleanly once the capture window has closed."),
    Setting("warmup", _int_range(0, None), 3,
            "Iterations left out of the summary's statistics at the start of the run.", "N"),
    Setting("record_limit", _int_range(1000, None), 200_000,
            "Ranges kept in memory for the trace (the newest; aggregates cover all).", "N"),
    _switch("advice", True,
            "Print the bottleneck verdict and configuration advice with the summary."),
    _switch("replay_batch", False,
            "Experiment: feed the first converted batch again every iteration "
            "(how fast would training be if data were free?)."),
    _switch("native", True,
            "Hot path: 1 runs the native extension where it is built (no Python frame per "
            "call), 0 the pure-Python implementation."),
    _switch("children", True, "Profile child processes too (fork, spawn, forkserver)."),
    Setting("ranks", parse_ranks, None,
            "MPI ranks that profile: all, or a list such as 0,3.", "all|0,3"),
    Setting("stall", parse_stall, None,
            "Stall report on stderr when training makes no progress (no new iteration, no "
            "instrumented call) for this many seconds (auto: 60 s, then 5x the longest pause "
            "seen so far once 10 iterations have begun, at least 60 s); 0 or unset: off.",
            "SECONDS|auto"),
    Setting("flush_interval", parse_seconds, 5.0,
            "With a trace: seconds between background writes of the trace so far to "
            "TRACE.partial, read by report after a crash or SIGKILL (0: only at exit).",
            "SECONDS"),
    _switch("gc", True,
            "Garbage collections inside recorded ranges become gc ranges (NVTX and "
            "recorder); slow iterations name them."),
    _switch("gpu_activity", False,
            "GPU time per link without synchronizing: CUPTI kernel, copy and memset activity "
            "(cupti-python: pip install chainer-autoprof[cupti]), recorded from CuPy's import, "
            "each kernel tied to the range that launched it; GPU figures in the summary, "
            "GPU tracks in the trace.  With --iterations CUPTI traces the window's "
            "iterations only."),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
BY_ENV: dict[str, Setting] = {s.env: s for s in SETTINGS}


class Config:
    """Parsed settings; attribute per setting name, plus derived values."""

    __slots__ = (*(s.name for s in SETTINGS), "effective_sync_level", "explicit")

    # One line per setting of SETTINGS, typed as its parser returns it (for mypy;
    # tests/test_config_types.py checks the two lists agree).
    enable: bool
    sync: bool
    sync_level: int | None
    granularity: str
    link_depth: int
    domain: str
    log: str
    summary: bool
    trace: str | None
    iterations: tuple[int, int] | None
    exit_after_window: bool
    warmup: int
    record_limit: int
    advice: bool
    replay_batch: bool
    native: bool
    children: bool
    ranks: frozenset[int] | None
    stall: float | str | None
    flush_interval: float
    gc: bool
    gpu_activity: bool
    effective_sync_level: int
    explicit: frozenset[str]

    def __init__(self, values: Mapping[str, object],
                 explicit: frozenset[str] = frozenset()) -> None:
        for s in SETTINGS:
            setattr(self, s.name, values.get(s.name, s.default))
        self.explicit = explicit
        self.effective_sync_level = _derive_sync_level(self)

    def as_dict(self) -> dict[str, object]:
        return {s.name: getattr(self, s.name) for s in SETTINGS}

    def __repr__(self) -> str:
        return f"Config({self.as_dict()!r})"

    def describe(self, flags: bool = False) -> str:
        """The settings that differ from their defaults, as the user gives them: launcher
        flags (``flags``: ``--log debug``) or variables (``CHAINER_PROF_LOG=debug``)."""
        changed = [(s, to_environ_value(s, getattr(self, s.name))) for s in SETTINGS
                   if getattr(self, s.name) != s.default]
        parts = [f"{s.flag} {value or repr('')}" if flags else f"{s.env}={value}"
                 for s, value in changed]
        return (", ".join(parts) + " (the rest at their defaults)" if parts
                else "every setting at its default")


def _derive_sync_level(cfg: Config) -> int:
    level = cfg.sync_level
    if "sync" in cfg.explicit and level is not None:
        if cfg.sync and level == 0:
            raise SettingsError(
                f"{PREFIX}SYNC=1 contradicts {PREFIX}SYNC_LEVEL=0: "
                "accepted: SYNC_LEVEL 1-3 with SYNC=1, or leave one of them unset")
        if not cfg.sync and level > 0:
            raise SettingsError(
                f"{PREFIX}SYNC=0 contradicts {PREFIX}SYNC_LEVEL={level}: "
                "accepted: SYNC=1 with SYNC_LEVEL 1-3, or leave one of them unset")
    if level is None:
        return 1 if cfg.sync else 0
    return level


def _bad_value(setting: Setting, raw: str, accepted: str) -> SettingsError:
    return SettingsError(f"{setting.env}={raw!r} is not valid: accepted: {accepted}")


def unknown_variable_message(name: str) -> str:
    """The one line for an unknown CHAINER_PROF_* name, with a did-you-mean."""
    # Compared without the common prefix, which would make every name look close.
    suffixes = {env[len(PREFIX):]: env for env in BY_ENV}
    guess = difflib.get_close_matches(name[len(PREFIX):], list(suffixes), n=1, cutoff=0.6)
    hint = f"; did you mean {suffixes[guess[0]]}?" if guess else ""
    return (f"{name} is not a chainer_autoprof setting{hint} "
            "(all settings: python -m chainer_autoprof --help)")


def from_environ(environ: Mapping[str, str] | None = None,
                 overrides: Mapping[str, object] | None = None) -> Config:
    """Parse the ``CHAINER_PROF_*`` variables (then ``overrides``) into a Config.

    Raises :class:`SettingsError` with one line naming the variable, the value
    and what is accepted.
    """
    env = os.environ if environ is None else environ
    values: dict[str, object] = {}
    raws: dict[str, str] = {}
    explicit: set[str] = set()
    for key in sorted(env):
        if not key.startswith(PREFIX):
            continue
        setting = BY_ENV.get(key)
        if setting is None:
            raise SettingsError(unknown_variable_message(key))
        raw = env[key]
        try:
            values[setting.name] = setting.parse(raw)
        except ValueError as exc:
            raise _bad_value(setting, raw, str(exc)) from None
        raws[setting.name] = raw
        explicit.add(setting.name)
    for name, value in (overrides or {}).items():
        if name not in BY_NAME:
            raise SettingsError(f"unknown setting {name!r}; known: {', '.join(BY_NAME)}")
        setting = BY_NAME[name]
        if value is None:
            value = setting.default
        elif not isinstance(value, str):  # 7, True, (10, 20), a Path: checked as their text
            try:
                value = to_environ_value(setting, value)
            except Exception:  # any failure here is the one line raised below  # noqa: BLE001
                raise SettingsError(f"{name}={value!r} is not valid: accepted: "
                                    f"{setting.accepted}") from None
        if isinstance(value, str):
            raws[name] = text = value
            try:
                value = setting.parse(text)
            except ValueError as exc:
                raise _bad_value(setting, text, str(exc)) from None
        values[name] = value
        explicit.add(name)
    _check_trace_per_process(values, raws, env)
    return Config(values, frozenset(explicit))


def _check_trace_per_process(values: Mapping[str, Any], raws: Mapping[str, str],
                             env: Mapping[str, str]) -> None:
    """A trace path must name one file per process: its ``%q{VAR}`` variables set, and the
    ranks of one MPI job told apart (else one trace would be lost)."""
    template = values.get("trace")
    if not template:
        return
    unset = [name for name in variables(str(template)) if name not in env]
    if unset:  # it would expand to nothing: the same name in every process
        raise _bad_value(BY_NAME["trace"], raws.get("trace", str(template)),
                         f"a path whose %q{{VAR}} variables are all set ({', '.join(unset)} "
                         f"{'is' if len(unset) == 1 else 'are'} not set)")
    root = env.get(INTERNAL_PREFIX + "ROOT_PID", "").strip()
    if root and root != str(os.getpid()):
        return  # a child process: its trace goes beside its parent's, with .PID added
    problem = shared_trace(str(template), env, values.get("ranks"))
    if problem is not None:
        raise _bad_value(BY_NAME["trace"], raws.get("trace", str(template)), problem)


def to_environ_value(setting: Setting, value: Any) -> str:
    """Render a parsed value back to its environment form (for children)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if setting.name == "iterations":
        start, stop = value
        return f"{start}:{stop}"
    if setting.name == "ranks":
        return ",".join(str(r) for r in sorted(value))
    return str(value)


def markdown_table() -> str:
    """The README settings table."""
    rows = ["| Variable | Launcher flag | Values | Default | Meaning |",
            "|---|---|---|---|---|"]
    for s in SETTINGS:
        rows.append(f"| `{s.env}` | `{s.flag}` | {s.metavar.replace('|', ' / ')} "
                    f"| {s.default_text} | {s.doc} |")
    return "\n".join(rows)
