"""What is wrapped in ChainerMN, and how each call maps to ranges.

Targets (each a :class:`~.base.Patch`):

* ``CommunicatorBase`` methods and every subclass's own override: a
  ``comm:<method>`` range for the gradient all-reduce (``multi_node_mean_grad``,
  ``allreduce_grad``), the parameter broadcast (``bcast_data``,
  ``broadcast_data``), the collectives and point-to-point calls on arrays and
  objects (``allreduce``, ``bcast``, ``gather``, ``allgather``, ``alltoall``,
  ``scatter``, ``send``, ``recv``, ``*_obj``).
* ``scatter_dataset`` and ``scatter_index``: ``comm:scatter_dataset`` /
  ``comm:scatter_index``, the data broadcast.
* ``_MultiNodeOptimizer.update`` and ``_DoubleBufferingOptimizer.update``: an
  optimizer update, with the same wrapper as Chainer's ``Optimizer.update``:
  the loss call is the forward phase, the update phase starts when the
  backward returns (so the gradient all-reduce lies inside it), and without
  an updater the iteration closes when this update returns.
* ``create_communicator``: the world rank is handed to ``on_rank`` (the
  agent makes it the process's MPI rank: ``CHAINER_PROF_RANKS``, the NVTX
  ``rank N`` range, ``%r``).

A communication call inside another (an override calling ``super()``,
``allreduce_grad`` calling ``multi_node_mean_grad``, ``scatter_dataset``
calling ``bcast_obj``) gets no range of its own.  The end of the first
synchronizing collective is kept as the clock reference for ``merge``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ..common import names, rank
from ..runtime.events import Tracer
from .base import Around, Instrumentor, Patch

if TYPE_CHECKING:
    from ..common.typedefs import Args, Kwargs

#: Communicator methods that get a ``comm:<method>`` range.
COMM_METHODS = (
    "multi_node_mean_grad", "allreduce_grad", "bcast_data", "broadcast_data",
    "_multi_node_mean_grad_async",
    "allreduce", "bcast", "gather", "allgather", "alltoall", "scatter", "send", "recv",
    "send_obj", "recv_obj", "bcast_obj", "gather_obj", "allreduce_obj",
)

#: Communicator operations after which every rank has arrived (the clock reference).
SYNCHRONIZING = frozenset({"multi_node_mean_grad", "allreduce_grad", "allreduce",
                           "allreduce_obj", "allgather", "alltoall"})

#: Functions of ``chainermn.datasets.scatter`` re-exported by their package and by ``chainermn``.
DATASET_FUNCTIONS = ("scatter_dataset", "scatter_index")


class AliasedPatch(Patch):
    """A patch on a module function that other modules re-export: the re-exports follow."""

    def __init__(self, *args: Any, aliases: tuple[Any, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.aliases = aliases
        self._set: list[tuple[Any, Any]] = []  # (module, original)

    def apply(self) -> None:
        original = getattr(self.owner, self.attr, None)
        super().apply()
        wrapped = getattr(self.owner, self.attr, None)
        if self.status != "patched" or wrapped is original:
            return
        for module in self.aliases:
            if module.__dict__.get(self.attr) is original:
                setattr(module, self.attr, wrapped)
                self._set.append((module, original))

    def remove(self) -> None:
        for module, original in reversed(self._set):
            setattr(module, self.attr, original)
        self._set.clear()
        super().remove()


class ChainerMNPatches(Instrumentor):
    """The ChainerMN patch set, beside (and sharing wrappers with) the Chainer one.

    ``on_rank(rank, size)`` is called with the world rank of each communicator
    created.
    """

    library = "chainermn"
    name = "ChainerMN"
    requires = ("chainer",)

    def __init__(self, tracer: Tracer, chainer_patches: Any,
                 on_rank: Callable[[int, int | None], Any]) -> None:
        super().__init__(tracer.hotpath)
        self.tracer = tracer
        self.chainer_patches = chainer_patches
        self.on_rank = on_rank

    def targets(self, chainermn: Any) -> list[Patch]:
        # ChainerMN's submodules, once ChainerMN itself is imported
        from chainermn import communicators, datasets, optimizers
        from chainermn.communicators import communicator_base
        from chainermn.datasets import scatter

        base = communicator_base.CommunicatorBase
        patches: list[Patch] = [
            Patch(f"CommunicatorBase.{method}", base, method, self._wrap_comm, subclasses=True)
            for method in COMM_METHODS]
        patches += [AliasedPatch(f"chainermn.{func}", scatter, func, self._wrap_comm,
                                 aliases=(datasets, chainermn))
                    for func in DATASET_FUNCTIONS]
        wrap_update = self.chainer_patches._wrap_optimizer
        for cls_name in ("_MultiNodeOptimizer", "_DoubleBufferingOptimizer"):
            cls = getattr(optimizers, cls_name, None)
            if cls is not None:
                patches.append(Patch(f"{cls_name}.update", cls, "update", wrap_update))
        patches.append(AliasedPatch("chainermn.create_communicator", communicators,
                                    "create_communicator", self._wrap_create_communicator,
                                    aliases=(chainermn,)))
        return patches


    # -- wrappers -----------------------------------------------------------
    def _wrap_comm(self, patch: Patch) -> Around:
        tracer = self.tracer
        state, begin, end, clock = tracer.state, tracer.begin, tracer.end, tracer.clock
        info = tracer.info(names.comm_text(patch.attr.lstrip("_")), names.COMM)
        comm_category = names.COMM
        synchronizing = patch.attr in SYNCHRONIZING
        note_end = rank.note_collective_end
        op = info.name

        def enter(instance: Any, args: Args, kwargs: Kwargs) -> Any:
            ts = state()
            stack = ts.stack
            if stack and stack[-1][0].category == comm_category:
                return None  # inside another comm call
            return (ts, begin(info, ts))  # an error: the hook turns off, the call goes on

        def exit(st: Any, result: Any, exc: BaseException | None) -> None:
            ts, tok = st
            try:
                end(tok, ts)  # at sync level 2 or more, after the GPU has finished
                if synchronizing and rank.clock_reference() is None:
                    note_end(op, clock())
            except Exception as err:  # our error: reported once, the program's call goes on  # noqa: BLE001
                patch.fail(err)

        return Around(enter, exit)

    def _wrap_create_communicator(self, patch: Patch) -> Around:
        on_rank = self.on_rank

        def enter(instance: Any, args: Args, kwargs: Kwargs) -> Any:
            return True

        def exit(st: Any, comm: Any, exc: BaseException | None) -> None:
            if exc is None and patch.on:
                try:
                    number, size = _world_rank(comm)
                    if number is not None:
                        on_rank(number, size)
                except Exception as err:  # our error: reported once, the program's call goes on  # noqa: BLE001
                    patch.fail(err)

        return Around(enter, exit)


def _world_rank(comm: Any) -> tuple[int | None, int | None]:
    """The MPI world rank and size (the communicator's own when MPI says nothing)."""
    try:
        from mpi4py import MPI  # ChainerMN initialized MPI already: never the agent first

        world = MPI.COMM_WORLD
        return world.Get_rank(), world.Get_size()
    except Exception:  # no MPI: the rank stays unknown  # noqa: BLE001
        pass
    try:
        return int(comm.rank), int(comm.size)
    except Exception:  # a communicator without rank/size: unknown  # noqa: BLE001
        return None, None
