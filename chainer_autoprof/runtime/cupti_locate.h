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
/* join_block(store, clock, (correlation, start, end), block[, calls]) -> as api_join. */
PyObject *cupti_join_block(PyObject *self, PyObject *args);
/* locate_block(depths, kinds, link_ids, block, settling, status_sums): the settled sums added. */
PyObject *cupti_locate_block(PyObject *self, PyObject *args);
/* The rows of a block (join_block, locate_block) by name: a tuple of str. */
PyObject *cupti_block_rows(void);
/* to_agent(clock, src, dst) -> None: CUPTI ns onto the agent's clock. */
PyObject *cupti_to_agent(PyObject *self, PyObject *args);
/* (K_ITER, K_LINK, K_LINK_BWD, K_GC, K_PHASE0) as the C side counts them. */
PyObject *cupti_locate_kinds(void);

/* A buffer's table as the reader hands it over (cupti_native.c's Block): its first `width`
 * rows (row c, the column of that index, at rows[c]) and the count of rows filled; -1 where
 * obj is no such table (or has fewer columns): nothing set.  The operations' table's rows
 * read by this file, by index (GpuOps' columns; checked in cupti_native.c): */
Py_ssize_t cupti_table_rows(PyObject *obj, int width, const int64_t **rows);
enum {
    TABLE_OP_KIND = 0, TABLE_OP_START = 1, TABLE_OP_END = 2, TABLE_OP_CORR = 3,
    TABLE_OP_DEVICE = 4, TABLE_OP_NAME = 7, TABLE_OP_ROWS = 8
};

/* timeline_place(rows, iter_end, state, acc, constants) -> a chunk of a device's GPU timeline
 * placed (analysis.gpu_figures._Timeline): the finished windows and the state after. */
PyObject *cupti_timeline_place(PyObject *self, PyObject *args);
/* timeline_sort(chunks, out) -> None: a timeline's pooled rows into out, stably by start. */
PyObject *cupti_timeline_sort(PyObject *self, PyObject *args);

/* This file's functions added to the module (0; -1 with the error set). */
int cupti_locate_ready(PyObject *module);

#endif
