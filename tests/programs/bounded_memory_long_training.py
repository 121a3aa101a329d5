import gc
import json
import sys
import tracemalloc

# include: exit_status_train

from chainer_autoprof import agent

monitor = agent.current().monitor


def flush_peak():
    """The memory one write of the trace so far takes at its peak (bytes)."""
    gc.collect()
    tracemalloc.start()
    assert monitor.flush() is not None
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


early, late = int(sys.argv[1]), int(sys.argv[2])
for _ in range(early):
    step()
at_early = flush_peak()
for _ in range(late - early):
    step()
print(json.dumps({"early": at_early, "late": flush_peak()}))
