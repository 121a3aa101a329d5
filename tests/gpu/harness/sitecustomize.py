"""tests/gpu/run.sh only (a GPU machine): lets Chainer 7.8.1 import on Python 3.12 with NumPy 2.

Chainer 7.8.1 reads numpy.distutils.system_info (macOS BLAS check only) and
numpy.sctypes (as_strided), both gone from NumPy 2 / Python 3.12. Nothing else
is changed. Not part of the project.
"""
import sys
import types

try:
    import numpy as _np

    if not hasattr(_np, "sctypes"):
        _np.sctypes = {
            "int": [_np.int8, _np.int16, _np.int32, _np.int64],
            "uint": [_np.uint8, _np.uint16, _np.uint32, _np.uint64],
            "float": [_np.float16, _np.float32, _np.float64, _np.longdouble],
            "complex": [_np.complex64, _np.complex128, _np.clongdouble],
            "others": [bool, object, bytes, str, _np.void],
        }
    try:
        import numpy.distutils.system_info  # noqa: F401
    except Exception:
        _d = types.ModuleType("numpy.distutils")
        _s = types.ModuleType("numpy.distutils.system_info")
        _s.get_info = lambda name, notfound_action=0: {}
        _d.system_info = _s
        sys.modules["numpy.distutils"] = _d
        sys.modules["numpy.distutils.system_info"] = _s
except Exception as _e:  # never stop the interpreter
    sys.stderr.write(f"gpu-harness sitecustomize: {_e}\n")

# the carried site folder is on PYTHONPATH, where .pth files are not read: read them (the agent's
# start-up hook, chainer_autoprof.pth, for environment-only activation).
try:
    import os as _os
    import site as _site

    _site.addsitedir(_os.path.dirname(_os.path.abspath(__file__)))
except Exception as _e:
    sys.stderr.write(f"gpu-harness sitecustomize: {_e}\n")
