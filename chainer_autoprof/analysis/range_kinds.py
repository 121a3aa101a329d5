"""What a range is to the analysis, by its name and category: one classification for all.

The aggregation of the ranges (:mod:`.aggregate`) and the attribution of GPU
work to them (:mod:`.gpu_attribution`) each keep, per range name, a kind (a
small int, held in int64 arrays and compared there) and a key (the link a
link's range, forward or backward, counts for; a user range's row).  Both take
them from :func:`range_kind`, so a new category is classified once, and number
the links the same way (:class:`LinkIds`).
"""

from __future__ import annotations

from ..common import names
from .stats import AGENT_OWN, PHASE_KEYS

#: Kinds of a range name.  ``K_PHASE0 + i``: the phase ``PHASE_KEYS[i]`` (data, forward,
#: backward, update), above every other kind.
#: ``K_WAIT``: the agent's wait for the GPU (its place, a ``PHASE_KEYS`` index, is per name).
K_OTHER, K_ITER, K_LINK, K_LINK_BWD, K_GC, K_QUIET, K_FUNCTION, K_WAIT = range(8)
#: What began as an iteration but reached no update (:data:`~..common.names.NO_UPDATE`): its
#: phases are not the next iteration's; otherwise time outside iterations, as inference.
K_NO_UPDATE = 8
#: A communication (ChainerMN's ``comm:*``): inside an iteration, a column of its own.
K_COMM = 9
K_PHASE0 = 10


def range_kind(name: str, category: str) -> tuple[int, str]:
    """The kind of range ``name`` of ``category`` and its key: a link's backward range is
    keyed by its forward range's text, a user range by ``user:NAME``, any other by its
    name."""
    if category == names.ITERATION:
        return K_ITER, name
    if category in names.PHASES:
        return K_PHASE0 + PHASE_KEYS.index(category), name
    if category == names.LINK:
        return K_LINK, name
    if category == names.LINK_BACKWARD:
        return K_LINK_BWD, names.link_forward_text(name)
    if category == names.INFERENCE and name == names.NO_UPDATE:
        return K_NO_UPDATE, name
    if category in (names.EXTENSION, names.INFERENCE):
        return K_QUIET, name
    if category == names.USER:
        return K_OTHER, f"user:{name}"
    if category == names.FUNCTION:
        return K_FUNCTION, name
    if category == names.GC:
        return K_GC, name
    if category == names.GPU_WAIT:
        return K_WAIT, name
    if category == names.COMM:
        return K_COMM, name
    if category == names.AGENT:  # the agent's own work: one outside key, whatever its name
        return K_OTHER, AGENT_OWN
    return K_OTHER, name


class LinkIds:
    """The links' keys in the order first seen (``keys``: a list that only grows, which
    readers may hold) and each one's id, its index there."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self._ids: dict[str, int] = {}

    def id_of(self, key: str) -> int:
        """The id of link ``key``, a new one the first time."""
        lid = self._ids.get(key)
        if lid is None:
            lid = self._ids[key] = len(self.keys)
            self.keys.append(key)
        return lid
