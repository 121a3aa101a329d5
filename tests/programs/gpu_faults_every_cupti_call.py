
import ctypes
from cupti import cupti
from cupti._internal.utils import NotSupportedError
from chainer_autoprof.runtime import gpu_activity as g

for name in g.ACTIVITY_KINDS:
    getattr(cupti.ActivityKind, name)
for name in g.QUIET_RUNTIME:
    getattr(cupti.runtime_api_trace_cbid, name)
for name in g.QUIET_DRIVER:
    getattr(cupti.driver_api_trace_cbid, name)
assert int(cupti.ActivityFlag.FLUSH_FORCED) == g.FLUSH_FORCED
kind = cupti.ActivityKind.CONCURRENT_KERNEL
dropped = ctypes.c_size_t(0)
calls = [
    ("set_thread_id_type", (cupti.ActivityThreadIdType.SYSTEM,)),
    ("activity_register_callbacks", (lambda: (8, 0), lambda records: None)),
    ("activity_enable", (kind,)),
    ("activity_disable", (kind,)),
    ("activity_enable_runtime_api", (int(cupti.runtime_api_trace_cbid.cudaGetDevice_v3020), 0)),
    ("activity_enable_driver_api", (int(cupti.driver_api_trace_cbid.cuCtxGetCurrent), 0)),
    ("activity_flush_period", (g.FLUSH_PERIOD_MS,)),
    ("activity_flush_all", (g.FLUSH_FORCED,)),
    ("activity_get_num_dropped_records", (0, 0, ctypes.addressof(dropped))),
    ("get_timestamp", ()),
]
for name, args in calls:
    try:
        getattr(cupti, name)(*args)
    except NotSupportedError:
        print(name, "reached the driver")
    try:
        getattr(cupti, name)(*args, 0)
    except TypeError:
        pass
    except NotSupportedError:
        raise SystemExit(f"{name} takes one argument more than the collector gives")
