"""What a step is in a training loop without an updater, when it updates several optimizers.

A loop of the program's own has no ``Updater.update`` to say where an
iteration ends: it ends when the step's last optimizer update returns.  With
one optimizer that is every update.  With several (a GAN's discriminator and
generator, an encoder's and a decoder's, one per parameter group) an update
ends the step unless another optimizer is still *owed* an update: one whose
model (its target, a link holding it or a link inside it) was called in this
step and that has not updated in it yet.  Two events end a step that waits in
vain (a frozen model whose old optimizer is still alive): what begins a step
comes round again (a batch from the iterator that began the last step, the
forward of the model that began this one: :meth:`Steps.begins_again`), or an
optimizer updates a second time; either way the optimizers it waited for are
no longer waited for until they update again.

The per-thread part (links called, optimizers updated) lives on the thread's
``ThreadState`` (``step_links``, ``step_optimizers``), which the tracer clears
when an iteration ends; what is process-wide (the optimizers set up, those
not waited for) lives here, held weakly.  Nothing here runs per Link call
unless two optimizers or more were set up; what runs per update is a few set
lookups, and a walk over the links of the models involved.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Iterable

from ..runtime.events import ThreadState, Tracer

if TYPE_CHECKING:
    import chainer

#: Outermost links a step remembers (those called beyond are not looked at).
MAX_STEP_LINKS = 64


def _holds(outer: object, inner: object) -> bool:
    """Whether link ``inner`` is ``outer`` or one of its descendants."""
    links = getattr(outer, "links", None)
    if links is None:
        return False
    try:
        return any(link is inner for link in links())
    except Exception:  # noqa: BLE001
        return False  # a link of the program's that cannot list its children: unrelated


def related(link: chainer.Link, target: object) -> bool:
    """Whether calling ``link`` involves ``target`` (one holds the other, or they are one)."""
    return link is target or _holds(link, target) or _holds(target, link)


class Steps:
    """The optimizers set up in this process, and which of them a step waits for."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.optimizers: weakref.WeakSet[chainer.Optimizer] = weakref.WeakSet()
        self.not_waited: weakref.WeakSet[chainer.Optimizer] = weakref.WeakSet()
        #: Two optimizers or more were set up: steps need to know which links they call.
        self.many = False

    def set_up(self, optimizer: chainer.Optimizer) -> None:
        """``optimizer.setup(link)`` returned."""
        self.optimizers.add(optimizer)
        self.many = len(self.optimizers) > 1

    def called(self, ts: ThreadState, link: chainer.Link) -> None:
        """An outermost link was called on ``ts`` (only while :attr:`many`); held weakly (a
        step that never ends, as an evaluation's, keeps no model alive)."""
        seen = ts.step_links
        if len(seen) < MAX_STEP_LINKS and id(link) not in seen:
            try:
                seen[id(link)] = weakref.ref(link)
            except TypeError:
                pass  # a link that cannot be referenced weakly: not looked at

    def updating(self, ts: ThreadState, optimizer: chainer.Optimizer) -> bool:
        """``optimizer`` updates in the step open on ``ts``; whether it already did."""
        done = ts.step_optimizers
        key = id(optimizer)
        again = key in done
        done.add(key)
        if self.not_waited:
            self.not_waited.discard(optimizer)
        return again

    def owed(self, ts: ThreadState) -> list[chainer.Optimizer]:
        """The optimizers the step open on ``ts`` still waits for."""
        if not self.many or not ts.step_links:
            return []
        done = ts.step_optimizers
        links = [link for link in (ref() for ref in list(ts.step_links.values()))
                 if link is not None]
        owed = []
        for optimizer in list(self.optimizers):
            if id(optimizer) in done or optimizer in self.not_waited:
                continue
            target = getattr(optimizer, "target", None)
            if target is not None and any(related(link, target) for link in links):
                owed.append(optimizer)
        return owed

    def wait_no_longer(self, optimizers: Iterable[chainer.Optimizer]) -> None:
        """A step waited in vain for these: later steps end without them."""
        for optimizer in optimizers:
            self.not_waited.add(optimizer)

    def after_update(self, ts: ThreadState, again: bool) -> None:
        """The outermost update of the implicit iteration open on ``ts`` returned (or raised):
        end the step, unless another optimizer is still owed an update."""
        owed = self.owed(ts)
        if again:  # an optimizer updates twice: a new step began in this one
            self.wait_no_longer(owed)
        elif owed:
            ts.iter_owed = True
            return
        self.tracer.end_iteration(ts)

    def evaluation(self, ts: ThreadState) -> None:
        """The implicit iteration open on ``ts`` began with batches from elsewhere than the
        loop's steps get theirs, and a test-mode forward comes before any training: an
        evaluation (a test set converted in training mode, evaluated in test mode), no
        step.  It ends here."""
        self.tracer.end_iteration(ts)

    def begins_again(self, ts: ThreadState) -> None:
        """The step open on ``ts`` waits for an update, and what begins a step comes again
        (a batch from the loop's iterator, the forward of the model that began the step): that
        step is over, and the next one begins."""
        self.wait_no_longer(self.owed(ts))
        self.tracer.end_iteration(ts)
