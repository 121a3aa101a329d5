"""``python -m chainer_autoprof report TRACE [TRACE2]``: the summary of saved traces.

With one trace, prints the same summary the run printed at exit.  A run
that did not end normally (SIGKILL, the OOM killer, a crash in native code)
left its trace so far in ``TRACE.partial``: that file is read the same way,
and a trace path whose final file is missing falls back to it.  With two
(before and after a change), prints both summaries' key figures side by side,
phase by phase, with the change, and a one-line conclusion, so a fix can be
checked.  A merged trace (``merge``) gives each process's own summary
(:mod:`.merged_report`).  Output goes to stdout; errors are one line on stderr (exit status 2).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from ..analysis.findings import find
from ..analysis.gpu_evidence import compare_sync
from ..analysis.stats import PHASE_KEYS, RunStats
from ..analysis.verdict import pick_replay
from ..common.one_line import one_line, write
from ..common.paths import check_output
from ..common.readable import readable, wrap_long_lines
from . import command_parser
from .html import write_report
from .merged_report import is_merged, process_traces
from .partial import partial_path
from .summary import PHASE_LABELS, fmt_ms, format_summary, outside_label, verdict_section
from .tracefile import Trace, TraceError, read_trace

#: A change smaller than this (relative) is reported as "about the same".
SAME_WITHIN = 0.03


def _parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "report",
        "Print the time summary of a trace written with CHAINER_PROF_TRACE; "
        "with two traces, compare them phase by phase (before -> after).")
    parser.add_argument("trace", help="trace file (Chrome trace-event JSON)")
    parser.add_argument("after", nargs="?", help="a second trace to compare with the first")
    parser.add_argument("--no-advice", action="store_true",
                        help="leave out the bottleneck verdict and advice")
    parser.add_argument("--html", metavar="OUT.html",
                        help="also write a self-contained HTML report (no network needed); "
                             "of the normal run when the other trace is a replay run "
                             "(two other runs, or a merged trace: refused, one page each)")
    parser.add_argument("--from-events", action="store_true",
                        help="recompute from the trace's ranges even when the recorder saved "
                             "whole-run statistics (traces that dropped ranges)")
    return parser


class ReportError(Exception):
    """A problem with the inputs or the output: one line for the user, exit status 2."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``report`` subcommand; returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["report"]:
        args_list = args_list[1:]
    args = _parser().parse_args(args_list)
    try:
        text = report(args)
    except (ReportError, TraceError) as exc:
        write(sys.stderr, f"chainer_autoprof report: {exc}\n")
        return 2
    except RecursionError:
        write(sys.stderr, f"chainer_autoprof report: {args.trace}: nested too deeply\n")
        return 2
    except Exception as exc:  # a damage no check above knows yet: one line, never a traceback  # noqa: BLE001
        write(sys.stderr, f"chainer_autoprof report: cannot report on {args.trace} "
                          f"(internal error {type(exc).__name__}: {exc})\n")
        return 2
    write(sys.stdout, text + "\n")
    return 0


def report(args: argparse.Namespace) -> str:
    """The text to print (and the HTML page written); raises :class:`ReportError`."""
    given = [p for p in (args.trace, args.after) if p]
    paths = [resolve(path) for path in given]
    if args.html:
        problem = _html_problem(args.html, given + paths)
        if problem:
            raise ReportError(problem)
    traces = [read_trace(path) for path in paths]
    merged = [t.path for t in traces if is_merged(t)]
    if merged and (len(traces) > 1 or args.html):
        raise ReportError(f"{merged[0]} is a merged trace of several processes: "
                          + ("compare the traces merged, one process each" if len(traces) > 1
                             else "--html shows one process; give one of the traces merged"))
    if merged:
        return merged_summaries(traces[0], args)
    runs = [(trace, trace.stats(from_events=args.from_events)) for trace in traces]
    before = runs[0][1]
    after = runs[1][1] if len(runs) > 1 else None
    advice = not args.no_advice
    # the findings, computed once, are what the text and the page render
    pair = pick_replay(before, after) if after is not None else None
    if after is None:
        title = (f"chainer_autoprof report of {one_line(paths[0])}: "
                 f"{one_line(str(before.meta.get('command', '')))}")
        text = readable(format_summary(find(before, advice=advice), advice=advice,
                                       title=title.rstrip(": ")), before.meta)
    else:
        text = compare(before, after, args.trace, args.after)
        if pair is not None and advice:  # a normal run and its replay run: data made free
            text += "\n\n" + verdict_section(find(pair[0], replay=pair[1]))
        text += "".join(f"\n  {line}" for line in compare_sync(before, after))
        text = wrap_long_lines(text)
    if args.html and after is not None and pair is None:
        raise ReportError(f"--html shows one run (or a run beside its replay run), and "
                          f"{args.trace} and {args.after} are two runs: write a page of each "
                          "(report TRACE --html OUT.html)")
    if args.html:
        # the page shows the first run; of a normal run and its replay run, the normal one
        shown = runs[0] if pair is None or runs[0][1] is pair[0] else runs[1]
        try:
            write_report(args.html, shown[0],
                         find(shown[1], replay=pair[1] if pair is not None else None))
        except (OSError, ValueError) as exc:
            raise ReportError(f"cannot write {args.html}: {exc}") from None
    return text


def merged_summaries(trace: Trace, args: argparse.Namespace) -> str:
    """The summary of each process of merged ``trace``, one after the other."""
    parts = process_traces(trace)
    texts = [f"chainer_autoprof report of {one_line(trace.path)}: a merged trace of "
             f"{len(parts)} processes, each summarized on its own"]
    for n, (label, part) in enumerate(parts, 1):
        stats = part.stats(from_events=args.from_events)
        title = (f"[{n}/{len(parts)}] {one_line(label)}: "
                 f"{one_line(str(stats.meta.get('command', '')))}")
        texts.append(readable(format_summary(stats, advice=not args.no_advice,
                                             title=title.rstrip(": ")), stats.meta))
    return "\n\n".join(texts)


def _html_problem(path: str, inputs: list[str]) -> str | None:
    """Why the HTML report cannot go to ``path`` (checked before any work), else ``None``."""
    try:
        target = check_output(path)
    except ValueError as exc:
        return f"cannot write {path}: {exc}"
    if target in {os.path.realpath(p) for p in inputs}:
        return f"the HTML output {path} is one of the input traces"
    return None


def resolve(path: str) -> str:
    """The file to read for ``path``: its partial trace when only that exists (said on stderr)."""
    partial = partial_path(path)
    if not os.path.exists(partial):
        return path
    if not os.path.exists(path):
        write(sys.stderr, f"chainer_autoprof report: {path} does not exist; reading {partial}, "
                          "the trace so far of a run that did not end normally\n")
        return partial
    try:
        newer = os.path.getmtime(partial) > os.path.getmtime(path)
    except OSError:  # gone meanwhile: the read says what is wrong
        newer = False
    if newer:
        write(sys.stderr, f"chainer_autoprof report: note: {partial} is newer than {path}: a "
                          "later run with this trace path did not end normally (or is still "
                          f"running); 'report {partial}' reads what it left\n")
    return path


def _change(a: float, b: float) -> str:
    if a <= 0:
        return "new" if b > 0 else ""
    rel = (b - a) / a
    return f"{rel * 100:+.0f}%"


def _row(label: str, a: str, b: str, change: str) -> str:
    return f"  {label:<40} {a:>11} {b:>11} {change:>8}"


def compare(before: RunStats, after: RunStats, name_a: str = "before",
            name_b: str = "after") -> str:
    """Two runs side by side: iteration time, phases per iteration, time outside, links."""
    lines = [f"chainer_autoprof comparison: {name_a} -> {name_b}",
             _row("", "before", "after", "change")]
    lines.append(_row("counted iterations", str(before.iterations), str(after.iterations), ""))
    lines.append(_row("iteration median", fmt_ms(before.median()), fmt_ms(after.median()),
                      _change(before.median(), after.median())))
    lines.append(_row("iteration p95", fmt_ms(before.p95()), fmt_ms(after.p95()),
                      _change(before.p95(), after.p95())))
    lines.append(_row("iterations/s", f"{before.iterations_per_second():.1f}",
                      f"{after.iterations_per_second():.1f}",
                      _change(before.iterations_per_second(), after.iterations_per_second())))
    sa, sb = before.samples_per_second(), after.samples_per_second()
    if sa and sb:
        lines.append(_row("samples/s", f"{sa:,.0f}", f"{sb:,.0f}", _change(sa, sb)))
    lines.append("  per iteration (mean):")
    for key in PHASE_KEYS:
        if not (before.has_phases or after.has_phases) and key != "other":
            continue
        a = before.phase_total(key) / before.iterations if before.iterations else 0.0
        b = after.phase_total(key) / after.iterations if after.iterations else 0.0
        lines.append(_row("  " + PHASE_LABELS[key], fmt_ms(a), fmt_ms(b), _change(a, b)))
    keys = sorted(set(before.outside_ms) | set(after.outside_ms))
    if keys:
        lines.append("  outside iterations (total):")
        for key in keys:
            a, b = before.outside_ms.get(key, 0.0), after.outside_ms.get(key, 0.0)
            lines.append(_row("  " + outside_label(key)[:38], fmt_ms(a), fmt_ms(b), _change(a, b)))
    lines.append(_row("wall", fmt_ms(before.wall_ms), fmt_ms(after.wall_ms),
                      _change(before.wall_ms, after.wall_ms)))
    link_lines = _link_changes(before, after)
    if link_lines:
        lines.append("  links (forward + backward per iteration):")
        lines += link_lines
    lines.append("  => " + conclusion(before, after))
    return "\n".join(lines)


def _link_changes(before: RunStats, after: RunStats, top: int = 8) -> list[str]:
    if not before.links and not after.links:
        return []
    a_map = {s.name: s.total_ms / max(1, before.iterations) for s in before.links}
    b_map = {s.name: s.total_ms / max(1, after.iterations) for s in after.links}
    names = sorted(set(a_map) | set(b_map), key=lambda n: -max(a_map.get(n, 0), b_map.get(n, 0)))
    out = []
    for name in names[:top]:
        a, b = a_map.get(name, 0.0), b_map.get(name, 0.0)
        label = name if len(name) <= 38 else "..." + name[-35:]
        out.append(_row("  " + label, fmt_ms(a), fmt_ms(b), _change(a, b)))
    return out


def conclusion(before: RunStats, after: RunStats) -> str:
    """One sentence: faster or slower, and the phase that moved most."""
    if not before.iterations or not after.iterations:
        return "one of the runs has no counted iterations: nothing to compare per iteration."
    a, b = before.median(), after.median()
    rel = (b - a) / a if a > 0 else 0.0
    if abs(rel) < SAME_WITHIN:
        verdict = f"the median iteration is about the same ({fmt_ms(a)} -> {fmt_ms(b)})"
    else:
        word = "faster" if rel < 0 else "slower"
        factor = a / b if rel < 0 and b > 0 else b / a if a > 0 else 0.0
        verdict = f"the median iteration is {factor:.2f}x {word} ({fmt_ms(a)} -> {fmt_ms(b)})"
    moved = None
    for key in PHASE_KEYS:
        pa = before.phase_total(key) / before.iterations
        pb = after.phase_total(key) / after.iterations
        if moved is None or abs(pb - pa) > abs(moved[1]):
            moved = (key, pb - pa, pa, pb)
    if moved is not None and abs(moved[1]) > 0 and (before.has_phases or after.has_phases):
        key, delta, pa, pb = moved
        direction = "down" if delta < 0 else "up"
        verdict += (f"; {PHASE_LABELS[key]} moved most: {direction} by {fmt_ms(abs(delta))} "
                    f"per iteration ({fmt_ms(pa)} -> {fmt_ms(pb)})")
    return verdict + "."


if __name__ == "__main__":
    sys.exit(main())
