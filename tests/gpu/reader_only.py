"""On a GPU machine (``tests/gpu/measure.py``): a script run with the native CUPTI reader alone,
started as the agent starts it (the same activity kinds, the same calls) but its buffers
discarded: against the same run without it, what CUPTI's tracing and the reading in C cost,
without the agent's analysis of the records.

    python -m chainer_autoprof tests/gpu/reader_only.py tests/gpu/ptb.py --words 35000

(with ``CHAINER_PROF_GPU_ACTIVITY=0``: the agent's ranges as in the run it is compared with).
``READER_ONLY_CALLS=none``: every API call switched off again once started, CUPTI tracing the
operations alone (against the run with the calls: what recording them costs).
"""

from __future__ import annotations

import os
import runpy
import sys
import threading

from chainer_autoprof.runtime import cupti_native


def main() -> None:
    script, *args = sys.argv[1:]
    reader = cupti_native.start(lambda batch: None)
    if isinstance(reader, str):
        raise SystemExit(f"reader_only: {reader}")
    calls = reader.calls
    if os.environ.get("READER_ONLY_CALLS") == "none":
        reader._switch_off_calls()  # the launching calls switched on one by one
        ext = reader._ext
        for kind in cupti_native.API_KIND_IDS:  # (on where libcupti refused those switches)
            if kind in reader._enabled and ext is not None:
                ext.disable(kind)
        calls = "none"
    print(f"reader_only: CUPTI read by the native ({reader.library}) reader, "
          f"calls {calls}", file=sys.stderr)
    done = threading.Event()

    def drain() -> None:  # the walked buffers taken into Python as the agent's drain does
        while not done.wait(0.25):
            reader.hand_over()

    threading.Thread(target=drain, name="reader-only-drain", daemon=True).start()
    sys.argv = [script, *args]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        done.set()
        reader.flush()
        late = reader.stop(5.0)
        print(f"reader_only: {reader.records} records in {reader.buffers} buffers read"
              + (f" ({late})" if late else ""), file=sys.stderr)


if __name__ == "__main__":
    main()
