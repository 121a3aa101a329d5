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
* ``create_communicator``: the world rank becomes the process's MPI rank
  (for ``CHAINER_PROF_RANKS``, the NVTX ``rank N`` range and ``%r``).

A communication call inside another (an override calling ``super()``,
``allreduce_grad`` calling ``multi_node_mean_grad``, ``scatter_dataset``
calling ``bcast_obj``) gets no range of its own.  The end of the first
synchronizing collective is kept as the clock reference for ``merge``.
"""

from __future__ import annotations

from typing import Any, Callable

from .. import log, names, processes
from ..events import Tracer
from .base import Patch

#: Communicator methods that get a ``comm:<method>`` range.
COMM_METHODS = (
    "multi_node_mean_grad", "allreduce_grad", "bcast_data", "broadcast_data",
    "_multi_node_mean_grad_async",
    "allreduce", "bcast", "gather", "allgather", "alltoall", "scatter", "send", "recv",
    "send_obj", "recv_obj", "bcast_obj", "gather_obj", "allreduce_obj",
)

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


class ChainerMNPatches:
    """Builds the ChainerMN patch set, beside (and sharing wrappers with) the Chainer one."""

    def __init__(self, tracer: Tracer, chainer_patches: Any) -> None:
        self.tracer = tracer
        self.chainer_patches = chainer_patches

    def build(self, chainermn: Any) -> list[Patch]:
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
    def _wrap_comm(self, patch: Patch) -> Callable:
        tracer = self.tracer
        state, begin, end, clock = tracer.state, tracer.begin, tracer.end, tracer.clock
        info = tracer.info(names.comm_text(patch.attr.lstrip("_")), names.COMM)
        comm_category = names.COMM
        synchronizing = patch.attr in processes.SYNCHRONIZING
        note_end = processes.note_collective_end
        op = info.name

        def wrapper(wrapped, instance, args, kwargs):
            patch.hits += 1
            if not patch.on:
                return wrapped(*args, **kwargs)
            ts = state()
            stack = ts.stack
            if stack and stack[-1][0].category == comm_category:
                return wrapped(*args, **kwargs)  # inside another comm call
            try:
                tok = begin(info, ts)
            except Exception as exc:
                patch.fail(exc)
                return wrapped(*args, **kwargs)
            try:
                return wrapped(*args, **kwargs)
            finally:
                try:
                    end(tok, ts)  # at sync level 2 or more, after the GPU has finished
                    if synchronizing and processes.clock_reference() is None:
                        note_end(op, clock())
                except Exception as exc:
                    patch.fail(exc)

        return wrapper

    def _wrap_create_communicator(self, patch: Patch) -> Callable:
        def wrapper(wrapped, instance, args, kwargs):
            patch.hits += 1
            comm = wrapped(*args, **kwargs)
            if patch.on:
                try:
                    rank, size = _world_rank(comm)
                    if rank is not None:
                        processes.note_rank(rank, size)
                except Exception as exc:
                    patch.fail(exc)
            return comm

        return wrapper


def register_hook(agent: Any) -> None:
    """Instrument ChainerMN for ``agent`` when (or if already) it is imported.

    The patches join the Chainer patch set: the status report lists them and
    uninstalling restores them with the rest.
    """
    import wrapt

    def on_import(chainermn: Any) -> None:
        if not agent.active or agent.chainer is None:
            return  # Chainer itself runs uninstrumented
        patch_set = agent.patches
        if any(p.label.startswith("chainermn.") for p in patch_set.patches):
            return
        patches: list[Patch] = []
        try:
            patches = ChainerMNPatches(agent.tracer, patch_set).build(chainermn)
            for patch in patches:
                patch.apply()
                if patch.status == "failed":
                    log.warning(f"could not instrument {patch.label}: {patch.reason}")
            patch_set.patches.extend(patches)
        except Exception as exc:
            log.error(f"could not instrument ChainerMN ({type(exc).__name__}: {exc}); "
                      "its communication runs uninstrumented")
            for patch in reversed(patches):
                try:
                    patch.remove()
                except Exception:
                    pass

    wrapt.register_post_import_hook(on_import, "chainermn")


def _world_rank(comm: Any) -> tuple[int | None, int | None]:
    """The MPI world rank and size (the communicator's own when MPI says nothing)."""
    try:
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        return world.Get_rank(), world.Get_size()
    except Exception:
        pass
    try:
        return int(comm.rank), int(comm.size)
    except Exception:
        return None, None
