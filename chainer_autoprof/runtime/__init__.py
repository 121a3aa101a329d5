"""Runtime: events (ranges on threads, the training-loop state machine), policies, device.

Patches call the :class:`~.events.Tracer`; the tracer applies the sync and
capture-window policies and hands each range to the sinks it was given.
Nothing here knows Chainer, NVTX or how a run is reported.
"""
