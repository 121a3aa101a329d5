"""The agent, the composition root: settings -> tracer + sinks + patch sets + lifecycle.

Lifecycle (after OpenTelemetry's instrument/uninstrument): :func:`install`
parses the settings, builds the pipeline and registers a wrapt post-import
hook for each instrumented library (applied at once if it is already
imported); :func:`uninstall` restores every original function exactly.
Every error of ours is contained: the user's ``import chainer`` and training
never fail because of the agent.

The layers below never look the agent up: what they need is passed down
(the ChainerMN patches get :meth:`Agent.on_rank`, the exit handler gets
:meth:`Agent.at_exit`).
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import os
import sys
import threading
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

import wrapt

from .common import log, names, rank, tracebacks
from .common.one_line import write
from .common.readable import launched_here
from .common.settings import Config, SettingsError, from_environ
from .lifecycle import exit as exit_hooks
from .lifecycle import processes
from .lifecycle.flusher import SAMPLE, Flusher
from .lifecycle.monitor import Monitor
from .patches.base import Instrumentor
from .patches.chainer import ChainerPatches
from .patches.chainermn import ChainerMNPatches
from .patches.input_queue import InputQueueProbe
from .patches.status import missed_targets, status_report
from .runtime import hotpath
from .runtime.device import get_backend
from .runtime.events import Tracer
from .runtime.gc_ranges import KEEP_DETAILS, GcRanges
from .runtime.policies import CaptureWindow, SyncPolicy
from .sinks.clock import ClockSink
from .sinks.nvtx import NvtxSink, make_nvtx_sink
from .sinks.recorder import Recorder

if TYPE_CHECKING:
    from types import ModuleType

    from .lifecycle.gpu_session import GpuOutcome, GpuSession
    from .patches.base import Patch
    from .patches.probes import Probes
    from .patches.replay import Replay

_lock = threading.RLock()
_agent: Agent | None = None

#: At exit, how long to wait for other threads to pop the NVTX ranges they left open.
THREAD_UNWIND_WAIT_S = 0.25


class Agent:
    """One installed agent: its config, tracer, sinks and patch sets."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.start_dir = os.getcwd()  # a relative trace path is relative to it, as checked
        #: The file this process's trace goes to, when asked (the one composition of the path).
        self.trace_path = functools.partial(processes.trace_path, cfg.trace or "",
                                            self.start_dir)
        log.set_level(cfg.log)
        backend = get_backend()
        self.backend = backend
        sync = SyncPolicy(cfg.effective_sync_level, backend)
        window = None
        if cfg.iterations is not None:
            start, stop = cfg.iterations
            window = CaptureWindow(start, stop, backend, cfg.exit_after_window)
        #: The hot path's implementation: native, or Python with the reason.
        self.hotpath = hotpath.select(cfg.native, explicit="native" in cfg.explicit)
        self.tracer = Tracer(names.GRANULARITY_LEVEL[cfg.granularity], sync, window,
                             implementation=self.hotpath)
        self.nvtx: NvtxSink | None = None
        self.recorder: Recorder | None = None
        self._add_sinks()
        self.patches = ChainerPatches(self.tracer, cfg.link_depth, replay=_replay(cfg, self.tracer))
        self.probes = _probes(cfg, self.tracer, self.recorder.own_work
                              if self.recorder is not None else None)
        self.queue_probe = InputQueueProbe(self.tracer) if self.recorder is not None else None
        #: Every patch set, in the order they apply (a library's sets in this order).
        self.instrumentors: list[Instrumentor] = [self.patches]
        if self.probes is not None:
            self.instrumentors.append(self.probes)
        if self.queue_probe is not None:
            self.instrumentors.append(self.queue_probe)
        self.instrumentors.append(ChainerMNPatches(self.tracer, self.patches, self.on_rank))
        # what each collection freed is kept for a trace only
        self.gc_ranges = GcRanges(self.tracer, keep=KEEP_DETAILS if cfg.trace else 0) \
            if cfg.gc else None
        self.gpu = self._gpu_session()
        self.monitor = self._monitor()
        self.chainer: ModuleType | None = None
        self.active = True
        self.closed = False
        self.version_ok: bool | None = None

    def _add_sinks(self) -> None:
        try:
            self.nvtx = make_nvtx_sink(self.cfg.domain, self.hotpath)
        except Exception as exc:  # our error: one line, the program goes on  # noqa: BLE001
            log.warning(f"NVTX unavailable ({exc}); ranges are recorded in-process only")
        if self.nvtx is not None:
            self.tracer.add_sink(self.nvtx)
        if self.cfg.summary or self.cfg.trace:
            self.recorder = Recorder(self.cfg, self.tracer)
            self.tracer.add_sink(self.recorder)
        elif self.cfg.stall is not None:  # stall reports say how long each range has been open
            self.tracer.add_sink(ClockSink())

    def _gpu_session(self) -> GpuSession | None:
        """GPU activity (``CHAINER_PROF_GPU_ACTIVITY=1``), where a summary or a trace shows it:
        told of each new thread from now on, started when CuPy is imported."""
        if not self.cfg.gpu_activity or self.recorder is None:
            return None
        from .lifecycle.gpu_session import GpuSession  # only when GPU activity is wanted

        recorder = self.recorder
        window = self.tracer.window
        session = GpuSession(recorder, record_limit=int(self.cfg.record_limit),
                             warmup_skip=recorder.warm_skip,
                             window=window is not None,
                             main_tid=None,  # the loop thread: the first to iterate
                             recording=window is None or window.open)
        if window is not None:  # CUPTI records inside the capture window only
            window.on_open = functools.partial(session.record, True)
            window.on_close = self._gpu_window_closed
        # its hooks, each one append and a no-op unless it records: the thread map from the
        # first thread state on, the recorder's blocks once CuPy's import started it
        self.tracer.on_new_thread = session.thread_started
        recorder.gpu_handover = session.handover
        return session

    def _gpu_window_closed(self) -> None:
        """The capture window closes: one wait for the GPUs, so that every operation
        launched in it has ended and been recorded, then CUPTI records no more."""
        gpu = self.gpu
        if gpu is None:
            return
        if gpu.state == "running":  # (not yet: CuPy's import will start it switched off)
            try:
                self.backend.synchronize(self.tracer.sync.devices)
            except Exception as exc:  # the program's next GPU call says it too  # noqa: BLE001
                log.warning(f"GPU activity: the GPUs could not be waited for as the capture "
                            f"window closed ({type(exc).__name__}: {exc})")
        gpu.record(False)

    def _monitor(self) -> Monitor:
        """The watchdog, the background writes of the trace so far and the dump server."""
        cfg, recorder = self.cfg, self.recorder
        flusher = None
        if recorder is not None and recorder.keep and cfg.flush_interval > 0:
            gc_details = self.gc_ranges.details_since if self.gc_ranges is not None else None
            flusher = Flusher(recorder, self.trace_path, int(cfg.record_limit),
                              self._partial_metadata, gc_details,
                              lambda: recorder.stats_now(self.tracer.clock(),
                                                         sample=SAMPLE).to_dict())
        notes = self.queue_probe.describe if self.queue_probe is not None else None
        return Monitor(self.tracer, cfg.stall, flusher, float(cfg.flush_interval), notes,
                       self.calls_made, self.trainer_runs)

    def calls_made(self) -> int:
        """Instrumented calls so far, as each patch counts its own: the watchdog's progress."""
        return sum(patch.hits for inst in self.instrumentors for patch in list(inst.patches))

    def trainer_runs(self) -> int:
        """``Trainer.run`` calls so far (the watchdog: has a trainer started since it looked?)."""
        return sum(patch.hits for patch in list(self.patches.patches)
                   if patch.label == "Trainer.run")

    def _partial_metadata(self) -> Mapping[str, object]:
        # the run's metadata lives with the end of the run: loaded at the first background write
        from .lifecycle.finish import partial_metadata

        assert self.recorder is not None  # a trace so far is written only with a recorder
        return partial_metadata(self.cfg, self.tracer, self.recorder)

    @property
    def implementation(self) -> str:
        """``native`` or ``python``: which hot path runs."""
        return self.hotpath.name

    @property
    def implementation_reason(self) -> str:
        """Why the Python hot path runs (empty for the native one)."""
        return self.hotpath.reason

    # -- hooks ----------------------------------------------------------------
    def start(self) -> None:
        for library in dict.fromkeys(inst.library for inst in self.instrumentors):
            def imported(module: ModuleType, library: str = library) -> None:
                self._on_import(library, module)

            wrapt.register_post_import_hook(imported, library)
        if self.gpu is not None:  # CUPTI from CuPy's import on: before any kernel it launches
            wrapt.register_post_import_hook(lambda module: self._start_gpu(), "cupy")
        if self.recorder is not None:
            # SIGTERM at its default action, once there is a run: summary and trace, then the
            # default death (never held up)
            exit_hooks.install(self.at_exit, lambda: self.closed, self.recorder)
            self.tracer.when_training_begins(exit_hooks.arm)
        atexit.register(self.at_exit)
        if self.hotpath.wrapper_frames:  # uncaught tracebacks leave our wrappers' frames out
            tracebacks.install_excepthook()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork_in_child)
        processes.hook_exec(self._before_exec)
        if self.gc_ranges is not None:
            self.gc_ranges.install()
        self.monitor.start()
        log.debug(f"active: {self.cfg.describe(flags=launched_here())}; NVTX tool "
                  f"{'attached' if self.nvtx is not None else 'not attached'}; "
                  f"hot path: {self.hotpath.describe()}")
        if not _chainer_installed():
            log.warning("Chainer is not installed in this Python; the program runs "
                        "uninstrumented")
        info = rank.current()
        if info is not None:
            processes.tag_rank(self.nvtx, info.rank)

    def _start_gpu(self) -> None:
        """CuPy was imported: GPU activity starts (a fault is one line inside)."""
        if self.active and self.gpu is not None:
            self.gpu.start()

    def _on_import(self, library: str, module: ModuleType) -> None:
        """Post-import hook: apply the library's patch sets; never fail its import."""
        if not self.active:
            return
        for inst in self.instrumentors:
            if inst.library == library and inst.module is None:
                self._instrument(inst, module)
        if library == "chainer" and self.chainer is not None and log.enabled("debug"):
            log.debug("patch status at start:\n" + status_report(
                self.all_patches(), chainer_imported=True, trained=False,
                implementation=self.hotpath.describe()))

    def _instrument(self, inst: Instrumentor, module: ModuleType) -> None:
        if any(not self._applied(lib) for lib in inst.requires):
            return  # e.g. ChainerMN while Chainer runs uninstrumented
        why = inst.unsupported(module)
        if inst is self.patches:
            self.version_ok = why is None
        if why is not None:
            log.warning(f"{why}; running uninstrumented")
            return
        try:
            inst.apply(module)
            if inst is self.patches:
                self.chainer = module
            for patch in inst.patches:
                if patch.status == "failed":
                    log.warning(f"could not instrument {patch.label}: {patch.reason}")
        except Exception as exc:  # our error: one line, the program goes on  # noqa: BLE001
            log.error(f"could not instrument {inst.name} ({type(exc).__name__}: {exc}); "
                      "running uninstrumented")
            try:
                inst.remove()
            except Exception:  # undoing a half-applied set: the error is said above  # noqa: BLE001
                pass

    def _applied(self, library: str) -> bool:
        return any(inst.library == library and inst.module is not None
                   for inst in self.instrumentors)

    def all_patches(self) -> list[Patch]:
        """The targets of the sets that emit ranges (the status report, hit counts)."""
        return [patch for inst in self.instrumentors if inst.reported for patch in inst.patches]

    # -- what the layers below report up --------------------------------------------
    def on_rank(self, number: int, size: int | None) -> None:
        """A ChainerMN communicator told this process its rank."""
        if rank.note(number, size):
            processes.tag_rank(self.nvtx, number)
        processes.rank_known(self.cfg, number, size)
        if not processes.profiles_rank(self.cfg, number):
            self.switch_off()

    def _after_fork_in_child(self) -> None:
        try:
            self.tracer.reset_after_fork()
            exit_hooks.after_fork()
            processes.after_fork()
            self.monitor.after_fork()
            if self.gpu is not None:
                self.gpu.after_fork()
            if _agent is not self:
                return  # an agent uninstalled before the fork
            if not self.cfg.children:
                self.switch_off()
            else:
                processes.close_at_worker_exit(self, self.at_exit)
                if self.recorder is not None:
                    self.tracer.when_training_begins(exit_hooks.arm)
                self.monitor.start()
        except Exception as exc:  # our error: one line, the program goes on  # noqa: BLE001
            log.error(f"could not reset after fork: {exc}")

    def switch_off(self) -> None:
        """Stop in this process: no more ranges, no output at exit."""
        global _agent
        self.tracer.remove_sinks()
        self.uninstall()
        with _lock:
            if _agent is self:
                _agent = None

    # -- end ------------------------------------------------------------------
    def _before_exec(self) -> None:
        """``os.exec*`` replaces this image: its summary and trace now (none without an
        iteration), the trace so far deleted."""
        if _agent is not self or self.closed:
            return
        if self.tracer.iterations:
            self.at_exit()
        else:
            self._stop_watching()
            self.monitor.finish(True)

    def at_exit(self) -> None:
        """Close open ranges, flush sinks, report the run and the patch status (once)."""
        if self.closed:
            return
        self.closed = True
        restore_interrupt = exit_hooks.keep_interrupt_status()
        try:
            self._finish()
        except KeyboardInterrupt:  # Ctrl-C again while finishing: stop, and end as Ctrl-C does
            restore_interrupt = exit_hooks.mark_interrupted
            log.warning("interrupted while finishing: the summary or the trace may be missing")
        finally:
            restore_interrupt()  # Ctrl-C: still killed by SIGINT, as without the agent

    def _finish(self) -> None:
        self._stop_watching()
        try:
            self.tracer.close()
        except Exception as exc:  # our error: one line, the program goes on  # noqa: BLE001
            log.error(f"could not finish cleanly: {type(exc).__name__}: {exc}")
        gpu = self._finish_gpu()
        if self.recorder is not None:
            final_written = False
            try:
                # the reporting modules load at exit only: start-up stays light
                from .lifecycle.finish import report_run

                stalls = self.monitor.stall_records()
                stats = report_run(self.recorder, self.tracer, self.cfg,
                                   hits=sum(p.hits for p in self.all_patches()),
                                   trace_path=self.trace_path,
                                   extra_meta={"stalls": stalls} if stalls else None,
                                   event_args=self.gc_ranges.args_by_range()
                                   if self.gc_ranges is not None and self.cfg.trace else None,
                                   gpu=gpu)
                final_written = stats is None or not self.cfg.trace or \
                    bool(stats.meta.get("trace_path"))
            except Exception as exc:  # our error: one line, the program goes on  # noqa: BLE001
                log.error(f"no summary or trace ({type(exc).__name__}: {exc})")
            self.monitor.finish(final_written)
        try:
            patches = self.all_patches()
            if log.enabled("debug"):
                log.debug("patch status at exit:\n" + status_report(
                    patches, chainer_imported=self.chainer is not None,
                    trained=self.tracer.iterations > 0, at_exit=True,
                    implementation=self.hotpath.describe()))
            missed = missed_targets(patches, self.tracer.iterations)
            if missed:
                log.warning("never hit although iterations ran: " + ", ".join(missed)
                            + " (run with CHAINER_PROF_LOG=debug for the status report)")
        except Exception as exc:  # our error: one line, the program goes on  # noqa: BLE001
            log.error(f"no status report: {exc}")
        try:  # other threads pop their NVTX ranges at their next instrumented call
            if not self.tracer.wait_for_threads(THREAD_UNWIND_WAIT_S):
                log.info("ranges left open in NVTX by threads that made no instrumented call "
                         "at exit (the recorder's view ends them at exit)")
        except Exception as exc:  # our error: one line, the program goes on  # noqa: BLE001
            log.error(f"could not wait for other threads: {type(exc).__name__}: {exc}")

    def _finish_gpu(self) -> GpuOutcome | None:
        """GPU activity stops (each wait bounded) and its analysis finishes: the outcome for
        the report, or ``None`` (why was said in one line)."""
        return self.gpu.finish() if self.gpu is not None else None

    def _stop_watching(self) -> None:
        """The watchdog, the background writes, the dump server and the gc ranges stop."""
        if self.gc_ranges is not None:
            self.gc_ranges.remove()
        try:
            self.monitor.stop()
        except Exception as exc:  # our error: one line, the program goes on  # noqa: BLE001
            log.error(f"could not stop the monitor: {type(exc).__name__}: {exc}")

    def uninstall(self) -> None:
        self.active = False
        self._stop_watching()
        if self.gpu is not None:
            try:  # collection stops; no figures are reported
                self.gpu.stop()
            except Exception as exc:  # our error: one line, the program goes on  # noqa: BLE001
                log.error(f"GPU activity: {type(exc).__name__}: {exc}")
        for inst in reversed(self.instrumentors):
            if inst.module is not None:
                inst.remove()
        self.chainer = None
        try:  # ranges still open on this thread end now: nothing would end them later
            self.tracer.close_thread(self.tracer.state())
            self.tracer.forget_thread()
        except Exception as exc:  # our error: one line, the program goes on  # noqa: BLE001
            log.error(f"could not close open ranges: {type(exc).__name__}: {exc}")
        try:
            atexit.unregister(self.at_exit)
            exit_hooks.uninstall()
            processes.unhook_exec()
            tracebacks.uninstall_excepthook()
        except Exception:  # uninstalling: each part undoes what it can  # noqa: BLE001
            pass


def _replay(cfg: Config, tracer: Tracer) -> Replay | None:
    """The replay experiment's data hooks (``CHAINER_PROF_REPLAY_BATCH=1``), else ``None``."""
    if not cfg.replay_batch:
        return None
    from .patches.replay import Replay  # an experiment: loaded only when asked for

    log.warning("replay experiment on: the first batch is fed again every iteration "
                "(speed only; the training results are meaningless)")
    return Replay(tracer.facts)


def _probes(cfg: Config, tracer: Tracer,
            own_work: Callable[[int, int], None] | None) -> Probes | None:
    """Run-time facts for the advice, when advice is printed or a trace is written; their own
    time on the program's thread goes to ``own_work`` (the recorder's)."""
    if not (cfg.advice or cfg.trace):
        return None
    from .patches.probes import Probes  # only when advice or a trace will use the facts

    return Probes(tracer, own_work=own_work)


def _chainer_installed() -> bool:
    """Whether ``import chainer`` can succeed here (without importing it)."""
    if "chainer" in sys.modules:
        return sys.modules["chainer"] is not None
    try:
        return importlib.util.find_spec("chainer") is not None
    except (ImportError, ValueError):
        return False


def current() -> Agent | None:
    """The installed agent, if any."""
    return _agent


def install(**settings: object) -> Agent | None:
    """Install the agent with ``settings`` over the ``CHAINER_PROF_*`` environment.

    Idempotent: a second call returns the agent already installed (and does
    not wrap twice); settings it asks for that differ from the installed
    agent's are named in one warning.  Raises :class:`SettingsError` on bad
    settings.
    """
    global _agent
    with _lock:
        if _agent is not None:
            if settings:
                _warn_ignored(_agent.cfg, from_environ(overrides=settings), settings)
            return _agent
        cfg = from_environ(overrides=settings)
        if not cfg.enable:
            return None
        if not processes.admit(cfg):  # a child with children off, or a rank left out
            return None
        agent = Agent(cfg)
        agent.start()
        _agent = agent
        return agent


def _warn_ignored(current: Config, asked: Config, names: Iterable[str]) -> None:
    """One line naming the settings a second ``install()`` asked for in vain."""
    changed = [f"{name}={getattr(asked, name)!r}" for name in names
               if getattr(asked, name) != getattr(current, name)]
    if changed:
        kept = ", ".join(f"{name}={getattr(current, name)!r}" for name in names
                         if getattr(asked, name) != getattr(current, name))
        log.warning(f"already installed with {kept}; install({', '.join(changed)}) changes "
                    "nothing (call uninstall() first to change the settings)", once=False)


def uninstall() -> None:
    """Remove every patch, restoring the original functions exactly."""
    global _agent
    with _lock:
        if _agent is not None:
            _agent.uninstall()
            _agent = None
            processes.restore_environ()  # children started from now on are not profiled


def activate_from_env() -> None:
    """Start-up activation (``.pth``/sitecustomize): never raises, never stdout.

    Bad settings leave the agent off with one line on stderr; the program runs.
    """
    if _agent is not None:
        return
    try:
        install()
    except SettingsError as exc:
        write(sys.stderr, f"chainer_autoprof: {exc}; the agent stays off\n")
    except Exception as exc:  # our error: one line, the program goes on  # noqa: BLE001
        write(sys.stderr, f"chainer_autoprof: could not start ({type(exc).__name__}: {exc}); "
                          "the agent stays off\n")
