"""Declared shapes of the JSON a trace holds: kinds of value, fields, sections.

Trace files are the agent's own, but they are read back later (``report``,
``report --html``, ``merge``), perhaps truncated, edited or damaged.  Every
value a reader uses is checked once, at the boundary, against its declared
kind (:mod:`.record` declares the run record with these, the trace-event codec
its events), so that a damaged file gives one line naming the field and what
it should be (:class:`MalformedError`), never a traceback from deeper in, and
no ``NaN`` or ``Infinity`` reaches a figure.

A kind checks a value (:meth:`Kind.check`: the value as a reader may use it,
or :class:`MalformedError`), converts a checked value for :class:`~.stats.RunStats`
(:meth:`Kind.convert`) and says what it is in the documentation (:attr:`Kind.doc`).
A :class:`Section` is an object of declared :class:`Field` s: readers check it,
writers build it (an undeclared key or a missing one is a bug, :class:`RecordError`).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

#: Bounds of a time in a trace (microseconds): 31 years; beyond, the nanosecond
#: values would not fit the int64 arithmetic of the aggregation.
MAX_US = 1e15
#: Bound of any count or nanosecond figure (int64).
MAX_INT = (1 << 62) - 1


class MalformedError(ValueError):
    """A value that is not what the agent writes: ``str(err)`` is the one line to show."""


def shown(value: object) -> str:
    """``value`` as an error line shows it (cut to 40 characters)."""
    try:
        text = repr(value)
    except ValueError:  # an integer past the interpreter's digit limit
        text = "an integer of over 4300 digits"
    return text if len(text) <= 40 else text[:37] + "..."


class Kind:
    """A kind of JSON value: checked, converted, documented."""

    doc = "any JSON value"

    def check(self, value: object, where: str) -> object:
        """``value`` if it is of this kind, else :class:`MalformedError` naming ``where``."""
        return value

    def convert(self, value: Any) -> Any:
        """A checked value as :class:`~.stats.RunStats` holds it."""
        return value


class Int(Kind):
    """A JSON integer in ``lo..hi`` (``true``/``false`` are not integers)."""

    def __init__(self, lo: int = 0, hi: int = MAX_INT) -> None:
        self.lo, self.hi = lo, hi
        if hi != MAX_INT:
            self.doc = f"integer {lo}..{hi}"
        elif lo == 0:
            self.doc = "integer >= 0"
        elif lo == -MAX_INT:
            self.doc = "integer"
        else:
            self.doc = f"integer >= {lo}"

    def check(self, value: object, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise MalformedError(f"{where} is {shown(value)}, not an integer")
        if not self.lo <= value <= self.hi:
            raise MalformedError(f"{where} is {shown(value)}, out of range")
        return value

    def convert(self, value: Any) -> int:
        return int(value)


class Number(Kind):
    """A finite JSON number in ``lo..hi``."""

    def __init__(self, lo: float = -MAX_INT, hi: float = MAX_INT) -> None:
        self.lo, self.hi = lo, hi
        self.doc = "number >= 0" if lo == 0 else "number"

    def check(self, value: object, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise MalformedError(f"{where} is {shown(value)}, not a number")
        # an integer is compared as it is: a JSON integer past a float's range (10**400)
        # cannot be converted, and ``isfinite`` would raise on it
        if (isinstance(value, float) and not math.isfinite(value)) \
                or not self.lo <= value <= self.hi:
            raise MalformedError(f"{where} is {shown(value)}, out of range")
        return value

    def convert(self, value: Any) -> float:
        return float(value)


class Text(Kind):
    doc = "string"

    def check(self, value: object, where: str) -> str:
        if not isinstance(value, str):
            raise MalformedError(f"{where} is {shown(value)}, not a string")
        return value

    def convert(self, value: Any) -> str:
        return str(value)


class Bool(Kind):
    doc = "true/false"

    def check(self, value: object, where: str) -> bool:
        if not isinstance(value, bool):
            raise MalformedError(f"{where} is {shown(value)}, not true/false")
        return value


class Object(Kind):
    """A JSON object whose content no reader looks into (or looks into with its own checks)."""

    doc = "object"

    def check(self, value: object, where: str) -> dict[str, object]:
        if not isinstance(value, dict):
            raise MalformedError(f"{where} is {shown(value)}, not an object")
        return value


class ListOf(Kind):
    """A JSON list whose items are all of one kind."""

    def __init__(self, item: Kind) -> None:
        self.item = item
        self.doc = f"list of {item.doc}" if type(item) is not Kind else "list"

    def check(self, value: object, where: str) -> list[object]:
        if not isinstance(value, list):
            raise MalformedError(f"{where} is {shown(value)}, not a list")
        check = self.item.check
        return [check(item, f"{where}[{i}]") for i, item in enumerate(value)]


class MapOf(Kind):
    """A JSON object whose keys are names (free) and whose values are all of one kind."""

    def __init__(self, item: Kind, key: str = "name") -> None:
        self.item = item
        self.doc = f"{{{key}: {item.doc}}}"

    def check(self, value: object, where: str) -> dict[str, object]:
        check = self.item.check
        return {name: check(item, f"{where}.{name}")
                for name, item in OBJECT.check(value, where).items()}

    def convert(self, value: Any) -> dict[str, Any] | None:
        return dict(value) if value else None


class Window(Kind):
    """``[START, STOP]``: a capture window of iterations."""

    doc = "[START, STOP]"

    def check(self, value: object, where: str) -> list[int]:
        pair = ListOf(Kind()).check(value, where)
        if len(pair) != 2:
            raise MalformedError(f"{where} is {shown(value)}, not [START, STOP]")
        start, stop = Int().check(pair[0], f"{where}[0]"), Int().check(pair[1], f"{where}[1]")
        if stop <= start:
            raise MalformedError(f"{where} is {shown(value)}: STOP is not after START")
        return [start, stop]


class Triple(Kind):
    """``[what, ms, phase]``: one row of a slow iteration's details."""

    def __init__(self, what: str, first: Kind) -> None:
        self.what, self.first = what, first
        self.doc = f"[{what}, ms, phase]"

    def check(self, value: object, where: str) -> list[object]:
        if not isinstance(value, list) or len(value) != 3:
            raise MalformedError(f"{where} is {shown(value)}, not [{self.what}, ms, phase]")
        self.first.check(value[0], f"{where}[0]")
        Number(0).check(value[1], f"{where}[1]")
        Text().check(value[2], f"{where}[2]")
        return value


class Checked(Kind):
    """A kind checked by a function (for shapes no other kind says)."""

    def __init__(self, doc: str, check: Callable[[object, str], object]) -> None:
        self.doc = doc
        self._check = check

    def check(self, value: object, where: str) -> object:
        return self._check(value, where)


#: The kinds most fields use (kinds hold no state: one object each is enough).
ANY = Kind()
INT = Int()
SIGNED = Int(-MAX_INT)
NUMBER = Number()
NON_NEGATIVE = Number(0)
TEXT = Text()
BOOL = Bool()
OBJECT = Object()
#: ``{key: [number, ...]}``: a series per key (e.g. per phase).
SERIES = MapOf(ListOf(NUMBER), key="key")


# -- declared fields and sections ----------------------------------------------------------------
class By(enum.Flag):
    """Who writes a field of the run record."""

    #: The final trace, written at the end of the run.
    EXIT = enum.auto()
    #: The trace so far (``TRACE.partial``): the metadata its background writer appends.
    SO_FAR = enum.auto()
    #: The trace so far read back: what its reader adds from the file's other records.
    READ = enum.auto()
    #: A merged trace (``merge``).
    MERGE = enum.auto()
    #: The statistics of the running process only (the summary at exit), never in a file.
    LIVE = enum.auto()


#: Short names of the writers, as the documentation shows them.
BY_NAMES = {By.EXIT: "exit", By.SO_FAR: "so far", By.READ: "read", By.MERGE: "merge",
            By.LIVE: "live"}


def by_text(by: By) -> str:
    """``by`` as the documentation shows it (``exit, so far``)."""
    return ", ".join(text for flag, text in BY_NAMES.items() if flag in by)


class _Needed:
    def __repr__(self) -> str:
        return "NEEDED"


#: The ``default`` of a field no reader can do without: absent or null is an error.
NEEDED: Any = _Needed()


class RecordError(Exception):
    """A record built by one of the agent's writers does not match its declaration: a bug
    (every test that writes a trace catches it)."""


@dataclass(frozen=True)
class Field:
    """One field of a declared object: the declaration every writer and reader derives from."""

    name: str
    kind: Kind
    #: One line: what it holds (the documentation's).
    doc: str
    #: Unit of a figure (``ns``, ``ms``, ``us``, ``s``), else empty.
    unit: str = ""
    #: Who writes it; ``None``: the writers of the object that holds it.
    by: By | None = None
    #: Whether every object its writers write has it (else: only when there is something to say).
    required: bool = True
    #: A reader's value when it is absent or null; :data:`NEEDED`: then the object is damaged.
    default: Any = None
    #: The :class:`~.stats.RunStats` attribute it feeds, if any.
    stats: str | None = None
    #: Whether null is a value of its own here (only matters where null is not "absent").
    nullable: bool = False
    #: Checked only where a reader uses it (its own check), not with the object that holds it.
    lazy: bool = False


class Section(Kind):
    """A JSON object with declared fields.

    Reading (:meth:`check`): each declared field present is checked against its
    kind; undeclared keys are kept (older or newer writers).  Where
    ``null_is_absent`` (the run record), a null field counts as absent, and is
    removed when the field has a default (readers take it with the default).
    Writing (:meth:`build`): the keys a writer gives must be declared for it,
    and (``complete``) every field it must write be there.
    """

    def __init__(self, fields: Sequence[Field], *, doc: str = "object", open: bool = False,
                 null_is_absent: bool = True, keep_only: bool = False,
                 ordered: bool = True) -> None:
        self.fields = tuple(fields)
        self.by_name = {f.name: f for f in self.fields}
        if len(self.by_name) != len(self.fields):
            raise ValueError("a field is declared twice")
        self.doc = doc
        #: Writers may put keys of their own here (a layout owned elsewhere).
        self.open = open
        self.null_is_absent = null_is_absent
        #: Read back as the declared fields only (e.g. a saved ``LinkStat``).
        self.keep_only = keep_only
        #: Written in declared order (else in the writer's: facts, in the order they were seen).
        self.ordered = ordered

    def check(self, value: object, where: str) -> dict[str, object]:
        data = OBJECT.check(value, where)
        out: dict[str, object] = {} if self.keep_only else dict(data)
        for f in self.fields:
            if f.name not in data:
                if f.default is NEEDED:
                    raise MalformedError(f"{where} has no {f.name}")
                continue
            item = data[f.name]
            if item is None:
                if f.default is NEEDED:
                    raise MalformedError(f"{where} has no {f.name}")
                if self.null_is_absent or f.nullable:
                    if f.default is not None:
                        out.pop(f.name, None)
                    elif self.keep_only:
                        out[f.name] = None
                    continue
            out[f.name] = OBJECT.check(item, f"{where}.{f.name}") if f.lazy else \
                f.kind.check(item, f"{where}.{f.name}")
        return out

    def build(self, values: Mapping[str, Any], by: By, where: str,
              complete: bool = True) -> dict[str, Any]:
        """The object writer ``by`` writes (in declared order where ``ordered``);
        :class:`RecordError` for an undeclared key, one ``by`` does not write, or
        (``complete``) a missing one."""
        for key in values:
            f = self.by_name.get(key)
            if f is None:
                raise RecordError(f"{where}.{key} is not declared")
            if f.by is not None and not f.by & by:
                raise RecordError(f"{where}.{key} is not written by {by_text(by)}")
        out: dict[str, Any] = {}
        for f in self.fields:
            writers = by if f.by is None else f.by & by
            if f.name in values:
                out[f.name] = _built(f.kind, values[f.name], writers, f"{where}.{f.name}",
                                     complete)
            elif complete and f.required and writers:
                raise RecordError(f"{where}.{f.name} is missing (written by "
                                  f"{by_text(writers)})")
        return out if self.ordered else {key: out[key] for key in values}


def _built(kind: Kind, value: object, by: By, where: str, complete: bool) -> Any:
    """``value`` as a writer's object holds it: declared sections checked, through lists and
    maps of them; anything else as given."""
    if isinstance(kind, Section) and not kind.open and isinstance(value, Mapping):
        return kind.build(value, by, where, complete)
    if isinstance(kind, ListOf) and isinstance(value, list):
        return [_built(kind.item, item, by, f"{where}[{i}]", complete)
                for i, item in enumerate(value)]
    if isinstance(kind, MapOf) and isinstance(value, Mapping):
        return {key: _built(kind.item, item, by, f"{where}.{key}", complete)
                for key, item in value.items()}
    return value
