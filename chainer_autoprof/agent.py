"""The agent: settings -> tracer + sinks + patches, applied when Chainer is imported.

Lifecycle (after OpenTelemetry's instrument/uninstrument): :func:`install`
parses the settings, builds the pipeline and registers a wrapt post-import
hook on the top-level ``chainer`` package (applied at once if it is already
imported); :func:`uninstall` restores every original function exactly.
Every error of ours is contained: the user's ``import chainer`` and training
never fail because of the agent.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Any

from . import log, names
from .settings import Config, SettingsError, from_environ

_lock = threading.RLock()
_agent: Agent | None = None


class Agent:
    """One installed agent: its config, tracer, sinks and Chainer patches."""

    def __init__(self, cfg: Config) -> None:
        from .device import get_backend
        from .events import Tracer
        from .patches.chainer import ChainerPatches
        from .policies import CaptureWindow, SyncPolicy

        self.cfg = cfg
        log.set_level(cfg.log)
        backend = get_backend()
        self.backend = backend
        sync = SyncPolicy(cfg.effective_sync_level, backend)
        window = None
        if cfg.iterations is not None:
            start, stop = cfg.iterations
            window = CaptureWindow(start, stop, backend, cfg.exit_after_window)
        self.tracer = Tracer(names.GRANULARITY_LEVEL[cfg.granularity], sync, window)
        self.nvtx = None
        self.recorder = None
        self._add_sinks()
        self.patches = ChainerPatches(self.tracer, cfg.link_depth, replay=_replay(cfg, self.tracer))
        self.probes = _probes(cfg, self.tracer)
        self.chainer: Any = None
        self.active = True
        self.closed = False
        self.version_ok: bool | None = None

    def _add_sinks(self) -> None:
        from .sinks.nvtx import make_nvtx_sink

        try:
            self.nvtx = make_nvtx_sink(self.cfg.domain)
        except Exception as exc:
            log.warning(f"NVTX unavailable ({exc}); ranges are recorded in-process only")
        if self.nvtx is not None:
            self.tracer.add_sink(self.nvtx)
        if self.cfg.summary or self.cfg.trace:
            try:
                from .sinks.recorder import Recorder
            except ImportError:
                return
            self.recorder = Recorder(self.cfg, self.tracer)
            self.tracer.add_sink(self.recorder)

    # -- hooks ----------------------------------------------------------------
    def start(self) -> None:
        import wrapt

        wrapt.register_post_import_hook(self._on_chainer_imported, "chainer")
        from .patches.chainermn import register_hook
        register_hook(self)  # ChainerMN, once chainer is instrumented
        if self.recorder is not None:
            from . import exit_hooks
            exit_hooks.install(self)  # SIGTERM: summary and trace, then the default death
        atexit.register(self.at_exit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork_in_child)
        log.debug(f"active: {self.cfg!r}; NVTX tool attached: {self.nvtx is not None}")
        if not _chainer_installed():
            log.warning("Chainer is not installed in this Python; the program runs "
                        "uninstrumented")

    def _on_chainer_imported(self, chainer: Any) -> None:
        """Post-import hook: contain every error, never fail ``import chainer``."""
        if not self.active or self.chainer is not None:
            return
        try:
            if not self._version_known(chainer):
                return
            self.chainer = chainer
            self.patches.apply(chainer)
            if self.probes is not None:
                self.probes.apply(chainer)
            if log.enabled("debug"):
                from .status import status_report
                log.debug("patch status at start:\n" + status_report(self, at_exit=False))
            for patch in self.patches.patches:
                if patch.status == "failed":
                    log.warning(f"could not instrument {patch.label}: {patch.reason}")
        except Exception as exc:
            log.error(f"could not instrument Chainer ({type(exc).__name__}: {exc}); "
                      "running uninstrumented")
            try:
                if self.probes is not None:
                    self.probes.remove()
                self.patches.remove(chainer)
            except Exception:
                pass

    def _version_known(self, chainer: Any) -> bool:
        from .patches.chainer import SUPPORTED_MAJORS

        version = getattr(chainer, "__version__", "")
        try:
            major = int(str(version).split(".")[0])
        except ValueError:
            major = -1
        self.version_ok = major in SUPPORTED_MAJORS
        if not self.version_ok:
            known = ", ".join(f"{m}.x" for m in SUPPORTED_MAJORS)
            log.warning(f"Chainer {version or '(unknown version)'} is not a version the agent "
                        f"knows ({known}); running uninstrumented")
        return self.version_ok

    def _after_fork_in_child(self) -> None:
        try:
            self.tracer.reset_after_fork()
            from .processes import after_fork_in_child
            after_fork_in_child(self)
        except Exception as exc:
            log.error(f"could not reset after fork: {exc}")

    # -- end ------------------------------------------------------------------
    def at_exit(self) -> None:
        """Close open ranges, flush sinks, report status (once)."""
        if self.closed:
            return
        self.closed = True
        try:
            self.tracer.close()
        except Exception as exc:
            log.error(f"could not finish cleanly: {type(exc).__name__}: {exc}")
        from .status import missed_targets, status_report

        try:
            if log.enabled("debug"):
                log.debug("patch status at exit:\n" + status_report(self, at_exit=True))
            missed = missed_targets(self)
            if missed:
                log.warning("never hit although iterations ran: " + ", ".join(missed)
                            + " (run with CHAINER_PROF_LOG=debug for the status report)")
        except Exception as exc:
            log.error(f"no status report: {exc}")

    def uninstall(self) -> None:
        self.active = False
        if self.chainer is not None:
            if self.probes is not None:
                self.probes.remove()
            self.patches.remove(self.chainer)
            self.chainer = None
        try:  # ranges still open on this thread end now: nothing would end them later
            self.tracer.close_thread(self.tracer.state())
        except Exception as exc:
            log.error(f"could not close open ranges: {type(exc).__name__}: {exc}")
        try:
            atexit.unregister(self.at_exit)
            from . import exit_hooks
            exit_hooks.uninstall()
        except Exception:
            pass


def _replay(cfg: Config, tracer: Any) -> Any:
    """The replay experiment's data hooks (``CHAINER_PROF_REPLAY_BATCH=1``), else ``None``."""
    if not cfg.replay_batch:
        return None
    from .patches.replay import Replay

    log.warning("replay experiment on: the first batch is fed again every iteration "
                "(speed only; the training results are meaningless)")
    return Replay(tracer.facts)


def _probes(cfg: Config, tracer: Any) -> Any:
    """Run-time facts for the advice, when advice is printed or a trace is written."""
    if not (cfg.advice or cfg.trace):
        return None
    from .patches.probes import Probes

    return Probes(tracer)


def _chainer_installed() -> bool:
    """Whether ``import chainer`` can succeed here (without importing it)."""
    if "chainer" in sys.modules:
        return sys.modules["chainer"] is not None
    try:
        import importlib.util

        return importlib.util.find_spec("chainer") is not None
    except (ImportError, ValueError):
        return False


def current() -> Agent | None:
    """The installed agent, if any."""
    return _agent


def install(**settings: Any) -> Agent | None:
    """Install the agent with ``settings`` over the ``CHAINER_PROF_*`` environment.

    Idempotent: a second call returns the agent already installed (and does
    not wrap twice).  Raises :class:`SettingsError` on bad settings.
    """
    global _agent
    with _lock:
        if _agent is not None:
            return _agent
        cfg = from_environ(overrides=settings)
        if not cfg.enable:
            return None
        from . import processes
        if not processes.admit(cfg):  # a child with children off, or a rank left out
            return None
        agent = Agent(cfg)
        agent.start()
        _agent = agent
        processes.started(agent)
        return agent


def uninstall() -> None:
    """Remove every patch, restoring the original functions exactly."""
    global _agent
    with _lock:
        if _agent is not None:
            _agent.uninstall()
            _agent = None
            from .processes import restore_environ
            restore_environ()  # children started from now on are not profiled


def activate_from_env() -> None:
    """Start-up activation (``.pth``/sitecustomize): never raises, never stdout.

    Bad settings leave the agent off with one line on stderr; the program runs.
    """
    if _agent is not None:
        return
    try:
        install()
    except SettingsError as exc:
        sys.stderr.write(f"chainer_autoprof: {exc}; the agent stays off\n")
    except Exception as exc:
        sys.stderr.write(f"chainer_autoprof: could not start ({type(exc).__name__}: {exc}); "
                         "the agent stays off\n")
