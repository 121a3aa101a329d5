"""Tables of the HTML page: a column that says nothing in any row is left out."""

from __future__ import annotations

from typing import Sequence


def drop_empty_columns(heads: Sequence[str], rows: Sequence[Sequence[str]],
                       empty: Sequence[str] = ("",)) -> tuple[list[str], list[list[str]]]:
    """``heads`` and ``rows`` without the columns whose every cell is one of ``empty`` (a
    column of dashes, as the GPU's per-phase verdict at sync level 2 and above, where the
    phases' GPU and host times are the same waits); the first column always stays."""
    keep = [0] + [c for c in range(1, len(heads))
                  if any(c < len(row) and row[c] not in empty for row in rows)]
    return ([heads[c] for c in keep],
            [[row[c] if c < len(row) else "" for c in keep] for row in rows])
