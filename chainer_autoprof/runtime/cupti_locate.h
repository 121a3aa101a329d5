/* cupti_locate.h -- the range lookup of cupti_locate.c, a function of module _cupti. */
#ifndef CHAINER_AUTOPROF_CUPTI_LOCATE_H
#define CHAINER_AUTOPROF_CUPTI_LOCATE_H

#include <Python.h>

/* locate(t, depths, kinds, link_ids, out[, tail]) -> None, or the tail's sums. */
PyObject *cupti_locate(PyObject *self, PyObject *args);
/* api_store(max_api) -> the launching calls kept across buffers (a capsule). */
PyObject *cupti_api_store(PyObject *self, PyObject *arg);
/* api_add(store, columns, clock) -> None: a buffer's calls kept. */
PyObject *cupti_api_add(PyObject *self, PyObject *args);
/* api_join(store, correlation, out) -> (missing, thread, one thread, latest start). */
PyObject *cupti_api_join(PyObject *self, PyObject *args);
/* join_block(store, clock, (correlation, start, end), block) -> as api_join. */
PyObject *cupti_join_block(PyObject *self, PyObject *args);
/* locate_block(depths, kinds, link_ids, block, settling) -> the settled sums. */
PyObject *cupti_locate_block(PyObject *self, PyObject *args);
/* The rows of a block (join_block, locate_block) by name: a tuple of str. */
PyObject *cupti_block_rows(void);
/* to_agent(clock, src, dst) -> None: CUPTI ns onto the agent's clock. */
PyObject *cupti_to_agent(PyObject *self, PyObject *args);
/* (K_ITER, K_LINK, K_LINK_BWD, K_GC, K_PHASE0) as the C side counts them. */
PyObject *cupti_locate_kinds(void);

/* This file's functions added to the module (0; -1 with the error set). */
int cupti_locate_ready(PyObject *module);

#endif
