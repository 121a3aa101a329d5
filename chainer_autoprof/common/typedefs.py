"""The type aliases the layers share, so that ``Any`` is named once, with its reason.

mypy runs strict over the package (pyproject.toml, docs/DESIGN.md "Typing").
``Any`` is right only where the value really is arbitrary: the arguments and
results of the user's own functions, and the objects of Chainer, CuPy and
CUPTI, which ship no types.  Each alias below says which of these it is;
everything else gets a precise type.
"""

from __future__ import annotations

import sys
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    List,
    Mapping,
    Tuple,
    TypedDict,
    Union,
)

if sys.version_info >= (3, 9):
    from typing import Annotated
else:  # Chainer's own dependency
    from typing_extensions import Annotated

if TYPE_CHECKING:  # NumPy is not imported at start-up (the .pth hook imports this package)
    import numpy as np
    from numpy.typing import NDArray

    #: Recorded ranges, ``(n, 4)`` int64 rows: (name index, t0 ns, t1 ns,
    #: depth | iteration << DEPTH_BITS), a thread's block as the recorder hands it on.
    RangeRows = NDArray[np.int64]

#: Positional arguments of a patched call: the user's (or Chainer's) values, arbitrary.
Args = Tuple[Any, ...]
#: Keyword arguments of a patched call: the user's values, arbitrary.
Kwargs = Dict[str, Any]
#: A function or method we wrap or call back: its signature is the user's or the library's.
AnyFunction = Callable[..., Any]

#: A value as JSON holds it (trace files, run records, the dump server's answers).
JsonValue = Union[None, bool, int, float, str, List["JsonValue"], Dict[str, "JsonValue"]]
#: A JSON object.
JsonObject = Dict[str, JsonValue]
#: More ``args`` of the trace's ranges, by (thread id, start ns): what a collection freed,
#: the External id a GPU operation's launching range gets.
RangeArgs = Mapping[Tuple[int, int], Mapping[str, object]]
#: The facts the patches note about a run (libraries' settings, batch size, iterator...),
#: kept in the run record: JSON values whose shape each reader checks where it reads them.
Facts = Dict[str, Any]


class GcTotals(TypedDict):
    """Garbage collections (runtime/gc_ranges.py).

    Per generation (0, 1, 2): the run record's ``gc`` fact as ``runtime/gc_ranges.py``
    counts it and the advice reads it, declared here once (``analysis/facts.py`` derives
    its check and documentation from the docs beside each type).
    """

    collections: Annotated[List[int], "collections per generation"]
    collected: Annotated[List[int], "objects freed per generation"]
    uncollectable: Annotated[List[int], "uncollectable objects found per generation"]
    ms: Annotated[List[float], "time in collections per generation (ms)"]
    ranges: Annotated[List[int], "collections recorded as ranges per generation"]
    unranged: Annotated[int, "collections outside any recorded range (no range of their own)"]
