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

import dataclasses
import enum
import math
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, TypeVar, Union, get_args, get_origin

if sys.version_info >= (3, 9):  # Annotated: the declaring classes' (re-exported)
    from typing import Annotated as Annotated
    from typing import get_type_hints
else:  # Chainer's own dependency
    from typing_extensions import Annotated as Annotated
    from typing_extensions import get_type_hints
if sys.version_info >= (3, 11):  # a TypedDict's key qualifiers (the declaring classes')
    from typing import NotRequired, Required
else:
    from typing_extensions import NotRequired, Required

#: ``X | Y`` (Python 3.10 and later), as ``Union[X, Y]`` is.
_UNION_TYPES = (Union, getattr(types, "UnionType", Union))
_T = TypeVar("_T")

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
    #: The type :class:`~.stats.RunStats` holds a checked value as (None: as it is).
    to: type | None = None

    def check(self, value: object, where: str) -> object:
        """``value`` if it is of this kind, else :class:`MalformedError` naming ``where``."""
        return value

    def convert(self, value: Any) -> Any:
        """A checked value as :class:`~.stats.RunStats` holds it."""
        return value if self.to is None else self.to(value)


def of_type(value: object, where: str, cls: type[_T], said: str) -> _T:
    """``value`` if it is a ``cls``, else :class:`MalformedError`: ``where`` is not ``said``."""
    if not isinstance(value, cls):
        raise MalformedError(f"{where} is {shown(value)}, not {said}")
    return value


class Int(Kind):
    """A JSON integer in ``lo..hi`` (``true``/``false`` are not integers)."""

    to = int

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


class Number(Kind):
    """A finite JSON number in ``lo..hi``."""

    to = float

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


class Text(Kind):
    doc = "string"
    to = str

    def check(self, value: object, where: str) -> str:
        return of_type(value, where, str, "a string")


class Bool(Kind):
    doc = "true/false"

    def check(self, value: object, where: str) -> bool:
        return of_type(value, where, bool, "true/false")


class Object(Kind):
    """A JSON object whose content no reader looks into (or looks into with its own checks)."""

    doc = "object"

    def check(self, value: object, where: str) -> dict[str, object]:
        return of_type(value, where, dict, "an object")


class ListOf(Kind):
    """A JSON list whose items are all of one kind."""

    def __init__(self, item: Kind) -> None:
        self.item = item
        self.doc = f"list of {item.doc}" if type(item) is not Kind else "list"

    def check(self, value: object, where: str) -> list[object]:
        check = self.item.check
        return [check(item, f"{where}[{i}]")
                for i, item in enumerate(of_type(value, where, list, "a list"))]


class MapOf(Kind):
    """A JSON object whose keys are names (free) and whose values are all of one kind."""

    def __init__(self, item: Kind, key: str = "name") -> None:
        self.item = item
        self.doc = f"{{{key}: {item.doc}}}"

    def check(self, value: object, where: str) -> dict[str, object]:
        check = self.item.check
        return {name: check(item, f"{where}.{name}")
                for name, item in OBJECT.check(value, where).items()}

    def convert(self, value: Any) -> dict[str, Any]:
        convert = self.item.convert
        return {name: convert(item) for name, item in value.items()}


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
    #: A RunStats field: its type there, and its default in the run record.
    declared_type: Any = None
    record_default: Any = None
    record_by: By | None = None


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
        #: The class that declares it (:func:`section_of`), if any.
        self.cls: type | None = None

    def convert(self, value: Any) -> Any:
        """A checked object as its declaring class holds it (a dataclass: built; unknown
        keys left out, absent ones at the class's defaults)."""
        cls = self.cls
        if cls is not None and dataclasses.is_dataclass(cls) and not isinstance(value, cls):
            known = {f.name for f in dataclasses.fields(cls)}
            return cls(**{k: v for k, v in value.items() if k in known})
        return value

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
    maps of them (an object of a declaring dataclass as its JSON); anything else as given."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(kind, Section) and not kind.open and isinstance(value, Mapping):
        return kind.build(value, by, where, complete)
    if isinstance(kind, ListOf) and isinstance(value, list):
        return [_built(kind.item, item, by, f"{where}[{i}]", complete)
                for i, item in enumerate(value)]
    if isinstance(kind, MapOf) and isinstance(value, Mapping):
        return {key: _built(kind.item, item, by, f"{where}.{key}", complete)
                for key, item in value.items()}
    return value


# -- sections declared by the typed classes that carry them ----------------------------------------
class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


_UNSET: Any = _Unset()


@dataclass(frozen=True)
class F:
    """What a field's type does not say, beside it: ``x: Annotated[float, F("doc", "ms")]``.

    The kind is inferred from the type (``int``: an integer >= 0, ``float``: a number,
    ``str``, ``bool``, ``list[...]``, ``dict[str, ...]``, ``X | None``: nullable, a
    declared class: its section); ``kind`` only where the value is constrained further.
    Several ``F`` in one ``Annotated`` (an alias such as :data:`Ms` inside) are merged,
    the later winning.
    """

    doc: str = ""
    unit: str = ""
    kind: Kind | None = None
    #: Who writes it (the run record's fields; ``None``: the writers of the object).
    by: By | None = None
    required: bool | None = None
    #: A reader's value when absent or null (:data:`NEEDED`: the object is damaged).
    default: Any = _UNSET
    nullable: bool | None = None
    lazy: bool | None = None
    #: What a ``dict[str, ...]``'s keys are, in the documentation.
    key: str | None = None
    #: Where the run record holds :class:`~.stats.RunStats`' field of this name (declared there,
    #: with its writer; one declared with a writer and placed nowhere comes at the end).
    stats: bool = False


#: A time in milliseconds (>= 0), in nanoseconds.
Ms = Annotated[float, F(unit="ms", kind=NON_NEGATIVE)]
Ns = Annotated[int, F(unit="ns")]


def merged(items: Sequence[F]) -> F:
    """The ``F`` s of one field, the later's values over the earlier's."""
    out: dict[str, Any] = {}
    for item in items:
        for name, f in F.__dataclass_fields__.items():
            value = getattr(item, name)
            if value is not f.default:
                out[name] = value
    return F(**out)


def shape(*, open: bool = False, null_is_absent: bool = True, keep_only: bool = False,
          ordered: bool = True, defaults: bool = False,
          stats: bool = False) -> Callable[[type[T]], type[T]]:
    """Class decorator: how the section a class declares is read and written
    (:class:`Section`'s options); ``defaults``: a dataclass's defaults are its readers'
    (a field without one is needed), its ``F(default=...)`` the run record's; ``stats``:
    each field is the :class:`~.stats.RunStats` attribute of its name."""
    def mark(cls: type[T]) -> type[T]:
        cls.__shape__ = {"open": open, "null_is_absent": null_is_absent,  # type: ignore[attr-defined]
                         "keep_only": keep_only, "ordered": ordered}
        cls.__shape_defaults__ = defaults  # type: ignore[attr-defined]
        cls.__shape_stats__ = stats  # type: ignore[attr-defined]
        return cls
    return mark


T = TypeVar("T")
_SECTIONS: dict[type, Section] = {}


def is_declared(tp: object) -> bool:
    """Whether ``tp`` is a class that declares a section (a dataclass or a TypedDict)."""
    return isinstance(tp, type) and (dataclasses.is_dataclass(tp) or (
        issubclass(tp, dict) and hasattr(tp, "__total__")))


def section_of(cls: type, *, stats: Section | None = None) -> Section:
    """THE section a class declares: its fields in order, each field's kind from its type,
    the rest from its ``F`` (the class's docstring's first line is the section's doc).

    ``stats``: the section a field marked ``F(stats=True)`` is taken from (the run record's
    fields that are RunStats'); its type must be the same there.
    """
    known = _SECTIONS.get(cls)
    if known is not None:
        return known
    hints = get_type_hints(cls, include_extras=True)
    own_defaults = bool(getattr(cls, "__shape_defaults__", False))
    own_stats = bool(getattr(cls, "__shape_stats__", False))
    if dataclasses.is_dataclass(cls):
        defaults = {f.name: f for f in dataclasses.fields(cls)}
        order = list(defaults)
    else:
        defaults, order = {}, list(hints)
    total = bool(getattr(cls, "__total__", True))
    fields: list[Field] = []
    for name in order:
        tp, qualifier = _unqualified(hints[name])
        meta = merged(_metadata(tp))
        if qualifier is Required and not total and meta.default is _UNSET:
            # the one key a reader of a ``total=False`` class may count on: it needs it
            meta = dataclasses.replace(meta, default=NEEDED)
        if meta.stats:
            if stats is None or name not in stats.by_name:
                raise TypeError(f"{cls.__name__}.{name}: no statistics field of that name")
            fields.append(_shared(stats.by_name[name], tp, meta))
            continue
        kind, nullable = kind_of(tp, meta.key)
        default = None if meta.default is _UNSET else meta.default
        record_default = default
        if own_defaults:
            record_default = default if meta.default is not _UNSET else \
                _class_default(defaults[name], None)
            default = _class_default(defaults[name], NEEDED)
        fields.append(Field(name, meta.kind or kind, meta.doc, meta.unit,
                            by=None if own_stats else meta.by, record_by=meta.by,
                            required=True if meta.required is None else meta.required,
                            default=default,
                            nullable=nullable if meta.nullable is None else meta.nullable,
                            lazy=bool(meta.lazy), declared_type=tp,
                            record_default=record_default, stats=name if own_stats else None))
    if stats is not None:  # the statistics' other record fields, after the declared ones
        placed = {f.name for f in fields}
        fields += [_shared(f, f.declared_type, F()) for f in stats.fields
                   if f.record_by is not None and f.name not in placed]
    doc = (cls.__doc__ or cls.__name__).strip().split("\n\n")[0]
    doc = " ".join(doc.split()).rstrip(".")
    if doc[1:2].islower():  # "One GPU" -> "one GPU" (a kind's doc reads it inside a phrase)
        doc = doc[:1].lower() + doc[1:]
    section = Section(fields, doc=doc, **getattr(cls, "__shape__", {}))
    section.cls = cls
    _SECTIONS[cls] = section
    return section


def _class_default(f: dataclasses.Field[Any], none: Any) -> Any:
    """A dataclass field's default (``none`` where it has none)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return none if f.default is dataclasses.MISSING else f.default


def _shared(f: Field, tp: object, meta: F) -> Field:
    """The run record's field that is a RunStats' one: its declaration there, with what the
    record says of its own (who writes it, always or not, its default)."""
    stats_tp = f.declared_type
    if _strip(stats_tp) != _strip(tp):
        raise TypeError(f"{f.name}: {tp} here, {stats_tp} in the statistics")
    if f.record_by is None:
        raise TypeError(f"{f.name}: the statistics' field names no writer (F(by=...))")
    return dataclasses.replace(f, by=f.record_by, stats=f.name,
                               required=f.required if meta.required is None else meta.required,
                               default=f.record_default, lazy=False)


def _metadata(tp: object) -> list[F]:
    """The ``F`` s beside a type; plain strings there, for classes declared below this layer:
    the doc, then the unit (``Annotated[int, "doc", "ns"]`` as ``F("doc", "ns")``)."""
    meta = getattr(tp, "__metadata__", ())
    texts = [m for m in meta if isinstance(m, str)] + ["", ""]
    own = [F(texts[0], texts[1])] if texts[0] else []
    return own + [m for m in meta if isinstance(m, F)]


def _unqualified(tp: object) -> tuple[object, object]:
    """A TypedDict key's type without ``Required``/``NotRequired``, and which of them it had
    (``None``: neither)."""
    origin = get_origin(tp)
    if origin is Required or origin is NotRequired:
        return get_args(tp)[0], origin
    return tp, None


def _strip(tp: object) -> object:
    """``tp`` without its ``Annotated`` parts (at the top)."""
    return get_args(tp)[0] if get_origin(tp) is Annotated else tp


def kind_of(tp: object, key: str | None = None) -> tuple[Kind, bool]:
    """The kind a type says, and whether null is one of its values."""
    meta = merged(_metadata(tp))
    tp = _strip(tp)
    origin, args = get_origin(tp), get_args(tp)
    if origin in _UNION_TYPES and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        kind, _ = kind_of(rest[0] if len(rest) == 1 else Any, key)
        return meta.kind or kind, True
    if meta.kind is not None:
        return meta.kind, False
    if tp is bool:
        return BOOL, False
    if tp is int:
        return INT, False
    if tp is float:
        return NUMBER, False
    if tp is str:
        return TEXT, False
    if origin is list:
        return (ListOf(kind_of(args[0])[0]) if args and args[0] is not Any
                else ListOf(ANY)), False
    if origin is dict or tp is dict:
        if not args or args[1] in (Any, object):
            return OBJECT, False
        return MapOf(kind_of(args[1])[0], key=key or meta.key or "name"), False
    if is_declared(tp):
        return section_of(tp), False  # type: ignore[arg-type]
    return ANY, False
