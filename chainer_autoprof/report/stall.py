"""The wording of stall reports, dumps, reports side by side and runs that did not end normally.

A snapshot (:mod:`..lifecycle.where`) says, for each thread, which ranges are
open and for how long, and its innermost Python frames.  Here it becomes

* the stall or dump report printed on stderr (:func:`format_report`);
* one line per process, side by side, with the odd one out named
  (:func:`side_by_side`, used by ``dump`` and ``merge``);
* the line a summary of a partial trace starts with: the run did not end
  normally, and where it was (:func:`ended_abnormally`).
"""

from __future__ import annotations

import os
import time
from typing import Any, Mapping, Sequence

from ..analysis.stall import OddOneOut, Position, odd_one_out, position
from ..common.one_line import one_line

#: Frames shown for a thread that is not the training loop.
OTHER_FRAMES = 3


def _seconds(s: float | None) -> str:
    if s is None:
        return "?"
    if s >= 7200:
        return f"{s / 3600:.2f} h"
    if s >= 120:
        return f"{s / 60:.1f} min"
    return f"{s:.1f} s" if s >= 10 else f"{s:.2f} s"


def _where_process(snap: Mapping[str, Any]) -> str:
    text = f"pid {snap.get('pid')}"
    if snap.get("host"):
        text += f" on {snap['host']}"
    if snap.get("rank") is not None:
        size = snap.get("world_size")
        text += f", rank {snap['rank']}" + (f" of {size}" if size else "")
    return text


def _iteration(snap: Mapping[str, Any]) -> str:
    number = snap.get("iteration")
    if number is None:
        return "before the first iteration"
    if snap.get("in_iteration"):
        return f"in iteration {number}"
    return f"after iteration {number}"


def headline(snap: Mapping[str, Any]) -> str:
    """The first line of a report."""
    where = f"{_where_process(snap)}, {_iteration(snap)}"
    since = snap.get("since_iteration_s")
    if snap.get("reason") == "stall":
        quiet = snap.get("since_progress_s", since)
        threshold = snap.get("threshold_s")
        rule = str(snap.get("threshold_rule") or "")
        if rule.startswith("auto: "):
            setting = f"; CHAINER_PROF_STALL=auto: {_seconds(threshold)}, {rule[6:]}"
        else:
            setting = f"; CHAINER_PROF_STALL: {_seconds(threshold)}" if threshold else ""
        began = ""
        if since is not None and quiet is not None and since > quiet + 1:
            began = f"; the last iteration began {_seconds(since)} ago"
        return (f"chainer_autoprof: stall: no progress for {_seconds(quiet)} (no new iteration "
                f"and no instrumented call{setting}): {where}{began}")
    last = f"; the last iteration began {_seconds(since)} ago" if since is not None else ""
    return f"chainer_autoprof: report on request: {where}{last}"


def format_report(snap: Mapping[str, Any], trace_path: str | None = None) -> str:
    """The stall or dump report: each thread's open ranges and innermost frames."""
    lines = [headline(snap)]
    for thread in snap.get("threads") or ():
        role = ", the training loop" if thread.get("loop") else ""
        title = f"  {one_line(str(thread.get('name')))} (tid {thread.get('tid')}{role})"
        opened = thread.get("open") or []
        if opened:
            lines.append(title + ": open ranges, outermost first")
            for depth, r in enumerate(opened):
                label = ("  " * depth + one_line(str(r.get("name"))))[:60]
                lines.append(f"    {label:<60} {_seconds(r.get('open_s')):>9}")
        else:
            lines.append(title + ": no open range")
        frames = thread.get("stack") or []
        if not thread.get("loop") and not opened:
            frames = frames[-OTHER_FRAMES:]
        if frames:
            lines.append("    innermost frames, most recent call last:")
            for frame in frames:
                lines.append(f"      {one_line(str(frame.get('file')))}:{frame.get('line')} "
                             f"in {one_line(str(frame.get('func')))}")
                if frame.get("code"):
                    lines.append(f"          {one_line(str(frame['code']))}")
    for note in snap.get("notes") or ():
        lines.append(f"  {note}")
    if trace_path:
        lines.append(f"  trace so far: {trace_path} (chainer-autoprof report {trace_path})")
    if snap.get("reason") == "stall":
        lines.append(f"  reported once per stall; 'chainer-autoprof dump {snap.get('pid')}' "
                     "prints this at any time")
    return "\n".join(lines)


def where_line(snap: Mapping[str, Any]) -> str:
    """Where the training thread was, in one line."""
    pos = position(snap)
    text = _iteration(snap)
    if pos.ranges:
        path = " > ".join(name for name, _c, _s in pos.ranges)
        opened = pos.ranges[-1][2]
        text += f": {pos.thread or 'the training thread'} in {path}"
        if opened is not None:
            text += f" (open {_seconds(opened)})"
    elif pos.thread:
        text += f": {pos.thread} outside every recorded range"
    return text


def ended_abnormally(meta: Mapping[str, Any]) -> list[str]:
    """The lines a summary of a partial trace starts with (none for a finished run)."""
    state = meta.get("partial")
    if not isinstance(state, dict):
        return []
    when = ""
    unix_ns = state.get("unix_ns")
    if unix_ns:
        when = time.strftime(" at %Y-%m-%d %H:%M:%S", time.localtime(unix_ns / 1e9))
    elapsed = (meta.get("clock") or {}).get("duration_ns")
    after = f", {_seconds(elapsed / 1e9)} after the start" if elapsed else ""
    lines = [f"  this run did not end normally: its trace was last written{when}{after}; "
             "what follows covers the ranges completed by then"]
    where = state.get("where")
    if isinstance(where, dict):
        lines.append(f"  where it was: {where_line(where)}")
    stalls = state.get("stalls") or []
    if stalls:
        last = stalls[-1]
        quiet = last.get("since_progress_s", last.get("since_iteration_s"))
        lines.append(f"  stall reports: {len(stalls)}; the last one: {where_line(last)}, "
                     f"no progress for {_seconds(quiet)}")
    pid = meta.get("pid")
    if isinstance(pid, int) and meta.get("host") == os.uname().nodename and _alive(pid):
        lines.append(f"  note: pid {pid} is still running on this host (or the pid was "
                     "reused): the run may not be over")
    return lines


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _row(pos: Position) -> str:
    path = " > ".join(name for name, _c, _s in pos.ranges) or "(no open range)"
    inner = pos.innermost
    opened = _seconds(inner[2]) if inner and inner[2] is not None else ""
    iteration = "-" if pos.iteration is None else str(pos.iteration)
    return f"  {pos.label:<10} pid {pos.pid!s:<8} iteration {iteration:<7} {path}  {opened}"


def describe_odd(found: OddOneOut) -> str:
    """One sentence naming the odd rank(s) and what the others wait in."""
    odd = ", ".join(p.label for p in found.odd)
    verb = "is" if len(found.odd) == 1 else "are"
    first = found.odd[0]
    inner = first.innermost
    where = inner[0] if inner else "outside every recorded range"
    detail = []
    if first.iteration is not None:
        detail.append(f"iteration {first.iteration}")
    if inner and inner[2] is not None:
        detail.append(f"open {_seconds(inner[2])}")
    where += f" ({', '.join(detail)})" if detail else ""
    others = ", ".join(p.label for p in found.others)
    if found.rule == "comm":
        return (f"odd one out: {odd} {verb} in {where}; {others} "
                f"{'waits' if len(found.others) == 1 else 'wait'} in {found.others_in}")
    if found.rule == "behind":
        return (f"odd one out: {odd} {verb} behind, in {where}; {others} "
                f"{'is' if len(found.others) == 1 else 'are'} already in iteration "
                f"{found.others[0].iteration}, in {found.others_in}")
    return (f"odd one out: {odd} {verb} in {where}; {others} "
            f"{'is' if len(found.others) == 1 else 'are'} in {found.others_in}")


def side_by_side(snaps: Sequence[Mapping[str, Any]], title: str = "where each process is") -> str:
    """One line per process (ranks in order), then the odd one out if there is one."""
    positions = sorted((position(s) for s in snaps),
                       key=lambda p: (p.rank is None, p.rank if p.rank is not None else 0,
                                      p.pid or 0))
    lines = [f"{title}:"] + [_row(p) for p in positions]
    found = odd_one_out(positions)
    if found is not None:
        lines.append(describe_odd(found))
    elif len(positions) > 1:
        lines.append("no odd one out: every process is in the same place")
    return "\n".join(lines)
