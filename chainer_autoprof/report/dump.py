"""``chainer-autoprof dump [PID ...]``: where running processes are, now, even when they hang.

Asks each process's agent over its control socket (:mod:`..common.control`)
for the report a stall would print: every thread's open ranges with how long
each has been open, and its innermost Python frames.  The process prints it
on its own stderr too (``--no-print`` leaves its stderr alone) and writes
its trace so far when a trace is on.  A background thread answers, so this
works while the main thread is blocked in C (an MPI collective, a queue
``get``, a CUDA synchronization), and no signal is sent.

Without PIDs, every process of this user on this host where the agent runs
is asked.  With several ranks of an MPI job, their positions are printed
side by side and the odd one out is named.  For a job on several hosts, run
``dump`` on each (``ssh``, ``pdsh``) or ``merge`` the ranks' trace-so-far
files, which every dump writes.

Exit status: 0 when every process answered, 1 when one did not, 2 for bad
arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

from ..common import control
from .stall import side_by_side


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chainer-autoprof dump",
        description="Make running processes with the agent report where they are now: every "
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


def ask(pid: int, show: bool = True, timeout: float = 10.0) -> dict[str, Any]:
    """The answer of process ``pid`` (``{"ok": False, "error": ...}`` when it gives none)."""
    try:
        answer = control.request(pid, {"op": "dump", "print": show}, timeout=timeout)
    except TimeoutError:
        return {"ok": False, "error": f"no answer within {timeout:g} s"}
    except (OSError, ValueError) as exc:
        why = ("no agent listens there (not running with chainer_autoprof, another user's, "
               "or gone)") if isinstance(exc, (ConnectionRefusedError, FileNotFoundError)) \
            else f"{type(exc).__name__}: {exc}"
        return {"ok": False, "error": why}
    if not answer.get("ok"):
        return {"ok": False, "error": str(answer.get("error", "the agent could not answer"))}
    return answer


def main(argv: Sequence[str] | None = None) -> int:
    """The ``dump`` subcommand; returns the exit status."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    pids = args.pids or [pid for pid in control.listening_pids() if pid != os.getpid()]
    if not pids:
        sys.stderr.write("chainer-autoprof dump: no process with the agent found on this host "
                         "(name PIDs to ask them)\n")
        return 1
    answers = {pid: ask(pid, show=not args.no_print, timeout=args.timeout) for pid in pids}
    if args.json:
        for pid, answer in answers.items():
            sys.stdout.write(json.dumps({"pid": pid, **answer}, default=str) + "\n")
    failed = False
    snaps = []
    for pid, answer in answers.items():
        if not answer.get("ok"):
            failed = True
            sys.stderr.write(f"chainer-autoprof dump: pid {pid}: {answer['error']}\n")
            continue
        snaps.append(answer["snapshot"])
        if not args.json:
            sys.stdout.write(answer["text"] + "\n\n")
    if not args.json:
        for group in jobs(snaps):
            sys.stdout.write(side_by_side(group, "where each rank is") + "\n")
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
