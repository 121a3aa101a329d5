/*
 * module.c -- the native implementation of chainer_autoprof's hot path: the module.
 *
 * The twin of python.py (one protocol, protocol.py; chosen in __init__.py).  Each C
 * file adds its part (native.h lists them); PROTOCOL is the one of protocol.py, which
 * build.py hands to the compiler.
 */

#include "native.h"

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "chainer_autoprof.runtime.hotpath._native",
    .m_doc = "The native implementation of the hot path (the twin of python.py).",
    .m_size = -1,
};

__attribute__((visibility("default"))) PyMODINIT_FUNC PyInit__native(void)
{
    PyObject *m = PyModule_Create(&module_def);

    if (m == NULL)
        return NULL;
    if (core_ready(m) < 0 || nvtx_ready(m) < 0 || record_ready(m) < 0 || wrappers_ready(m) < 0
        || term_guard_ready(m) < 0
        || PyModule_AddIntConstant(m, "PROTOCOL", CHAINER_AUTOPROF_PROTOCOL) < 0
        /* its wrappers are C: no Python frame of ours while the user's code runs */
        || PyModule_AddObject(m, "WRAPPER_FRAMES", Py_NewRef(Py_False)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
