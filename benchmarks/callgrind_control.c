/* callgrind_control.c -- callgrind's client requests for Python (ctypes).
 *
 * benchmarks/hotpath.py runs its configurations in one process under
 * `valgrind --tool=callgrind --instr-atstart=no` and counts each measured
 * segment on its own: start(), the steps, dump(label), stop().  Outside
 * valgrind every call is a no-op.
 */
#include <valgrind/callgrind.h>

void start(void)
{
    CALLGRIND_START_INSTRUMENTATION;
    CALLGRIND_ZERO_STATS;
}

void dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }

void stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
