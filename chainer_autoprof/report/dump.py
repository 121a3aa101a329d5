"""``chainer-autoprof dump [PID ...]``: where running processes are, now, even when they hang.

Asks each process's agent over its control socket (:mod:`..common.control`)
for the report a stall would print: every thread's open ranges with how long
each has been open, and its innermost Python frames.  The process prints it
on its own stderr too (``--no-print`` leaves its stderr alone) and writes
its trace so far when a trace is on.  A background thread answers, so this
works while the main thread is blocked in C (an MPI collective, a queue
``get``, a CUDA synchronization), and no signal is sent.

Without PIDs, every process of this user on this host where the agent runs
is asked (never another user's: their sockets lie in their own private
directories).  A process that cannot be reached gets one line saying why:
no such process, another user's, no control socket, a socket left by an
agent that is gone, or no answer in time (a thread holding the GIL in C, a
stopped process).  With several ranks of an MPI job, their positions are printed
side by side and the odd one out is named.  For a job on several hosts, run
``dump`` on each (``ssh``, ``pdsh``) or ``merge`` the ranks' trace-so-far
files, which every dump writes.

Exit status: 0 when every process answered, 1 when one did not, 2 for bad
arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from ..common import control
from ..common.one_line import write
from . import command_parser
from .stall import side_by_side


def _parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "dump",
        "Make running processes with the agent report where they are now: every "
        "thread's open ranges and innermost frames, and the odd rank out of an MPI "
        "job. Works while a process is blocked inside C; sends no signal.")
    parser.add_argument("pids", nargs="*", type=int, metavar="PID",
                        help="processes to ask (default: every process of yours on this host "
                             "where the agent runs)")
    parser.add_argument("--no-print", action="store_true",
                        help="do not make the processes print the report on their own stderr")
    parser.add_argument("--json", action="store_true",
                        help="print the answers as JSON (one object per process) instead")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="how long to wait for each process (default: 10)")
    return parser


def ask(pid: int, show: bool = True, timeout: float = 10.0,
        path: str | None = None) -> dict[str, Any]:
    """The answer of process ``pid`` (``{"ok": False, "error": ...}`` when it gives none)."""
    try:
        answer = control.request(pid, {"op": "dump", "print": show}, timeout=timeout,
                                 path=path)
    except TimeoutError:
        return {"ok": False, "error": f"no answer within {timeout:g} s: {_silent(pid)}"}
    except control.ControlError as exc:
        return {"ok": False, "error": str(exc)}
    except (OSError, ValueError) as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    if not answer.get("ok"):
        return {"ok": False, "error": str(answer.get("error", "the agent could not answer"))}
    return answer


def _silent(pid: int) -> str:
    """Why a process whose agent listens may not answer."""
    state = ""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            state = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("State:")), "")
    except OSError:
        pass
    if state.startswith("T"):
        return f"the process is stopped ({state}: SIGSTOP, Ctrl-Z or a debugger)"
    return ("its agent's threads could not run: most likely a thread holds the GIL in C code "
            "(an extension that does not release it while it waits or computes). With "
            "--stall, the process writes every thread's stack on its stderr by itself "
            "(faulthandler) once no Python thread has run for the stall threshold")


def main(argv: Sequence[str] | None = None) -> int:
    """The ``dump`` subcommand; returns the exit status."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    found: dict[int, str | None] = dict.fromkeys(args.pids)
    if not args.pids:
        found.update(control.own_processes())
    if not found:
        sys.stderr.write("chainer-autoprof dump: no process of yours with the agent found on "
                         "this host (name PIDs to ask them)\n")
        return 1
    answers = {pid: ask(pid, show=not args.no_print, timeout=args.timeout, path=path)
               for pid, path in found.items()}
    if args.json:
        for pid, answer in answers.items():
            sys.stdout.write(json.dumps({"pid": pid, **answer}, default=str) + "\n")
    failed = False
    snaps = []
    for pid, answer in answers.items():
        if not answer.get("ok"):
            failed = True
            write(sys.stderr, f"chainer-autoprof dump: pid {pid}: {answer['error']}\n")
            continue
        snaps.append(answer["snapshot"])
        if not args.json:
            write(sys.stdout, answer["text"] + "\n\n")
    if not args.json:
        for group in jobs(snaps):
            write(sys.stdout, side_by_side(group, "where each rank is") + "\n")
    return 1 if failed else 0


def jobs(snaps: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The ranks of each MPI job among ``snaps`` (same launcher process and size), 2 or more."""
    groups: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for snap in snaps:
        if snap.get("rank") is not None:
            groups.setdefault((snap.get("parent_pid"), snap.get("world_size")), []).append(snap)
    return [group for group in groups.values() if len(group) > 1]


if __name__ == "__main__":
    sys.exit(main())
