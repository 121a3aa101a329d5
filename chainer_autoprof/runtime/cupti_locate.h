/* cupti_locate.h -- the range lookup of cupti_locate.c, a function of module _cupti. */
#ifndef CHAINER_AUTOPROF_CUPTI_LOCATE_H
#define CHAINER_AUTOPROF_CUPTI_LOCATE_H

#include <Python.h>

/* locate(t, depths, kinds, link_ids, out) -> None (see cupti_locate.c). */
PyObject *cupti_locate(PyObject *self, PyObject *args);
/* (K_ITER, K_LINK, K_LINK_BWD, K_GC, K_PHASE0) as the C side counts them. */
PyObject *cupti_locate_kinds(void);

#endif
