/* cupti_locate.c -- the launch attribution's range lookup in C (module _cupti: locate).
 *
 * Why: for every GPU operation the attribution finds, at each depth of its launching
 * thread's ranges, the range that contains the launch (analysis.gpu_attribution,
 * LaunchAttributor._locate).  In NumPy that is some twenty passes over the operations per
 * depth, about 2,000 instructions per operation on the recorded CNN; here it is one pass
 * per depth, the search started where the previous launch was found (launches come nearly
 * in order), without the GIL.  The NumPy loop stays as the twin where this module is not
 * built; both fill the same columns the same way (tests/test_gpu_native.py).
 *
 * locate(t, depths, kinds, link_ids, out):
 *   t        int64[n]: each operation's launch (agent ns);
 *   depths   ((depth, t0, t1, index, ordinal, number), ...) by depth, shallowest first:
 *            that depth's ranges, disjoint and sorted by t0 (int64 arrays of one length);
 *   kinds, link_ids  int64 per range name index (LaunchAttributor's tables);
 *   out      the OUT_N int64[n] columns below, written where a range contains the launch
 *            (a deeper one over a shallower one): range, range_t0, range_t1, range_depth
 *            (a garbage-collection range passed over for its parent), link and backward (a
 *            link or link-backward range), phase, iteration, number, iter_end, and the
 *            deepest depth that holds the launch.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "cupti_locate.h"

/* The kinds of a range name (analysis.gpu_attribution's K_*; checked from Python). */
enum { K_ITER = 1, K_LINK = 2, K_LINK_BWD = 3, K_GC = 4, K_PHASE0 = 10 };
enum {
    OUT_RANGE, OUT_RANGE_T0, OUT_RANGE_T1, OUT_RANGE_DEPTH, OUT_LINK, OUT_BACKWARD, OUT_PHASE,
    OUT_ITERATION, OUT_NUMBER, OUT_ITER_END, OUT_DEPTH_HIT, OUT_N
};
enum { D_T0, D_T1, D_INDEX, D_ORDINAL, D_NUMBER, D_N };

/* The last k with a[k] <= x (-1: none); the search starts at `hint`. */
static Py_ssize_t last_at_or_before(const int64_t *a, Py_ssize_t m, int64_t x, Py_ssize_t hint)
{
    Py_ssize_t lo = -1, hi = m; /* a[lo] <= x (or lo == -1); a[hi] > x (or hi == m) */
    if (hint >= 0 && hint < m) {
        if (a[hint] <= x) {
            if (hint + 1 == m || a[hint + 1] > x)
                return hint; /* the usual: the previous launch's range */
            Py_ssize_t step = 1;
            lo = hint + 1;
            while (lo + step < m && a[lo + step] <= x) {
                lo += step;
                step <<= 1;
            }
            hi = lo + step < m ? lo + step : m;
        } else {
            hi = hint;
        }
    }
    while (hi - lo > 1) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (a[mid] <= x)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* The arrays' buffers held during a call (room for every one it takes). */
typedef struct {
    Py_buffer *views;
    Py_ssize_t n, cap;
} held;

static void release_all(held *h)
{
    while (h->n > 0)
        PyBuffer_Release(&h->views[--h->n]);
    PyMem_Free(h->views);
    h->views = NULL;
}

/* obj's memory as int64[*count] (count -1: any length, set here); NULL with an error. */
static int64_t *int64s(held *h, PyObject *obj, Py_ssize_t *count, int writable)
{
    if (h->n == h->cap) {
        PyErr_SetString(PyExc_ValueError, "locate: more arrays than counted");
        return NULL;
    }
    Py_buffer *v = &h->views[h->n];
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, v, flags) < 0)
        return NULL;
    h->n++;
    Py_ssize_t items = v->len / 8;
    if (v->itemsize != 8 || v->format == NULL || strchr("lq", v->format[0]) == NULL
        || v->format[1] != '\0' || (*count >= 0 && items != *count)) {
        PyErr_SetString(PyExc_ValueError, "locate: int64 arrays of the expected length");
        return NULL;
    }
    *count = items;
    return (int64_t *)v->buf;
}

typedef struct {
    Py_ssize_t depth, m;
    const int64_t *col[D_N];
} level;

PyObject *cupti_locate(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *t_obj, *depths, *kinds_obj, *links_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "OOOOO", &t_obj, &depths, &kinds_obj, &links_obj, &out_obj))
        return NULL;
    held h = {NULL, 0, 0};
    level *levels = NULL;
    PyObject *depth_seq = NULL, *out_seq = NULL, *result = NULL;
    Py_ssize_t n = -1, n_kinds = -1, n_links = -1;
    depth_seq = PySequence_Fast(depths, "locate: depths is a sequence");
    if (depth_seq == NULL)
        goto done;
    Py_ssize_t n_levels = PySequence_Fast_GET_SIZE(depth_seq);
    h.cap = 3 + OUT_N + D_N * n_levels;
    h.views = PyMem_Calloc((size_t)h.cap, sizeof(Py_buffer));
    levels = PyMem_Calloc((size_t)(n_levels ? n_levels : 1), sizeof(level));
    if (h.views == NULL || levels == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *t = int64s(&h, t_obj, &n, 0);
    const int64_t *kinds = t ? int64s(&h, kinds_obj, &n_kinds, 0) : NULL;
    const int64_t *link_ids = kinds ? int64s(&h, links_obj, &n_links, 0) : NULL;
    if (link_ids == NULL)
        goto done;
    if (n_links != n_kinds) {
        PyErr_SetString(PyExc_ValueError, "locate: kinds and link ids differ in length");
        goto done;
    }
    out_seq = PySequence_Fast(out_obj, "locate: out is a sequence of arrays");
    if (out_seq == NULL)
        goto done;
    if (PySequence_Fast_GET_SIZE(out_seq) != OUT_N) {
        PyErr_Format(PyExc_ValueError, "locate: %d output columns", (int)OUT_N);
        goto done;
    }
    int64_t *out[OUT_N];
    for (int c = 0; c < OUT_N; c++) {
        Py_ssize_t len = n;
        out[c] = int64s(&h, PySequence_Fast_GET_ITEM(out_seq, c), &len, 1);
        if (out[c] == NULL)
            goto done;
    }
    for (Py_ssize_t d = 0; d < n_levels; d++) {
        PyObject *item = PySequence_Fast_GET_ITEM(depth_seq, d), *depth;
        PyObject *cols[D_N];
        if (!PyArg_ParseTuple(item, "OOOOOO", &depth, &cols[D_T0], &cols[D_T1], &cols[D_INDEX],
                              &cols[D_ORDINAL], &cols[D_NUMBER]))
            goto done;
        levels[d].depth = PyLong_AsSsize_t(depth);
        if (levels[d].depth == -1 && PyErr_Occurred())
            goto done;
        Py_ssize_t m = -1;
        for (int c = 0; c < D_N; c++) {
            levels[d].col[c] = int64s(&h, cols[c], &m, 0);
            if (levels[d].col[c] == NULL)
                goto done;
        }
        levels[d].m = m;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t d = 0; d < n_levels; d++) {
        const level *L = &levels[d];
        const int64_t *t0 = L->col[D_T0], *t1 = L->col[D_T1], *index = L->col[D_INDEX];
        Py_ssize_t k = -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            k = last_at_or_before(t0, L->m, t[i], k);
            if (k < 0 || t[i] > t1[k])
                continue;
            int64_t idx = index[k];
            int known = idx >= 0 && idx < n_kinds;
            int64_t kind = known ? kinds[idx] : 0;
            if (kind != K_GC) {
                out[OUT_RANGE][i] = idx;
                out[OUT_RANGE_T0][i] = t0[k];
                out[OUT_RANGE_T1][i] = t1[k];
                out[OUT_RANGE_DEPTH][i] = L->depth;
            }
            out[OUT_DEPTH_HIT][i] = L->depth;
            if (kind == K_LINK || kind == K_LINK_BWD) {
                out[OUT_LINK][i] = known ? link_ids[idx] : -1;
                out[OUT_BACKWARD][i] = kind == K_LINK_BWD;
            }
            if (kind >= K_PHASE0)
                out[OUT_PHASE][i] = kind - K_PHASE0;
            if (kind == K_ITER) {
                out[OUT_ITERATION][i] = L->col[D_ORDINAL][k];
                out[OUT_NUMBER][i] = L->col[D_NUMBER][k];
                out[OUT_ITER_END][i] = t1[k];
            }
        }
    }
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    result = Py_None;
done:
    release_all(&h);
    PyMem_Free(levels);
    Py_XDECREF(depth_seq);
    Py_XDECREF(out_seq);
    return result;
}

PyObject *cupti_locate_kinds(void)
{
    return Py_BuildValue("(iiiii)", K_ITER, K_LINK, K_LINK_BWD, K_GC, K_PHASE0);
}
