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
 *            or (depth, table): those five as the rows of one C-ordered int64[5][m] (one
 *            buffer taken per depth, not five);
 *   kinds, link_ids  int64 per range name index (LaunchAttributor's tables);
 *   out      the OUT_N int64[n] columns below, written where a range contains the launch
 *            (a deeper one over a shallower one): range, range_t0, range_t1, range_depth
 *            (a garbage-collection range passed over for its parent), link and backward (a
 *            link or link-backward range), phase, iteration, number, iter_end, and the
 *            deepest depth that holds the launch;
 *   tail     (given only where the thread's ranges are known past every launch: the walk
 *            goes launch by launch and sets every column) (counted, status, tid, start,
 *            end, warmup_skip, horizon_ns, PHASE_OUTSIDE, PHASE_OTHER, ATTRIBUTED,
 *            RANGES_DROPPED, the agent's thread): each operation settled as
 *            LaunchAttributor._locate does it (tid: that thread), and (ops, ns) attributed
 *            and (ops, ns) with their ranges dropped returned.
 *
 * The same module keeps the launching calls across buffers (api_store, api_add, api_join),
 * maps CUPTI's clock (to_agent) and sums the figures (figure_add): each the twin of a NumPy
 * path of analysis/, which passes its constants down as data.  The usual buffer's join and
 * lookup (join_block, locate_block) take its attribution as one table, not column by column.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__) && defined(__x86_64__)
#include <emmintrin.h> /* _mm_cvtsd_si64: to_agent's rounding */
#endif

#include "cupti_locate.h"

/* The kinds of a range name (analysis.gpu_attribution's K_*; checked from Python). */
enum { K_ITER = 1, K_LINK = 2, K_LINK_BWD = 3, K_GC = 4, K_PHASE0 = 10 };
enum {
    OUT_RANGE, OUT_RANGE_T0, OUT_RANGE_T1, OUT_RANGE_DEPTH, OUT_LINK, OUT_BACKWARD, OUT_PHASE,
    OUT_ITERATION, OUT_NUMBER, OUT_ITER_END, OUT_DEPTH_HIT, OUT_N
};
enum { D_T0, D_T1, D_INDEX, D_ORDINAL, D_NUMBER, D_N };

/* The last k with a[k] <= x (-1: none); the search starts at `hint`. */
static inline Py_ssize_t last_at_or_before(const int64_t *a, Py_ssize_t m, int64_t x,
                                           Py_ssize_t hint)
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

/* seq's `count` arrays as int64[*n] each (into cols; *n -1: any length, set here); 0, or
 * -1 with the error set. */
static int int64_columns(held *h, PyObject *seq_obj, int count, Py_ssize_t *n, int writable,
                         int64_t **cols)
{
    PyObject *seq = PySequence_Fast(seq_obj, "a sequence of int64 columns");
    if (seq == NULL)
        return -1;
    int ok = PySequence_Fast_GET_SIZE(seq) == count;
    if (!ok)
        PyErr_Format(PyExc_ValueError, "%d int64 columns expected", count);
    for (int c = 0; ok && c < count; c++) {
        cols[c] = int64s(h, PySequence_Fast_GET_ITEM(seq, c), n, writable);
        ok = cols[c] != NULL;
    }
    Py_DECREF(seq);
    return ok ? 0 : -1;
}

/* h made with room for `room` buffers, then seq's `count` columns read into cols (as
 * int64_columns); 0, or -1 with the error set (release_all(h) either way). */
static int columns_held(held *h, Py_ssize_t room, PyObject *seq, int count, Py_ssize_t *n,
                        int writable, int64_t **cols)
{
    h->views = PyMem_Calloc((size_t)room, sizeof(Py_buffer));
    h->n = 0;
    h->cap = room;
    if (h->views == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return int64_columns(h, seq, count, n, writable, cols);
}

typedef struct {
    Py_ssize_t depth, m;
    const int64_t *col[D_N];
} level;

/* The range names' kinds and link ids. */
typedef struct {
    const int64_t *kinds, *link_ids;
    Py_ssize_t n;
} name_kinds;

/* Launch i lies in range k of level L: the columns that range fills. */
static inline void fill_hit(const level *L, Py_ssize_t k, Py_ssize_t i, const name_kinds *names,
                            int64_t *const *out)
{
    int64_t idx = L->col[D_INDEX][k];
    int known = idx >= 0 && idx < names->n;
    int64_t kind = known ? names->kinds[idx] : 0;
    if (kind != K_GC) {
        out[OUT_RANGE][i] = idx;
        out[OUT_RANGE_T0][i] = L->col[D_T0][k];
        out[OUT_RANGE_T1][i] = L->col[D_T1][k];
        out[OUT_RANGE_DEPTH][i] = L->depth;
    }
    out[OUT_DEPTH_HIT][i] = L->depth;
    if (kind == K_LINK || kind == K_LINK_BWD) {
        out[OUT_LINK][i] = known ? names->link_ids[idx] : -1;
        out[OUT_BACKWARD][i] = kind == K_LINK_BWD;
    }
    if (kind >= K_PHASE0)
        out[OUT_PHASE][i] = kind - K_PHASE0;
    if (kind == K_ITER) {
        out[OUT_ITERATION][i] = L->col[D_ORDINAL][k];
        out[OUT_NUMBER][i] = L->col[D_NUMBER][k];
        out[OUT_ITER_END][i] = L->col[D_T1][k];
    }
}

/* The depth walk: each level's range holding each launch fills the columns. */
static void walk_levels(const level *levels, Py_ssize_t n_levels, const int64_t *t, Py_ssize_t n,
                        const name_kinds *names, int64_t *const *out)
{
    for (Py_ssize_t d = 0; d < n_levels; d++) {
        const level *L = &levels[d];
        Py_ssize_t k = -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            k = last_at_or_before(L->col[D_T0], L->m, t[i], k);
            if (k >= 0 && t[i] <= L->col[D_T1][k])
                fill_hit(L, k, i, names, out);
        }
    }
}

/* The tail of a located block (the attribution's settling of each operation, see
 * LaunchAttributor._locate): the phase "other" inside an iteration, counted after the
 * warm-up, the status (ranges dropped before the thread's horizon), the agent's thread, and
 * the sums per status of operations and GPU ns. */
typedef struct {
    int64_t *counted, *status, *tid;
    const int64_t *start, *end;
    int64_t warmup_skip, horizon_ns, phase_outside, phase_other, attributed, dropped, thread;
} settling;

enum { T_COUNTED, T_STATUS, T_TID, T_START, T_END, T_N }; /* the written ones first */

/* The sums per status: [0] attributed, [1] with their ranges dropped. */
typedef struct {
    long long ops[2], ns[2];
} settled;

/* dst[0..n) = v, four a turn in two stores of a pair (GCC's -O2 leaves the plain loop at
 * a store and three more instructions a row). */
typedef int64_t fill64 __attribute__((vector_size(2 * sizeof(int64_t))));

static void fill_int64s(int64_t *dst, Py_ssize_t n, int64_t v)
{
    const fill64 pair = {v, v};
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4) {
        memcpy(dst + i, &pair, sizeof pair); /* unaligned */
        memcpy(dst + i + 2, &pair, sizeof pair);
    }
    for (; i < n; i++)
        dst[i] = v;
}

/* The same walk, launch by launch, where every range around a launch is known (the thread's
 * ranges fed past it: each range's parent is kept): a launch outside every range of a
 * level is outside every deeper one, so its walk stops there; and a launch inside the
 * deepest range that held the previous one, before its end, lies in the same ranges down
 * to there (each one's parent holds it; a range of the same level starts at that end at
 * the soonest), so only the levels below are searched.  Every column is set here.
 * Moreover the previous launch's walk says for which launches it would come out the same:
 * those in its deepest range (before its end, as above) and in the gap it found at the
 * level below (after the range there that ends before it, before the next one starts):
 * the usual launch, next to the previous one, then only copies its columns, no level
 * searched.  `hints`: one per level.
 * Each launch is settled as it is located (s: see settling; the sums into *sums), in the
 * same pass: a launch located as the previous one copies its counted flag and its phase
 * as settled (settling them again would give the same: the phase's "other" only replaces
 * "outside" inside an iteration, and a copy keeps the iteration). */
static void walk_launches(const level *levels, Py_ssize_t n_levels, const int64_t *t,
                          Py_ssize_t n, const name_kinds *names, int64_t *const *out,
                          Py_ssize_t *hints, const settling *s, settled *sums)
{
    int64_t *o[OUT_N]; /* the columns, held here: a store to one cannot move another */
    memcpy(o, out, sizeof o);
    /* the settling's columns and constants in locals (no reload per row) */
    int64_t *const counted = s->counted, *const status = s->status, *const tid = s->tid;
    const int64_t *const start = s->start, *const end = s->end;
    const int64_t outside = s->phase_outside, other = s->phase_other, warmup = s->warmup_skip,
                  horizon = s->horizon_ns;
    const int64_t dropped_state = s->dropped;
    long long ns = 0, ops_dropped = 0, ns_dropped = 0;
    /* the usual status and the thread of every row written first, a store per two rows: a
     * row then only marks its ranges dropped (rarely: before the thread's horizon) */
    fill_int64s(status, n, s->attributed);
    fill_int64s(tid, n, s->thread);
    Py_ssize_t deepest = -1; /* the level of the previous launch's deepest range */
    int64_t held_t0 = 0, held_t1 = 0;
    int64_t same_lo = 1, same_hi = 0; /* launches located as the previous one: none yet */
    for (Py_ssize_t d = 0; d < n_levels; d++)
        hints[d] = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t x = t[i];
        if (x >= same_lo && x <= same_hi) {
#pragma GCC unroll 16
            for (int c = 0; c < OUT_N; c++)
                o[c][i] = o[c][i - 1];
            counted[i] = counted[i - 1];
            goto settle;
        }
        Py_ssize_t d = 0;
        if (deepest >= 0 && x >= held_t0 && x < held_t1) {
#pragma GCC unroll 16
            for (int c = 0; c < OUT_N; c++)
                o[c][i] = o[c][i - 1];
            d = deepest + 1;
        } else {
#pragma GCC unroll 16
            for (int c = 0; c < OUT_N; c++)
                o[c][i] = c == OUT_BACKWARD ? 0 : -1;
            deepest = -1;
        }
        int64_t gap_lo = INT64_MIN, gap_hi = INT64_MAX; /* the gap at the level missed */
        for (; d < n_levels; d++) {
            const level *L = &levels[d];
            Py_ssize_t k = hints[d] = last_at_or_before(L->col[D_T0], L->m, x, hints[d]);
            if (k < 0 || x > L->col[D_T1][k]) { /* (t1[k] < x, x < t0[k + 1]: no overflow) */
                if (k >= 0)
                    gap_lo = L->col[D_T1][k] + 1;
                if (k + 1 < L->m)
                    gap_hi = L->col[D_T0][k + 1] - 1;
                break;
            }
            fill_hit(L, k, i, names, o);
            deepest = d;
            held_t0 = L->col[D_T0][k];
            held_t1 = L->col[D_T1][k];
        }
        same_lo = deepest >= 0 && held_t0 > gap_lo ? held_t0 : gap_lo;
        same_hi = deepest >= 0 && held_t1 - 1 < gap_hi ? held_t1 - 1 : gap_hi;
        {
            const int64_t it = o[OUT_ITERATION][i];
            const int in_iter = it >= 0;
            if (in_iter && o[OUT_PHASE][i] == outside)
                o[OUT_PHASE][i] = other;
            counted[i] = in_iter && it >= warmup;
        }
    settle:;
        const long long dur = (long long)(end[i] - start[i]);
        ns += dur;
        if (x < horizon) {
            status[i] = dropped_state;
            ops_dropped++;
            ns_dropped += dur;
        }
    }
    *sums = (settled){{n - ops_dropped, ops_dropped}, {ns - ns_dropped, ns_dropped}};
}

/* The settled sums as the locate functions return them: (ops, ns) attributed, (ops, ns) with
 * their ranges dropped. */
static PyObject *settled_sums(const settled *sums)
{
    return Py_BuildValue("(LLLL)", sums->ops[0], sums->ns[0], sums->ops[1], sums->ns[1]);
}

/* The depths' tables (see locate) into levels (one per item of depth_seq), their buffers
 * held in h; 0, or -1 with the error set. */
static int levels_held(held *h, PyObject *depth_seq, level *levels)
{
    const Py_ssize_t n_levels = PySequence_Fast_GET_SIZE(depth_seq);
    for (Py_ssize_t d = 0; d < n_levels; d++) {
        PyObject *item = PySequence_Fast_GET_ITEM(depth_seq, d), *depth, *table;
        PyObject *cols[D_N];
        Py_ssize_t m = -1;
        if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 2) { /* (depth, one table) */
            if (!PyArg_ParseTuple(item, "OO", &depth, &table))
                return -1;
            const int64_t *cells = int64s(h, table, &m, 0);
            if (cells == NULL)
                return -1;
            if (m % D_N) {
                PyErr_SetString(PyExc_ValueError, "locate: a depth's table of 5 rows");
                return -1;
            }
            m /= D_N;
            for (int c = 0; c < D_N; c++)
                levels[d].col[c] = cells + c * m;
        } else {
            if (!PyArg_ParseTuple(item, "OOOOOO", &depth, &cols[D_T0], &cols[D_T1],
                                  &cols[D_INDEX], &cols[D_ORDINAL], &cols[D_NUMBER]))
                return -1;
            for (int c = 0; c < D_N; c++) {
                levels[d].col[c] = int64s(h, cols[c], &m, 0);
                if (levels[d].col[c] == NULL)
                    return -1;
            }
        }
        levels[d].depth = PyLong_AsSsize_t(depth);
        if (levels[d].depth == -1 && PyErr_Occurred())
            return -1;
        levels[d].m = m;
    }
    return 0;
}

PyObject *cupti_locate(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *t_obj, *depths, *kinds_obj, *links_obj, *out_obj, *tail_obj = Py_None;
    if (!PyArg_ParseTuple(args, "OOOOO|O", &t_obj, &depths, &kinds_obj, &links_obj, &out_obj,
                          &tail_obj))
        return NULL;
    held h = {NULL, 0, 0};
    level *levels = NULL;
    PyObject *depth_seq = NULL, *result = NULL;
    Py_ssize_t n = -1, n_kinds = -1, n_links = -1;
    depth_seq = PySequence_Fast(depths, "locate: depths is a sequence");
    if (depth_seq == NULL)
        goto done;
    Py_ssize_t n_levels = PySequence_Fast_GET_SIZE(depth_seq);
    h.cap = 3 + OUT_N + T_N + D_N * n_levels;
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
    int64_t *out[OUT_N];
    if (int64_columns(&h, out_obj, OUT_N, &n, 1, out) < 0)
        goto done;
    settling st;
    memset(&st, 0, sizeof st);
    if (tail_obj != Py_None) {
        PyObject *cols[T_N];
        long long w, hz, po, pth, at, dr, tid;
        if (!PyArg_ParseTuple(tail_obj, "OOOOOLLLLLLL", &cols[T_COUNTED], &cols[T_STATUS],
                              &cols[T_TID], &cols[T_START], &cols[T_END], &w, &hz, &po, &pth,
                              &at, &dr, &tid))
            goto done;
        int64_t *c[T_N];
        for (int k = 0; k < T_N; k++) {
            Py_ssize_t len = n;
            c[k] = int64s(&h, cols[k], &len, k < T_START);
            if (c[k] == NULL)
                goto done;
        }
        st = (settling){c[T_COUNTED], c[T_STATUS], c[T_TID], c[T_START], c[T_END],
                        w, hz, po, pth, at, dr, tid};
    }
    if (levels_held(&h, depth_seq, levels) < 0)
        goto done;
    name_kinds names = {kinds, link_ids, n_kinds};
    Py_ssize_t *hints = NULL;
    if (tail_obj != Py_None) {
        hints = PyMem_Calloc((size_t)(n_levels ? n_levels : 1), sizeof(Py_ssize_t));
        if (hints == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    settled sums;
    Py_BEGIN_ALLOW_THREADS
    if (hints != NULL)
        walk_launches(levels, n_levels, t, n, &names, out, hints, &st, &sums);
    else
        walk_levels(levels, n_levels, t, n, &names, out);
    Py_END_ALLOW_THREADS
    PyMem_Free(hints);
    result = tail_obj != Py_None ? settled_sums(&sums) : Py_NewRef(Py_None);
done:
    release_all(&h);
    PyMem_Free(levels);
    Py_XDECREF(depth_seq);
    return result;
}

/* -- a buffer's attribution as one block ----------------------------------------------------
 *
 * The usual buffer (LaunchAttributor._feed_native) keeps its operations' mapped times and
 * their attribution as the rows of one C-ordered int64[B_N][n] table: the join and the
 * lookup each take it as one array (one buffer to take, not twenty columns, each of which
 * costs NumPy some 800 instructions to hand over).  Its rows, by name (checked from
 * Python: BLOCK_ROWS): */
enum {
    B_START, B_END, B_STATUS, B_API_START, B_API_END, B_API_DOMAIN, B_CBID, B_TID, B_RANGE,
    B_RANGE_T0, B_RANGE_T1, B_RANGE_DEPTH, B_LINK, B_BACKWARD, B_PHASE, B_ITERATION, B_NUMBER,
    B_ITER_END, B_COUNTED, B_DEPTH_HIT, B_N
};
static const char *const BLOCK_ROWS[B_N] = {
    "start", "end", "status", "api_start", "api_end", "api_domain", "cbid", "tid", "range",
    "range_t0", "range_t1", "range_depth", "link", "backward", "phase", "iteration", "number",
    "iter_end", "counted", "depth_hit"};
_Static_assert(B_ITER_END - B_RANGE == OUT_ITER_END - OUT_RANGE,
               "the lookup's columns are consecutive rows of a block, in its order");

/* The block's rows (row r at rows[r]) and its operations, from obj (int64[B_N][n]); -1 with
 * the error set. */
static Py_ssize_t block_rows(held *h, PyObject *obj, int64_t **rows)
{
    Py_ssize_t cells = -1;
    int64_t *cell = int64s(h, obj, &cells, 1);
    if (cell == NULL)
        return -1;
    if (cells % B_N) {
        PyErr_Format(PyExc_ValueError, "a block of %d rows", (int)B_N);
        return -1;
    }
    const Py_ssize_t n = cells / B_N;
    for (int r = 0; r < B_N; r++)
        rows[r] = cell + r * n;
    return n;
}

/* The thread's depths as the attribution keeps them ({depth: an object whose `table` is that
 * depth's int64[5][m]}: its _Depth) into levels, those with ranges, shallowest first; their
 * count, or -1 with the error set.  (Read here rather than listed in Python at each buffer:
 * a thread has a depth per level of nesting, tens of them.) */
static Py_ssize_t levels_of(held *h, PyObject *depths, level *levels)
{
    static PyObject *table_name;
    if (table_name == NULL && (table_name = PyUnicode_InternFromString("table")) == NULL)
        return -1;
    Py_ssize_t pos = 0, n_levels = 0;
    PyObject *key, *value;
    while (PyDict_Next(depths, &pos, &key, &value)) {
        Py_ssize_t depth = PyLong_AsSsize_t(key), cells = -1;
        if (depth == -1 && PyErr_Occurred())
            return -1;
        PyObject *table = PyObject_GetAttr(value, table_name);
        if (table == NULL)
            return -1;
        const int64_t *cell = int64s(h, table, &cells, 0); /* held: the table lives on */
        Py_DECREF(table);
        if (cell == NULL)
            return -1;
        if (cells % D_N) {
            PyErr_SetString(PyExc_ValueError, "locate: a depth's table of 5 rows");
            return -1;
        }
        const Py_ssize_t m = cells / D_N;
        if (m == 0)
            continue;
        Py_ssize_t at = n_levels++; /* in depth order (insertion: dicts come nearly sorted) */
        while (at > 0 && levels[at - 1].depth > depth) {
            levels[at] = levels[at - 1];
            at--;
        }
        levels[at].depth = depth;
        levels[at].m = m;
        for (int c = 0; c < D_N; c++)
            levels[at].col[c] = cell + c * m;
    }
    return n_levels;
}

/* locate_block(depths, kinds, link_ids, block, (warmup_skip, horizon_ns, PHASE_OUTSIDE,
 * PHASE_OTHER, ATTRIBUTED, RANGES_DROPPED, the agent's thread), status_sums): locate with a
 * tail, on a block (each launch at its row api_start, the thread's ranges known past every
 * launch); depths: the thread's dict (levels_of); the settled (ops, ns) added to the rows
 * ATTRIBUTED and RANGES_DROPPED of status_sums (int64[statuses][2], the attribution's). */
PyObject *cupti_locate_block(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *depths, *kinds_obj, *links_obj, *block_obj, *sums_obj;
    long long w, hz, po, pth, at, dr, tid;
    if (!PyArg_ParseTuple(args, "OOOO(LLLLLLL)O", &depths, &kinds_obj, &links_obj, &block_obj,
                          &w, &hz, &po, &pth, &at, &dr, &tid, &sums_obj))
        return NULL;
    held h = {NULL, 0, 0};
    level *levels = NULL;
    Py_ssize_t *hints = NULL;
    PyObject *result = NULL;
    Py_ssize_t n_kinds = -1, n_links = -1;
    if (!PyDict_Check(depths)) {
        PyErr_SetString(PyExc_TypeError, "locate_block: depths is a dict");
        return NULL;
    }
    Py_ssize_t n_levels = PyDict_Size(depths);
    h.cap = 4 + n_levels;
    h.views = PyMem_Calloc((size_t)h.cap, sizeof(Py_buffer));
    levels = PyMem_Calloc((size_t)(n_levels ? n_levels : 1), sizeof(level));
    hints = PyMem_Calloc((size_t)(n_levels ? n_levels : 1), sizeof(Py_ssize_t));
    if (h.views == NULL || levels == NULL || hints == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t *row[B_N];
    const Py_ssize_t n = block_rows(&h, block_obj, row);
    const int64_t *kinds = n >= 0 ? int64s(&h, kinds_obj, &n_kinds, 0) : NULL;
    const int64_t *link_ids = kinds ? int64s(&h, links_obj, &n_links, 0) : NULL;
    if (link_ids == NULL || (n_levels = levels_of(&h, depths, levels)) < 0)
        goto done;
    if (n_links != n_kinds) {
        PyErr_SetString(PyExc_ValueError, "locate: kinds and link ids differ in length");
        goto done;
    }
    Py_ssize_t n_sums = -1;
    int64_t *status_sums = int64s(&h, sums_obj, &n_sums, 1);
    if (status_sums == NULL)
        goto done;
    if (at < 0 || dr < 0 || 2 * at + 1 >= n_sums || 2 * dr + 1 >= n_sums) {
        PyErr_SetString(PyExc_ValueError, "locate_block: status sums of every status");
        goto done;
    }
    int64_t *out[OUT_N];
    for (int c = OUT_RANGE; c <= OUT_ITER_END; c++)
        out[c] = row[B_RANGE + (c - OUT_RANGE)];
    out[OUT_DEPTH_HIT] = row[B_DEPTH_HIT];
    settling st = {row[B_COUNTED], row[B_STATUS], row[B_TID], row[B_START], row[B_END],
                   w, hz, po, pth, at, dr, tid};
    name_kinds names = {kinds, link_ids, n_kinds};
    const int64_t *t = row[B_API_START];
    settled sums;
    Py_BEGIN_ALLOW_THREADS
    walk_launches(levels, n_levels, t, n, &names, out, hints, &st, &sums);
    Py_END_ALLOW_THREADS
    status_sums[2 * at] += sums.ops[0];
    status_sums[2 * at + 1] += sums.ns[0];
    status_sums[2 * dr] += sums.ops[1];
    status_sums[2 * dr + 1] += sums.ns[1];
    result = Py_NewRef(Py_None);
done:
    release_all(&h);
    PyMem_Free(levels);
    PyMem_Free(hints);
    return result;
}

/* BLOCK_ROWS as a tuple of str. */
PyObject *cupti_block_rows(void)
{
    PyObject *names = PyTuple_New(B_N);
    for (int r = 0; names != NULL && r < B_N; r++) {
        PyObject *name = PyUnicode_FromString(BLOCK_ROWS[r]);
        if (name == NULL)
            Py_CLEAR(names);
        else
            PyTuple_SET_ITEM(names, r, name);
    }
    return names;
}

PyObject *cupti_locate_kinds(void)
{
    return Py_BuildValue("(iiiii)", K_ITER, K_LINK, K_LINK_BWD, K_GC, K_PHASE0);
}

/* -- the launching calls, kept in C across buffers ----------------------------------------
 *
 * The newest `max_api` API calls (the attribution's ApiCalls table) sorted by correlation
 * id: appended as each buffer comes (in order already: no sort), sorted stably only when a
 * buffer's ids interleave with those kept, the oldest ids cut off past the bound; each
 * operation's call found by a search started where the previous one was.  Columns as
 * ApiCalls': domain, start, end (agent ns: mapped on the way in), correlation, cbid, thread.
 */
/* State kept in C across calls, owned by a capsule (its name the state's kind): each state
 * begins with this header, whose blocks are freed with it. */
enum { OWNED_BLOCKS = 8 };
typedef struct {
    void *blocks[OWNED_BLOCKS];
} owned;

static void owned_free(PyObject *capsule)
{
    owned *o = PyCapsule_GetPointer(capsule, PyCapsule_GetName(capsule));
    if (o == NULL)
        return;
    for (int b = 0; b < OWNED_BLOCKS; b++)
        PyMem_Free(o->blocks[b]);
    PyMem_Free(o);
}

/* A new zeroed state of `size` bytes in a capsule named `name` (*state set), or NULL. */
static PyObject *owned_new(size_t size, const char *name, void **state)
{
    void *p = PyMem_Calloc(1, size);
    if (p == NULL)
        return PyErr_NoMemory();
    PyObject *capsule = PyCapsule_New(p, name, owned_free);
    if (capsule == NULL)
        PyMem_Free(p);
    *state = p;
    return capsule;
}

/* The argument as a bound (at least `least`); -1 with the error set. */
static Py_ssize_t bound_arg(PyObject *arg, Py_ssize_t least)
{
    Py_ssize_t max = PyLong_AsSsize_t(arg);
    if (max == -1 && PyErr_Occurred())
        return -1;
    return max < least ? least : max;
}

enum { A_DOMAIN, A_START, A_END, A_CORR, A_CBID, A_THREAD, A_N };

typedef struct {
    owned own; /* the columns' blocks */
    int64_t *col[A_N];
    Py_ssize_t lo, n, cap, max; /* rows lo .. lo + n - 1 */
} api_store;

#define STORE_NAME "chainer_autoprof._cupti.api_store"

PyObject *cupti_api_store(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_ssize_t max = bound_arg(arg, 1);
    void *state = NULL;
    PyObject *capsule = max < 0 ? NULL : owned_new(sizeof(api_store), STORE_NAME, &state);
    if (capsule != NULL)
        ((api_store *)state)->max = max;
    return capsule;
}

/* The clock map (analysis.gpu_clock.ClockMap.to_agent): perf0 + rint((c - cupti0) * slope
 * + offset), as NumPy computes it. */
typedef struct {
    int64_t cupti0, perf0;
    double slope, offset;
} clock_map;

/* x rounded to an integer, halves to even (NumPy's rint in the default rounding mode): below
 * 2**52 in magnitude the addition of 2**52 rounds it so; above, a double is whole. */
static inline double rint_even(double x)
{
    const double big = 4503599627370496.0; /* 2**52 */
    if (x >= 0 && x < big)
        return (x + big) - big;
    if (x < 0 && x > -big)
        return (x - big) + big;
    return x;
}

/* x rounded to an integer as rint_even does, in one instruction where there is one: SSE2's
 * conversion rounds as the MXCSR says (to nearest, halves to even: the mode NumPy's rint
 * runs in too), about a third of the instructions of the additions and tests above; four
 * times per operation (its start and end, its call's). */
static inline __attribute__((always_inline)) int64_t rounded(double x)
{
#if defined(__SSE2__) && defined(__x86_64__)
    return _mm_cvtsd_si64(_mm_set_sd(x));
#else
    return (int64_t)rint_even(x);
#endif
}

static inline __attribute__((always_inline)) int64_t to_agent(const clock_map *m, int64_t c)
{
    double delta = (double)(int64_t)((uint64_t)c - (uint64_t)m->cupti0);
    double x = delta * m->slope;
    return m->perf0 + rounded(x + m->offset);
}

/* The map from a tuple (cupti0, perf0, slope, offset), or from the attributes of those names
 * (analysis.gpu_clock.ClockMap itself: no tuple made in Python at each buffer); 0, or -1
 * with the error set. */
static int parse_clock(PyObject *obj, clock_map *m)
{
    /* the last map read, by identity: a buffer's calls and operations are mapped with the
     * same one (a frozen ClockMap: its values cannot change), read once (the GIL held) */
    static PyObject *last;
    static clock_map last_map;
    if (obj == last) {
        *m = last_map;
        return 0;
    }
    long long c0, p0;
    if (PyTuple_Check(obj)) {
        if (!PyArg_ParseTuple(obj, "LLdd", &c0, &p0, &m->slope, &m->offset))
            return -1;
    } else {
        static const char *const names[4] = {"cupti0", "perf0", "slope", "offset"};
        static PyObject *interned[4]; /* made once (the GIL held): no str made per map */
        PyObject *v[4] = {NULL, NULL, NULL, NULL};
        int ok = 1;
        for (int k = 0; ok && k < 4; k++) {
            if (interned[k] == NULL && (interned[k] = PyUnicode_InternFromString(names[k])) == NULL)
                return -1;
            ok = (v[k] = PyObject_GetAttr(obj, interned[k])) != NULL;
        }
        if (ok) {
            c0 = PyLong_AsLongLong(v[0]);
            p0 = PyLong_AsLongLong(v[1]);
            m->slope = PyFloat_AsDouble(v[2]);
            m->offset = PyFloat_AsDouble(v[3]);
            ok = !PyErr_Occurred();
        }
        for (int k = 0; k < 4; k++)
            Py_XDECREF(v[k]);
        if (!ok)
            return -1;
    }
    m->cupti0 = c0;
    m->perf0 = p0;
    Py_XSETREF(last, Py_NewRef(obj)); /* held: its id cannot be another object's */
    last_map = *m;
    return 0;
}

/* n int64s copied, two per load and store (a loop, not memcpy: glibc copies a column of a
 * buffer's calls, kilobytes, with a string instruction that counts one per byte; and GCC's
 * -O2 leaves the plain loop at a load and a store per row). */
typedef uint64_t pair64 __attribute__((vector_size(2 * sizeof(uint64_t))));

static void copy_int64s(int64_t *restrict to, const int64_t *restrict from, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4) {
        pair64 a, b;
        memcpy(&a, from + i, sizeof a); /* unaligned */
        memcpy(&b, from + i + 2, sizeof b);
        memcpy(to + i, &a, sizeof a);
        memcpy(to + i + 2, &b, sizeof b);
    }
    for (; i < n; i++)
        to[i] = from[i];
}

/* Room for `more` rows after the kept ones (the kept moved to the front, or grown). */
static int store_room(api_store *st, Py_ssize_t more)
{
    if (st->lo + st->n + more <= st->cap)
        return 0;
    if (st->lo > 0) {
        for (int c = 0; c < A_N; c++)
            memmove(st->col[c], st->col[c] + st->lo, (size_t)st->n * sizeof(int64_t));
        st->lo = 0;
    }
    if (st->n + more <= st->cap)
        return 0;
    Py_ssize_t cap = st->cap ? st->cap : 1024;
    while (cap < st->n + more)
        cap *= 2;
    for (int c = 0; c < A_N; c++) {
        int64_t *grown = PyMem_Realloc(st->col[c], (size_t)cap * sizeof(int64_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        st->col[c] = st->own.blocks[c] = grown;
    }
    st->cap = cap;
    return 0;
}

static const int64_t *sort_keys;

static int by_key_then_row(const void *a, const void *b)
{
    Py_ssize_t i = *(const Py_ssize_t *)a, j = *(const Py_ssize_t *)b;
    if (sort_keys[i] != sort_keys[j])
        return sort_keys[i] < sort_keys[j] ? -1 : 1;
    return i < j ? -1 : (i > j);
}

/* The kept rows sorted stably by correlation id (a buffer's ids interleave with theirs). */
static int store_sort(api_store *st)
{
    Py_ssize_t n = st->n;
    Py_ssize_t *order = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Py_ssize_t));
    int64_t *tmp = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (order == NULL || tmp == NULL) {
        PyMem_Free(order);
        PyMem_Free(tmp);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        order[i] = i;
    sort_keys = st->col[A_CORR] + st->lo; /* under the GIL: one sort at a time */
    qsort(order, (size_t)n, sizeof(Py_ssize_t), by_key_then_row);
    for (int c = 0; c < A_N; c++) {
        int64_t *col = st->col[c] + st->lo;
        for (Py_ssize_t i = 0; i < n; i++)
            tmp[i] = col[order[i]];
        memcpy(col, tmp, (size_t)n * sizeof(int64_t));
    }
    PyMem_Free(order);
    PyMem_Free(tmp);
    return 0;
}

/* The store and two more arguments of a call (store, a, b); NULL with the error set. */
static api_store *store_args(PyObject *args, PyObject **a, PyObject **b)
{
    PyObject *capsule;
    if (!PyArg_ParseTuple(args, "OOO", &capsule, a, b))
        return NULL;
    return PyCapsule_GetPointer(capsule, STORE_NAME);
}

/* A buffer's calls (the reader's table of them, or the columns (domain, start, end,
 * correlation, cbid, thread); CUPTI ns, mapped here with m) kept in st; 0, or -1 with the
 * error set. */
static int store_add(api_store *st, PyObject *cols_obj, const clock_map *m)
{
    held h = {NULL, 0, 0};
    int rc = -1;
    int64_t *in[A_N];
    /* the reader's table of calls (its rows: no column made in Python), or the columns */
    Py_ssize_t k = cupti_table_rows(cols_obj, A_N, (const int64_t **)in);
    if ((k < 0 && columns_held(&h, A_N, cols_obj, A_N, &k, 0, in) < 0) || store_room(st, k) < 0)
        goto done;
    Py_ssize_t at = st->lo + st->n;
    int sorted = 1;
    int64_t last = st->n ? st->col[A_CORR][at - 1] : INT64_MIN;
    for (int c = 0; c < A_N; c++)
        if (c != A_START && c != A_END) /* those two mapped on the way in, below */
            copy_int64s(st->col[c] + at, in[c], k);
    int64_t *const start = st->col[A_START] + at, *const end = st->col[A_END] + at;
    const int64_t *const from_start = in[A_START], *const from_end = in[A_END],
                  *const corr = in[A_CORR];
    for (Py_ssize_t i = 0; i < k; i++) {
        start[i] = to_agent(m, from_start[i]);
        end[i] = to_agent(m, from_end[i]);
        sorted &= corr[i] >= last;
        last = corr[i];
    }
    st->n += k;
    if (!sorted && store_sort(st) < 0)
        goto done;
    if (st->n > st->max) {
        st->lo += st->n - st->max;
        st->n = st->max;
    }
    rc = 0;
done:
    release_all(&h);
    return rc;
}

/* api_add(store, (domain, start, end, correlation, cbid, thread), clock): a buffer's calls
 * (CUPTI ns, mapped here) kept. */
PyObject *cupti_api_add(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cols_obj, *clock_obj;
    api_store *st = store_args(args, &cols_obj, &clock_obj);
    clock_map m;
    if (st == NULL || parse_clock(clock_obj, &m) < 0 || store_add(st, cols_obj, &m) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* The first kept row with correlation id `x` (-1: none); the search starts at `hint`. */
static Py_ssize_t find_call(const int64_t *a, Py_ssize_t m, int64_t x, Py_ssize_t *hint)
{
    Py_ssize_t k = last_at_or_before(a, m, x, *hint);
    if (k < 0 || a[k] != x)
        return -1;
    while (k > 0 && a[k - 1] == x)
        k--;
    *hint = k;
    return k;
}

enum { J_START, J_END, J_DOMAIN, J_CBID, J_THREAD, J_FOUND, J_N };

typedef struct {
    long long missing, latest, thread;
    int one;
} join_result;

/* Each of n operations' launching call (see api_join) into out's J_N columns; `whole` 0:
 * all but found and thread, which the usual buffer's settling writes over (its status and
 * the agent's thread) and any other buffer's join does not read (it joins again): two stores
 * a row fewer.  Inlined at both calls: `whole` a constant there, no test a row. */
static inline __attribute__((always_inline)) void
join_rows(const api_store *st, const int64_t *corr, Py_ssize_t n, int64_t *const *out,
          join_result *r, const int whole)
{
    /* the columns in locals: a store to an output cannot move them (no reload per row) */
    const int64_t *const a_corr = st->col[A_CORR] + st->lo, *const a_start = st->col[A_START] +
        st->lo, *const a_end = st->col[A_END] + st->lo, *const a_domain = st->col[A_DOMAIN] +
        st->lo, *const a_cbid = st->col[A_CBID] + st->lo, *const a_thread = st->col[A_THREAD] +
        st->lo;
    int64_t *const o_start = out[J_START], *const o_end = out[J_END],
            *const o_domain = out[J_DOMAIN], *const o_cbid = out[J_CBID],
            *const o_thread = out[J_THREAD], *const o_found = out[J_FOUND];
    const Py_ssize_t m = st->n;
    long long missing = 0, latest = INT64_MIN, thread = -1;
    int one = 1, first = 1;
    Py_ssize_t hint = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t x = corr[i];
        Py_ssize_t k;
        /* the usual first: the operations come in the order of their calls, each call kept
         * once, so the call is the previous one's (a call that launched several) or the
         * next row; either is the first row of its id (the rows are sorted) */
        if (hint >= 0 && a_corr[hint] == x)
            k = hint;
        else if (hint + 1 < m && a_corr[hint + 1] == x)
            k = ++hint;
        else
            k = m ? find_call(a_corr, m, x, &hint) : -1;
        if (whole)
            o_found[i] = k >= 0;
        if (k < 0) {
            missing++;
            continue;
        }
        const int64_t start = a_start[k], tid = a_thread[k];
        o_start[i] = start;
        o_end[i] = a_end[k];
        o_domain[i] = a_domain[k];
        o_cbid[i] = a_cbid[k];
        if (whole)
            o_thread[i] = tid;
        if (first) {
            thread = tid;
            first = 0;
        }
        one &= tid == thread;
        if (start > latest)
            latest = start;
    }
    *r = (join_result){missing, latest, thread, one};
}


/* api_join(store, correlation, out): each operation's launching call (out: api_start,
 * api_end, api_domain, cbid, thread, found; written where found) ->
 * (missing, thread of the first found, 1 when every found one has that thread, the
 * latest start found). */
PyObject *cupti_api_join(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *corr_obj, *out_obj;
    api_store *st = store_args(args, &corr_obj, &out_obj);
    if (st == NULL)
        return NULL;
    held h = {NULL, 0, 0};
    PyObject *result = NULL;
    Py_ssize_t n = -1;
    int64_t *out[J_N];
    if (columns_held(&h, 1 + J_N, out_obj, J_N, &n, 1, out) < 0)
        goto done;
    const int64_t *corr = int64s(&h, corr_obj, &n, 0);
    if (corr == NULL)
        goto done;
    join_result r;
    join_rows(st, corr, n, out, &r, 1);
    result = Py_BuildValue("(LLiL)", r.missing, r.thread, r.one, r.latest);
done:
    release_all(&h);
    return result;
}

/* join_block(store, clock, (correlation, start, end), block[, calls]) -> as api_join: the
 * usual buffer's operations mapped onto the agent's clock (the block's rows start and end, as
 * to_agent) and joined to their calls (rows api_start .. cbid; tid and status left to the
 * settling: see join_rows), one call; its calls (as api_add's; None or left out: none) kept
 * first, so that one call does both. */
PyObject *cupti_join_block(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *capsule, *clock_obj, *cols_obj, *block_obj, *calls_obj = Py_None;
    if (!PyArg_ParseTuple(args, "OOOO|O", &capsule, &clock_obj, &cols_obj, &block_obj,
                          &calls_obj))
        return NULL;
    api_store *st = PyCapsule_GetPointer(capsule, STORE_NAME);
    clock_map m;
    if (st == NULL || parse_clock(clock_obj, &m) < 0 ||
        (calls_obj != Py_None && store_add(st, calls_obj, &m) < 0))
        return NULL;
    held h = {NULL, 0, 0};
    PyObject *result = NULL;
    const int64_t *in[3]; /* correlation, start, end (CUPTI ns) */
    int64_t *row[B_N];
    const int64_t *op_rows[TABLE_OP_ROWS];
    Py_ssize_t n = cupti_table_rows(cols_obj, TABLE_OP_ROWS, op_rows);
    if (n >= 0) { /* the reader's table of operations: its rows */
        in[0] = op_rows[TABLE_OP_CORR];
        in[1] = op_rows[TABLE_OP_START];
        in[2] = op_rows[TABLE_OP_END];
        if ((h.views = PyMem_Calloc(1, sizeof(Py_buffer))) == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        h.cap = 1;
    } else if (columns_held(&h, 4, cols_obj, 3, &n, 0, (int64_t **)in) < 0) {
        goto done;
    }
    if (block_rows(&h, block_obj, row) != n) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "join_block: a block of the operations' length");
        goto done;
    }
    int64_t *const start = row[B_START], *const end = row[B_END];
    const int64_t *const from_start = in[1], *const from_end = in[2];
    for (Py_ssize_t i = 0; i < n; i++) {
        start[i] = to_agent(&m, from_start[i]);
        end[i] = to_agent(&m, from_end[i]);
    }
    int64_t *const out[J_N] = {row[B_API_START], row[B_API_END], row[B_API_DOMAIN], row[B_CBID],
                               NULL, NULL};
    join_result r;
    join_rows(st, in[0], n, out, &r, 0);
    result = Py_BuildValue("(LLiL)", r.missing, r.thread, r.one, r.latest);
done:
    release_all(&h);
    return result;
}

/* to_agent(clock, src, dst): CUPTI ns -> agent ns (ClockMap.to_agent's twin). */
PyObject *cupti_to_agent(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *clock_obj, *src_obj, *dst_obj;
    clock_map m;
    if (!PyArg_ParseTuple(args, "OOO", &clock_obj, &src_obj, &dst_obj) ||
        parse_clock(clock_obj, &m) < 0)
        return NULL;
    held h = {PyMem_Calloc(2, sizeof(Py_buffer)), 0, 2};
    if (h.views == NULL)
        return PyErr_NoMemory();
    Py_ssize_t n = -1;
    const int64_t *src = int64s(&h, src_obj, &n, 0);
    int64_t *dst = src ? int64s(&h, dst_obj, &n, 1) : NULL;
    if (dst != NULL)
        for (Py_ssize_t i = 0; i < n; i++)
            dst[i] = to_agent(&m, src[i]);
    release_all(&h);
    if (dst == NULL)
        return NULL;
    Py_RETURN_NONE;
}

/* -- the counted kernels' sums per (name, link, direction) (GpuFigureBuilder._add_kernels) -
 *
 * A table kept across buffers: at most `max` keys (name << 32 | (link + 1) << 1 | backward),
 * each a row in the order first seen (a buffer's new keys in ascending order), their ns and
 * kernels; the kernels of keys beyond it summed as "other".  Read once, at figure time. */

/* A key's sums; `aux`: in the table, the buffer that added the row (rows are read in the
 * order (buffer, key), the NumPy twin's); in a buffer's sums, the key's slot (cleared after). */
typedef struct {
    int64_t key, ns, calls, aux;
} kernel_sum;

typedef struct {
    owned own; /* rows and slots */
    kernel_sum *rows;
    int32_t *slots; /* row + 1; 0: free */
    size_t cap;     /* slots: a power of two, at least twice max */
    Py_ssize_t n, max;
    int64_t other_ns, other_calls;
    kernel_sum *buf_sums; /* a buffer's sums and their slots, kept for the next buffer */
    int32_t *buf_slots;   /* all free between buffers (each buffer clears those it took) */
    size_t buf_rows, buf_cap;
    int64_t buffers;      /* the buffers summed so far */
    int unordered;        /* rows added out of key order within a buffer */
} kernel_table;

#define KERNELS_NAME "chainer_autoprof._cupti.kernel_table"

static size_t slot_of(uint64_t key, size_t cap)
{
    uint64_t h = key * 0x9E3779B97F4A7C15ull; /* the high half folded in: the name's bits */
    return (size_t)(h ^ (h >> 32)) & (cap - 1);
}

/* Operations a buffer's sums have room for from the table's making (once a run, not at the
 * first buffer: a few thousand, a live buffer's usual count); more grow them. */
#define KERNEL_BUFFER_ROWS 4096

/* The kernels' per-buffer sums: room for n keys and their slots (kept for the next buffer:
 * no allocation each; the slots all free, cleared one by one by the buffer that took them:
 * no pass over them all); 0, or -1 with the error set. */
static int kernel_buffer(kernel_table *kt, Py_ssize_t n, size_t *cap_out)
{
    size_t cap = 16;
    while (cap < 2 * (size_t)n)
        cap *= 2;
    if (kt->buf_rows < (size_t)n || kt->buf_cap < cap) {
        kernel_sum *grown_sums = PyMem_Realloc(kt->buf_sums, (size_t)(n ? n : 1)
                                               * sizeof(kernel_sum));
        if (grown_sums != NULL)
            kt->buf_sums = kt->own.blocks[2] = grown_sums;
        PyMem_Free(kt->buf_slots); /* free slots: zeros (a new block, not realloc's copy) */
        kt->buf_slots = kt->own.blocks[3] = PyMem_Calloc(cap, sizeof(int32_t));
        if (grown_sums == NULL || kt->buf_slots == NULL) {
            kt->buf_rows = kt->buf_cap = 0;
            PyErr_NoMemory();
            return -1;
        }
        kt->buf_rows = (size_t)(n ? n : 1);
        kt->buf_cap = cap;
    }
    *cap_out = cap;
    return 0;
}

/* kernel_table(max_keys) -> the table (a capsule). */
static PyObject *cupti_kernel_table(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_ssize_t max = bound_arg(arg, 0);
    void *state = NULL;
    PyObject *capsule = max < 0 ? NULL : owned_new(sizeof(kernel_table), KERNELS_NAME, &state);
    if (capsule == NULL)
        return NULL;
    kernel_table *kt = state;
    kt->max = max;
    kt->cap = 16;
    while (kt->cap < 2 * (size_t)kt->max)
        kt->cap *= 2;
    kt->rows = kt->own.blocks[0] = PyMem_Calloc((size_t)(max ? max : 1), sizeof(kernel_sum));
    kt->slots = kt->own.blocks[1] = PyMem_Calloc(kt->cap, sizeof(int32_t));
    if (kt->rows == NULL || kt->slots == NULL) {
        Py_DECREF(capsule);
        return PyErr_NoMemory();
    }
    size_t cap;
    if (kernel_buffer(kt, KERNEL_BUFFER_ROWS, &cap) < 0) {
        Py_DECREF(capsule);
        return NULL;
    }
    return capsule;
}

static int by_kernel_key(const void *a, const void *b)
{
    int64_t x = ((const kernel_sum *)a)->key, y = ((const kernel_sum *)b)->key;
    return (x > y) - (x < y);
}

/* The rows' order as the NumPy twin makes it: by the buffer that added each, then by key. */
static int by_buffer_then_key(const void *a, const void *b)
{
    const kernel_sum *x = a, *y = b;
    if (x->aux != y->aux)
        return x->aux < y->aux ? -1 : 1;
    return (x->key > y->key) - (x->key < y->key);
}

/* The table's slot of `key`: its row's, or the free one where it would go. */
static size_t kernel_slot(const kernel_table *kt, int64_t key)
{
    size_t at = slot_of((uint64_t)key, kt->cap);
    while (kt->slots[at] && kt->rows[kt->slots[at] - 1].key != key)
        at = (at + 1) & (kt->cap - 1);
    return at;
}

/* One buffer's sum of a key into the table (a new row while there is room, else "other"). */
static void kernels_add(kernel_table *kt, const kernel_sum *s)
{
    size_t at = kernel_slot(kt, s->key);
    if (!kt->slots[at]) {
        if (kt->n >= kt->max) {
            kt->other_ns += s->ns;
            kt->other_calls += s->calls;
            return;
        }
        kt->rows[kt->n] = (kernel_sum){s->key, 0, 0, kt->buffers};
        kt->slots[at] = (int32_t)++kt->n;
    }
    kt->rows[kt->slots[at] - 1].ns += s->ns;
    kt->rows[kt->slots[at] - 1].calls += s->calls;
}

/* A buffer's m sums into the table, its slots freed for the next buffer.  The keys known
 * are summed in place; the new ones get rows in any order, read back in key order
 * (kernel_rows), unless some would find the table full: then which get a row depends on
 * the order, and they are sorted first (the NumPy twin adds them in key order). */
static void kernels_add_buffer(kernel_table *kt, kernel_sum *sums, Py_ssize_t m,
                               int32_t *buf_slots)
{
    Py_ssize_t fresh = 0;
    for (Py_ssize_t i = 0; i < m; i++) {
        buf_slots[sums[i].aux] = 0;
        size_t at = kernel_slot(kt, sums[i].key);
        if (kt->slots[at]) {
            kt->rows[kt->slots[at] - 1].ns += sums[i].ns;
            kt->rows[kt->slots[at] - 1].calls += sums[i].calls;
        } else {
            sums[fresh++] = sums[i]; /* (fresh <= i: not yet read) */
        }
    }
    if (fresh > 1 && kt->n + fresh > kt->max)
        qsort(sums, (size_t)fresh, sizeof(kernel_sum), by_kernel_key);
    else if (fresh > 1)
        kt->unordered = 1;
    for (Py_ssize_t i = 0; i < fresh; i++)
        kernels_add(kt, &sums[i]);
    kt->buffers++;
}

/* -- a block's figures: the per-link and per-phase sums, the counted kernels' sums and the
 * GPU timeline's rows (GpuFigureBuilder.add), in one pass over its operations ----------- */
/* The operations' columns, then their attribution's (two sequences: each read in one C call
 * in Python, operator.attrgetter's). */
enum { F_KIND, F_START, F_END, F_NAME, F_DEVICE, F_OPS_N = F_DEVICE + 1, F_COUNTED = F_OPS_N,
       F_ITERATION, F_LINK, F_BACKWARD, F_PHASE, F_LAUNCH, F_ITER_END, F_TID, F_N };

/* figure_add(kernel_table, (kind, start, end, name, device), (counted, iteration, link,
 * backward, phase, launch, iter_end, tid), link_sums, phase_sums, op_kinds, phase_outside,
 * loop_tid, rows) -> (kernels, copies, memsets, kernel ns outside any iteration, kernel ns in
 * the warm-up's iterations, loop_tid, device, earliest): the operations' columns and their
 * attribution's (F_*; or, for the attribution's, the usual buffer's block: its rows; and
 * then, for the operations', possibly the reader's table of them, their times the block's).
 *   sums: the block's kernels and copies added to link_sums (int64[links][5]: forward ns,
 *     forward kernels, backward ns, backward kernels, copy ns; counted operations in a
 *     link) and phase_sums (int64[phases][3]: kernel ns, kernels, copy ns; counted, in a
 *     phase); the operations of each of the three op_kinds (kernel, memcpy, memset);
 *   kernels: the counted kernels summed per key (name << 32 | (link + 1) << 1 | backward),
 *     then into the table in ascending key order (GpuFigureBuilder._add_kernels);
 *   timeline: each operation's row (start, end, kernel?, launch, its iteration when the loop
 *     thread launched it else -1, iteration's end, launched by the loop thread?) into rows
 *     (int64[n][7]); loop_tid None: the thread of the first operation in an iteration (None
 *     while there is none); the device of every operation (None: several) and the earliest
 *     start (None: no operation).
 * One pass, not three: each operation's columns are read once (its kind, times and whether
 * it counts serve all three) and one call's arrays are taken, not three calls'. */
static PyObject *cupti_figure_add(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *capsule, *ops_obj, *attr_obj, *links_obj, *phases_obj, *loop_obj, *rows_obj;
    long long kernel, memcpy_, memset_, phase_outside;
    if (!PyArg_ParseTuple(args, "OOOOO(LLL)LOO", &capsule, &ops_obj, &attr_obj, &links_obj,
                          &phases_obj, &kernel, &memcpy_, &memset_, &phase_outside, &loop_obj,
                          &rows_obj))
        return NULL;
    kernel_table *kt = PyCapsule_GetPointer(capsule, KERNELS_NAME);
    if (kt == NULL)
        return NULL;
    held h = {NULL, 0, 0};
    PyObject *result = NULL;
    int64_t *c[F_N];
    Py_ssize_t n = -1, n_link_cells = -1, n_phase_cells = -1, cells = -1;
    const int64_t *op_rows[TABLE_OP_ROWS];
    const Py_ssize_t in_table = cupti_table_rows(ops_obj, TABLE_OP_ROWS, op_rows);
    if (in_table >= 0) { /* the reader's table of operations: its rows (start, end: below) */
        n = in_table;
        c[F_KIND] = (int64_t *)op_rows[TABLE_OP_KIND];
        c[F_NAME] = (int64_t *)op_rows[TABLE_OP_NAME];
        c[F_DEVICE] = (int64_t *)op_rows[TABLE_OP_DEVICE];
        if ((h.views = PyMem_Calloc(F_N + 3, sizeof(Py_buffer))) == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        h.cap = F_N + 3;
    } else if (columns_held(&h, F_N + 3, ops_obj, F_OPS_N, &n, 0, c) < 0) {
        goto done;
    }
    if (PyTuple_Check(attr_obj)) {
        if (in_table >= 0) { /* its start and end are CUPTI's: the block has the agent's */
            PyErr_SetString(PyExc_ValueError, "figure_add: a table of operations takes its block");
            goto done;
        }
        if (int64_columns(&h, attr_obj, F_N - F_OPS_N, &n, 0, c + F_OPS_N) < 0)
            goto done;
    } else { /* the usual buffer's block (LaunchAttributor's): its rows, one buffer taken */
        int64_t *row[B_N];
        if (block_rows(&h, attr_obj, row) != n) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "figure_add: a block of the operations' length");
            goto done;
        }
        if (in_table >= 0) { /* mapped onto the agent's clock (join_block) */
            c[F_START] = row[B_START];
            c[F_END] = row[B_END];
        }
        c[F_COUNTED] = row[B_COUNTED];
        c[F_ITERATION] = row[B_ITERATION];
        c[F_LINK] = row[B_LINK];
        c[F_BACKWARD] = row[B_BACKWARD];
        c[F_PHASE] = row[B_PHASE];
        c[F_LAUNCH] = row[B_API_START];
        c[F_ITER_END] = row[B_ITER_END];
        c[F_TID] = row[B_TID];
    }
    int64_t *links = int64s(&h, links_obj, &n_link_cells, 1);
    int64_t *phases = links ? int64s(&h, phases_obj, &n_phase_cells, 1) : NULL;
    int64_t *rows = phases ? int64s(&h, rows_obj, &cells, 1) : NULL;
    if (rows == NULL)
        goto done;
    if (cells != 7 * n) {
        PyErr_SetString(PyExc_ValueError, "figure_add: rows of 7 per operation");
        goto done;
    }
    if (kernel != 0 || memcpy_ != 1 || memset_ != 2) { /* GpuOps' KERNEL, MEMCPY, MEMSET */
        PyErr_SetString(PyExc_ValueError, "figure_add: op_kinds (0, 1, 2) expected");
        goto done;
    }
    int known = loop_obj != Py_None;
    int64_t loop_tid = 0;
    if (known) {
        loop_tid = PyLong_AsLongLong(loop_obj);
        if (loop_tid == -1 && PyErr_Occurred())
            goto done;
    }
    for (Py_ssize_t i = 0; !known && i < n; i++) {
        if (c[F_ITERATION][i] >= 0) {
            loop_tid = c[F_TID][i];
            known = 1;
        }
    }
    size_t cap;
    if (kernel_buffer(kt, n, &cap) < 0)
        goto done;
    kernel_sum *const sums = kt->buf_sums;
    int32_t *const slots = kt->buf_slots;
    /* the columns in locals: a store to a sum or a row cannot move them (no reload per row) */
    const int64_t *const kind_c = c[F_KIND], *const start_c = c[F_START], *const end_c = c[F_END],
                  *const counted_c = c[F_COUNTED], *const iteration_c = c[F_ITERATION],
                  *const link_c = c[F_LINK], *const backward_c = c[F_BACKWARD],
                  *const phase_c = c[F_PHASE], *const name_c = c[F_NAME],
                  *const launch_c = c[F_LAUNCH], *const iter_end_c = c[F_ITER_END],
                  *const tid_c = c[F_TID], *const device_c = c[F_DEVICE];
    const Py_ssize_t n_links = n_link_cells / 5, n_phases = n_phase_cells / 3;
    const int64_t device = n ? device_c[0] : 0;
    long long counts[3] = {0, 0, 0}, outside = 0, warmup = 0;
    int64_t earliest = n ? start_c[0] : 0;
    uint64_t other_device = 0; /* its bits set by a device other than the first */
    /* the loop thread's id, or none (INT64_MIN: a thread id is an agent's or CUPTI's, never
     * negative but for -1, unknown): one comparison a row, no flag kept at hand */
    const int64_t loop_match = known ? loop_tid : INT64_MIN;
    Py_ssize_t m = 0; /* the buffer's kernel keys */
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t kind = kind_c[i], start = start_c[i], end = end_c[i], dur = end - start;
        const int64_t iteration = iteration_c[i];
        const int is_kernel = kind == kernel;
        const int is_copy = (uint64_t)kind - 1 < 2; /* memcpy_ or memset_ (1, 2) */
        const int counted = counted_c[i] == 1, in_iter = iteration >= 0;
        const int loop = tid_c[i] == loop_match;
        /* the timeline's row */
        int64_t *row = rows + 7 * i;
        row[0] = start;
        row[1] = end;
        row[2] = is_kernel;
        row[3] = launch_c[i];
        row[4] = loop ? iteration : -1;
        row[5] = iter_end_c[i];
        row[6] = loop;
        other_device |= (uint64_t)(device_c[i] ^ device);
        if (start < earliest)
            earliest = start;
        /* the sums */
        if ((uint64_t)kind < 3) /* by index: op_kinds are 0, 1, 2 (checked above) */
            counts[kind]++;
        if (is_kernel && !in_iter)
            outside += dur;
        if (is_kernel && in_iter && !counted)
            warmup += dur;
        if (!counted || !(is_kernel || is_copy))
            continue;
        const int64_t link = link_c[i], phase = phase_c[i];
        const int back = backward_c[i] == 1;
        if (link >= 0 && link < n_links) {
            int64_t *sum = links + 5 * link;
            if (is_copy) {
                sum[4] += dur;
            } else {
                sum[2 * back] += dur;
                sum[2 * back + 1] += 1;
            }
        }
        if (phase != phase_outside && phase >= 0 && phase < n_phases) {
            int64_t *sum = phases + 3 * phase;
            if (is_copy) {
                sum[2] += dur;
            } else {
                sum[0] += dur;
                sum[1] += 1;
            }
        }
        if (!is_kernel)
            continue;
        /* the counted kernel's key, summed for the buffer */
        const int64_t key = (int64_t)(((uint64_t)name_c[i] << 32) | ((uint64_t)(link + 1) << 1)
                                      | (uint64_t)back);
        size_t at = slot_of((uint64_t)key, cap);
        while (slots[at] && sums[slots[at] - 1].key != key)
            at = (at + 1) & (cap - 1);
        if (!slots[at]) {
            sums[m] = (kernel_sum){key, 0, 0, (int64_t)at};
            slots[at] = (int32_t)++m;
        }
        sums[slots[at] - 1].ns += dur;
        sums[slots[at] - 1].calls++;
    }
    kernels_add_buffer(kt, sums, m, slots);
    PyObject *parts[3] = {known ? PyLong_FromLongLong(loop_tid) : Py_NewRef(Py_None),
                          n && !other_device ? PyLong_FromLongLong(device) : Py_NewRef(Py_None),
                          n ? PyLong_FromLongLong(earliest) : Py_NewRef(Py_None)};
    if (parts[0] != NULL && parts[1] != NULL && parts[2] != NULL)
        result = Py_BuildValue("(LLLLLOOO)", counts[0], counts[1], counts[2], outside, warmup,
                               parts[0], parts[1], parts[2]);
    for (int k = 0; k < 3; k++)
        Py_XDECREF(parts[k]);
done:
    release_all(&h);
    return result;
}

/* kernel_rows(table) -> ([key], [ns], [kernels], other ns, other kernels), rows in order. */
static PyObject *cupti_kernel_rows(PyObject *self, PyObject *capsule)
{
    (void)self;
    kernel_table *kt = PyCapsule_GetPointer(capsule, KERNELS_NAME);
    if (kt == NULL)
        return NULL;
    const kernel_sum *rows = kt->rows;
    kernel_sum *ordered = NULL;
    if (kt->unordered) { /* a copy in (buffer, key) order: the table's slots point at rows */
        ordered = PyMem_Malloc((size_t)(kt->n ? kt->n : 1) * sizeof(kernel_sum));
        if (ordered == NULL)
            return PyErr_NoMemory();
        memcpy(ordered, kt->rows, (size_t)kt->n * sizeof(kernel_sum));
        qsort(ordered, (size_t)kt->n, sizeof(kernel_sum), by_buffer_then_key);
        rows = ordered;
    }
    PyObject *lists[3] = {PyList_New(kt->n), PyList_New(kt->n), PyList_New(kt->n)};
    PyObject *result = NULL;
    if (lists[0] != NULL && lists[1] != NULL && lists[2] != NULL) {
        int ok = 1;
        for (Py_ssize_t i = 0; ok && i < kt->n; i++) {
            const int64_t v[3] = {rows[i].key, rows[i].ns, rows[i].calls};
            for (int c = 0; ok && c < 3; c++) {
                PyObject *x = PyLong_FromLongLong(v[c]);
                ok = x != NULL;
                if (ok)
                    PyList_SET_ITEM(lists[c], i, x);
            }
        }
        if (ok)
            result = Py_BuildValue("(OOOLL)", lists[0], lists[1], lists[2],
                                   (long long)kt->other_ns, (long long)kt->other_calls);
    }
    for (int c = 0; c < 3; c++)
        Py_XDECREF(lists[c]);
    PyMem_Free(ordered);
    return result;
}

/* -- the clock map's fit (analysis.gpu_clock.fit's twin) ---------------------------------- */

/* NumPy's sum of float64 (pairwise: eight lanes up to 128 values, halves above), so that the
 * fit here equals NumPy's to the last bit. */
static double pairwise_sum(const double *a, Py_ssize_t n)
{
    if (n < 8) {
        double res = 0.;
        for (Py_ssize_t i = 0; i < n; i++)
            res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8];
        Py_ssize_t i;
        for (int j = 0; j < 8; j++)
            r[j] = a[j];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++)
                r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++)
            res += a[i];
        return res;
    }
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

typedef struct {
    int64_t cupti, perf, read;
} clock_pair;

/* clock_fit(pairs) -> (cupti0, perf0, slope, offset, residual_ns, read_ns, first_ns,
 * last_ns, pairs): ClockMap's fields fitted through the rows (cupti_ns, perf_ns[, read_ns])
 * as analysis.gpu_clock.fit does (ValueError without a pair). */
static PyObject *cupti_clock_fit(PyObject *self, PyObject *rows)
{
    (void)self;
    PyObject *seq = PySequence_Fast(rows, "clock_fit: a sequence of pairs");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *result = NULL;
    clock_pair *pairs = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(clock_pair));
    double *x = PyMem_Malloc((size_t)(n ? n : 1) * 3 * sizeof(double));
    if (pairs == NULL || x == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "no clock pairs");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long c, p, r = -1;
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (PyTuple_CheckExact(item) && PyTuple_GET_SIZE(item) == 3) {
            /* the collector's own pairs (read at every buffer: all of them each time) */
            c = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 0));
            p = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 1));
            r = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 2));
            if (PyErr_Occurred())
                goto done;
        } else if (!PyArg_ParseTuple(item, "LL|L", &c, &p, &r)) {
            goto done;
        }
        clock_pair row = {c, p, r};
        Py_ssize_t k = i; /* stable insertion by CUPTI time (the pairs come in order) */
        while (k > 0 && pairs[k - 1].cupti > row.cupti) {
            pairs[k] = pairs[k - 1];
            k--;
        }
        pairs[k] = row;
    }
    double *y = x + n, *t = y + n;
    int64_t c0 = pairs[0].cupti, p0 = pairs[0].perf, reads = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        x[i] = (double)(int64_t)((uint64_t)pairs[i].cupti - (uint64_t)c0);
        y[i] = (double)(int64_t)((uint64_t)pairs[i].perf - (uint64_t)p0);
        if (pairs[i].read >= 0 && pairs[i].read > reads)
            reads = pairs[i].read;
    }
    double slope, offset;
    if (n == 1 || x[n - 1] - x[0] == 0.0) {
        for (Py_ssize_t i = 0; i < n; i++)
            t[i] = y[i] - x[i];
        slope = 1.0;
        offset = pairwise_sum(t, n) / (double)n;
    } else {
        double xm = pairwise_sum(x, n) / (double)n, ym = pairwise_sum(y, n) / (double)n;
        for (Py_ssize_t i = 0; i < n; i++)
            t[i] = (x[i] - xm) * (y[i] - ym);
        double sxy = pairwise_sum(t, n);
        for (Py_ssize_t i = 0; i < n; i++)
            t[i] = (x[i] - xm) * (x[i] - xm);
        slope = sxy / pairwise_sum(t, n);
        offset = ym - slope * xm;
    }
    double worst = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        double fitted = x[i] * slope;
        double off = fabs(rint_even(fitted + offset) - y[i]);
        if (i == 0 || off > worst || off != off)
            worst = off;
    }
    result = Py_BuildValue("(LLddLLLLn)", (long long)c0, (long long)p0, slope, offset,
                           (long long)worst, (long long)(reads >= 0 ? reads : 0),
                           (long long)pairs[0].cupti, (long long)pairs[n - 1].cupti, n);
done:
    PyMem_Free(pairs);
    PyMem_Free(x);
    Py_DECREF(seq);
    return result;
}

/* -- the trace keeper's groups (AttributedKeeper.add) ---------------------------------------
 *
 * keeper_runs((iteration, tid, counted)) -> (tid, firsts, counted row, first run, its row,
 * its ordinal, last run's row, last ordinal): the runs of equal iteration ordinals, firsts
 * the bytes of each run's first row (native int64); the first run in an iteration (after
 * those outside any: ordinal < 0), its first row and ordinal (none: the run count, n, -1);
 * the counted row the first row of the first run in an iteration whose first row is counted
 * (counted == 1; n: none); when every operation is of one thread, the ordinals never fall
 * and no warm-up run follows a counted one (the usual buffer: its groups' keys ascend); a
 * buffer of one thread whose operations outside any iteration come between its iterations
 * gets its groups as NumPy makes them (interleaved_groups); None otherwise (the keeper's
 * NumPy path groups them).  Without the counted column (the keeper under its limit: its
 * groups wait), the counted row is -1 and the runs' classes unread.  No operation: None.
 * Nothing per run is made a Python object: the keeper reads the runs' columns with NumPy
 * only when it needs them. */
enum { G_ITERATION, G_TID, G_COUNTED, G_N };

/* Two rows in one SSE2 or NEON register (GCC's and Clang's vector extension), four rows a
 * turn: the check below is some four instructions a row, not sixteen. */
typedef uint64_t rows2 __attribute__((vector_size(2 * sizeof(uint64_t))));

static inline rows2 load2(const int64_t *p)
{
    rows2 v;
    memcpy(&v, p, sizeof v); /* unaligned */
    return v;
}

/* Whether it[] never falls and every tid[i] is `thread`: differences and mismatches OR-ed
 * (no branch per row), a block of rows at a time, the answer given at the first block that
 * falls (a buffer out of order is grouped by NumPy: little spent here on it). */
static int one_thread_in_order(const int64_t *it, const int64_t *tid, int64_t thread,
                               Py_ssize_t n)
{
    enum { BLOCK = 512 };
    const rows2 none = {0, 0}, same = none + (uint64_t)thread;
    for (Py_ssize_t at = 0; at < n; at += BLOCK) {
        Py_ssize_t end = at + BLOCK < n ? at + BLOCK : n;
        Py_ssize_t last = end < n ? end : n - 1; /* the differences it[i + 1] - it[i] */
        rows2 falls2 = none, other2 = none;      /* falls: a negative one's sign bit */
        Py_ssize_t i = at;
        for (; i + 4 <= last; i += 4) { /* ordinals: no wrap */
            falls2 |= (load2(it + i + 1) - load2(it + i)) |
                      (load2(it + i + 3) - load2(it + i + 2));
            other2 |= (load2(tid + i) ^ same) | (load2(tid + i + 2) ^ same);
        }
        uint64_t falls = falls2[0] | falls2[1], other = other2[0] | other2[1];
        for (Py_ssize_t j = i; j < last; j++)
            falls |= (uint64_t)it[j + 1] - (uint64_t)it[j];
        for (; i < end; i++)
            other |= (uint64_t)(tid[i] ^ thread);
        if ((falls >> 63) || other)
            return 0;
    }
    return 1;
}

/* The end of the run of it[first] in the non-decreasing it[first:n]: galloped to, then
 * halved (runs are long: an iteration's operations). */
static Py_ssize_t run_end(const int64_t *it, Py_ssize_t n, Py_ssize_t first)
{
    int64_t v = it[first];
    Py_ssize_t lo = first, step = 1; /* it[lo] == v */
    while (lo + step < n && it[lo + step] == v) {
        lo += step;
        step <<= 1;
    }
    Py_ssize_t hi = lo + step < n ? lo + step : n; /* it[hi] != v, or hi == n */
    while (hi - lo > 1) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (it[mid] == v)
            lo = mid;
        else
            hi = mid;
    }
    return hi;
}

/* A tuple of n PyObject references (stolen; NULL with the error set if one is NULL: the
 * others released). */
static PyObject *tuple_of(PyObject **items, int n)
{
    int made = 1;
    for (int k = 0; k < n; k++)
        made &= items[k] != NULL;
    PyObject *result = made ? PyTuple_New(n) : NULL;
    for (int k = 0; k < n; k++) {
        if (result != NULL)
            PyTuple_SET_ITEM(result, k, items[k]);
        else
            Py_XDECREF(items[k]);
    }
    return result;
}

/* Whether every tid[i] is `thread` (two rows a register, no branch per row). */
static int all_of_thread(const int64_t *tid, int64_t thread, Py_ssize_t n)
{
    const rows2 none = {0, 0}, same = none + (uint64_t)thread;
    rows2 other2 = none;
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4)
        other2 |= (load2(tid + i) ^ same) | (load2(tid + i + 2) ^ same);
    uint64_t other = other2[0] | other2[1];
    for (; i < n; i++)
        other |= (uint64_t)(tid[i] ^ thread);
    return !other;
}

/* keeper_runs' answer for a buffer of one thread whose operations outside any iteration
 * (one negative ordinal) come between its iterations (ascending), as a Trainer's
 * extensions launch them after each update: (thread, its first iteration's ordinal, each
 * group's first row, its rows, each row's group): the groups NumPy's np.unique makes (the
 * operations outside first, then each iteration); None where the buffer is not so.
 * Run by run (a run's rows scanned, its group filled in): some five instructions a row. */
static PyObject *interleaved_groups(const int64_t *it, const int64_t *tid, int64_t thread,
                                    Py_ssize_t n)
{
    if (!all_of_thread(tid, thread, n))
        return Py_NewRef(Py_None);
    PyObject *group_bytes = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    int64_t *firsts = PyMem_Malloc((size_t)(n + 1) * 2 * sizeof(int64_t));
    if (group_bytes == NULL || firsts == NULL) {
        Py_XDECREF(group_bytes);
        PyMem_Free(firsts);
        return PyErr_NoMemory();
    }
    int64_t *group_of = (int64_t *)PyBytes_AS_STRING(group_bytes);
    int64_t *counts = firsts + n + 1;
    /* group 0: the operations outside (its first row known at the first); 1..: iterations */
    Py_ssize_t groups = 1, outside = -1;
    int64_t outside_ordinal = -1, last = -1; /* (last: -1 before the first iteration) */
    int ok = 1;
    counts[0] = 0;
    for (Py_ssize_t i = 0, end; i < n && ok; i = end) {
        const int64_t v = it[i];
        for (end = i + 1; end < n && it[end] == v; end++)
            ;
        Py_ssize_t group = 0;
        if (v < 0) {
            if (outside < 0) {
                outside = i;
                outside_ordinal = v;
            }
            ok = v == outside_ordinal;
        } else {
            if (v != last) {
                ok = v > last;
                last = v;
                firsts[groups] = i;
                counts[groups++] = 0;
            }
            group = groups - 1;
        }
        counts[group] += end - i;
        fill_int64s(group_of + i, end - i, group);
    }
    PyObject *result = NULL;
    if (!ok || outside < 0 || groups == 1) {
        result = Py_NewRef(Py_None);
        Py_DECREF(group_bytes);
    } else {
        firsts[0] = outside;
        PyObject *items[5] = {
            PyLong_FromLongLong(thread), PyLong_FromLongLong(it[firsts[1]]),
            PyBytes_FromStringAndSize((const char *)firsts, groups * (Py_ssize_t)sizeof(int64_t)),
            PyBytes_FromStringAndSize((const char *)counts, groups * (Py_ssize_t)sizeof(int64_t)),
            group_bytes};
        result = tuple_of(items, 5);
    }
    PyMem_Free(firsts);
    return result;
}

/* keeper_runs' answer for n operations' iteration ordinals, threads and (NULL: not read)
 * counted flags; a new reference, or NULL with the error set. */
static PyObject *runs_of(const int64_t *it, const int64_t *tid, const int64_t *counted,
                         Py_ssize_t n)
{
    PyObject *result = NULL;
    if (n <= 0)
        return Py_NewRef(Py_None);
    const int64_t thread = tid[0];
    if (!one_thread_in_order(it, tid, thread, n))
        return interleaved_groups(it, tid, thread, n);
    Py_ssize_t runs = 0;
    int64_t *firsts = PyMem_Malloc((size_t)n * sizeof(int64_t));
    if (firsts == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t first = 0; first < n; first = run_end(it, n, first)) /* runs: searched */
        firsts[runs++] = first;
    Py_ssize_t counted_row = counted ? n : -1; /* warm-up runs, then counted ones (by each run's
                                                * first row) */
    Py_ssize_t first_run = runs;
    int falls = 0;
    for (Py_ssize_t r = 0; r < runs && !falls; r++) {
        int64_t f = firsts[r];
        if (it[f] < 0)
            continue;
        if (first_run == runs)
            first_run = r;
        if (counted == NULL)
            break;
        if (counted[f] == 1) {
            if (counted_row == n)
                counted_row = f;
        } else {
            falls = counted_row != n;
        }
    }
    if (falls) {
        result = Py_NewRef(Py_None);
    } else { /* (a tuple filled in place: Py_BuildValue's parsing is most of its cost) */
        PyObject *items[8] = {
            PyLong_FromLongLong(thread),
            PyBytes_FromStringAndSize((const char *)firsts, runs * (Py_ssize_t)sizeof(int64_t)),
            PyLong_FromSsize_t(counted_row),
            PyLong_FromSsize_t(first_run),
            PyLong_FromSsize_t(first_run < runs ? (Py_ssize_t)firsts[first_run] : n),
            PyLong_FromLongLong(first_run < runs ? it[firsts[first_run]] : -1),
            PyLong_FromSsize_t((Py_ssize_t)firsts[runs - 1]),
            PyLong_FromLongLong(it[n - 1])};
        result = tuple_of(items, 8);
    }
    PyMem_Free(firsts);
    return result;
}

static PyObject *cupti_keeper_runs(PyObject *self, PyObject *cols_obj)
{
    (void)self;
    held h = {NULL, 0, 0};
    PyObject *result = NULL;
    int64_t *c[G_N];
    Py_ssize_t n = -1;
    int given = PyTuple_Check(cols_obj) && PyTuple_GET_SIZE(cols_obj) == G_COUNTED ? G_COUNTED
                                                                                   : G_N;
    if (columns_held(&h, G_N, cols_obj, given, &n, 0, c) == 0)
        result = runs_of(c[G_ITERATION], c[G_TID], given == G_N ? c[G_COUNTED] : NULL, n);
    release_all(&h);
    return result;
}

/* keeper_block_runs(block, counted): keeper_runs of the usual buffer's block (its rows
 * iteration, tid and, where `counted` is true, counted: one buffer to take, no column made
 * in Python). */
static PyObject *cupti_keeper_block_runs(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *block_obj;
    int counted;
    if (!PyArg_ParseTuple(args, "Op", &block_obj, &counted))
        return NULL;
    held h = {PyMem_Calloc(1, sizeof(Py_buffer)), 0, 1};
    if (h.views == NULL)
        return PyErr_NoMemory();
    PyObject *result = NULL;
    int64_t *row[B_N];
    Py_ssize_t n = block_rows(&h, block_obj, row);
    if (n >= 0)
        result = runs_of(row[B_ITERATION], row[B_TID], counted ? row[B_COUNTED] : NULL, n);
    release_all(&h);
    return result;
}

/* This file's functions: cupti_<name>. */
#define FN(name, flags, doc) {#name, cupti_##name, flags, doc}

static PyMethodDef launch_methods[] = { /* the attribution's: calls, clock, ranges */
    FN(api_store, METH_O, "api_store(max_api): launching calls kept in C."),
    FN(api_add, METH_VARARGS, "api_add(store, columns, clock): calls kept."),
    FN(api_join, METH_VARARGS, "api_join(store, correlation, out): each op's launching call."),
    FN(join_block, METH_VARARGS,
       "join_block(store, clock, (correlation, start, end), block[, calls]): calls kept, "
       "operations mapped and joined."),
    FN(to_agent, METH_VARARGS, "to_agent(clock, src, dst): CUPTI ns onto the agent's clock."),
    FN(clock_fit, METH_O, "clock_fit(pairs): gpu_clock.fit's fields."),
    FN(locate, METH_VARARGS,
       "locate(t, depths, kinds, link_ids, out[, tail]): the ranges around each launch."),
    FN(locate_block, METH_VARARGS,
       "locate_block(depths, kinds, link_ids, block, settling): located and settled."),
    {NULL, NULL, 0, NULL},
};

static PyMethodDef figure_methods[] = { /* the figures' sums */
    FN(kernel_table, METH_O, "kernel_table(max_keys): the kernels' sums kept in C."),
    FN(figure_add, METH_VARARGS,
       "figure_add(kernel_table, op_columns, attr_columns, link_sums, phase_sums, op_kinds, "
       "phase_outside, loop_tid, rows): a block's sums, kernels' sums and timeline rows."),
    FN(kernel_rows, METH_O, "kernel_rows(table): its rows, in order."),
    FN(keeper_runs, METH_O,
       "keeper_runs((iteration, tid[, counted])): (tid, each run's first row, the first counted "
       "run's, the first iteration's run, row and ordinal, the last run's row, ordinal), or None."),
    FN(keeper_block_runs, METH_VARARGS,
       "keeper_block_runs(block, counted): keeper_runs of a block's rows (LaunchAttributor's)."),
    {NULL, NULL, 0, NULL},
};

int cupti_locate_ready(PyObject *module)
{
    if (PyModule_AddFunctions(module, launch_methods) < 0)
        return -1;
    return PyModule_AddFunctions(module, figure_methods);
}

/* -- the GPU timeline's placement (analysis.gpu_figures._Timeline._process's twin) ----------
 *
 * timeline_place(rows, iter_end, (key, max_ord, fa, fk, win_start), acc, (neg, launch_gap))
 *   -> (windows, key, win_start, max_ord, fa, fk):
 *   rows      int64[n][7] sorted by start: (start, end, kernel?, launch, ordinal, iter_end,
 *             loop?) (_Timeline.add's rows);
 *   iter_end  the timeline's dict ordinal -> host end of that iteration: each ordinal's
 *             first row here (ordinal and end >= 0) raises it, before any is looked up;
 *   state     the timeline's carried state; acc the open window's six sums (int64[6]);
 *   neg, launch_gap  gpu_figures' _NEG and LAUNCH_GAP_NS.
 * windows: the bytes of the windows finished here, 9 int64 each (key, t0, t1, six sums),
 * then the open window's six sums.  One pass in the rows' order with the running maxima
 * the NumPy twin takes by accumulate; its arithmetic wraps as NumPy's int64 does (its
 * float sums are exact below 2**53 ns: the same numbers). */
enum { TL_START, TL_END, TL_KERNEL, TL_LAUNCH, TL_ORDINAL, TL_ITER_END, TL_LOOP, TL_W };
enum { TL_SUMS = 6, TL_ROW = 3 + TL_SUMS };

static inline int64_t wrap_sub(int64_t a, int64_t b)
{
    return (int64_t)((uint64_t)a - (uint64_t)b);
}

static inline int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

/* An ordinal's first row with an end in a chunk. */
typedef struct {
    int64_t ordinal, end;
    Py_ssize_t row;
} tl_first;

static int by_ordinal_then_row(const void *a, const void *b)
{
    const tl_first *x = a, *y = b;
    if (x->ordinal != y->ordinal)
        return x->ordinal < y->ordinal ? -1 : 1;
    return (x->row > y->row) - (x->row < y->row);
}

/* iter_end[o] = max(e, iter_end.get(o, -1)) for each ordinal's first row (o, e); 0, or -1
 * with the error set. */
static int tl_raise_ends(PyObject *ends, const int64_t *r, Py_ssize_t n)
{
    /* the first row of each run of one ordinal among the rows with an ordinal and an end
     * (each ordinal's first row is one) */
    tl_first room[64], *firsts = room;
    Py_ssize_t m = 0, cap = 64;
    int64_t last = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t o = r[TL_W * i + TL_ORDINAL], e = r[TL_W * i + TL_ITER_END];
        if (o < 0 || e < 0 || (m > 0 && o == last))
            continue;
        if (m == cap) { /* many (a long chunk's iterations): room for a run per row */
            if ((firsts = PyMem_Malloc((size_t)n * sizeof(tl_first))) == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            memcpy(firsts, room, sizeof room);
            cap = n;
        }
        firsts[m++] = (tl_first){o, e, i};
        last = o;
    }
    int ascending = 1;
    for (Py_ssize_t j = 1; j < m; j++)
        ascending &= firsts[j].ordinal > firsts[j - 1].ordinal;
    if (!ascending) /* an ordinal's runs together, its first row first */
        qsort(firsts, (size_t)m, sizeof(tl_first), by_ordinal_then_row);
    int rc = 0;
    for (Py_ssize_t j = 0; rc == 0 && j < m; j++) {
        if (j > 0 && firsts[j].ordinal == firsts[j - 1].ordinal)
            continue;
        PyObject *key = PyLong_FromLongLong(firsts[j].ordinal), *value = NULL;
        rc = -1;
        if (key != NULL) {
            PyObject *had = PyDict_GetItemWithError(ends, key); /* borrowed */
            long long have = had != NULL ? PyLong_AsLongLong(had) : -1;
            if (!PyErr_Occurred()) {
                value = PyLong_FromLongLong(max64(firsts[j].end, have));
                rc = value != NULL ? PyDict_SetItem(ends, key, value) : -1;
            }
        }
        Py_XDECREF(key);
        Py_XDECREF(value);
    }
    if (firsts != room)
        PyMem_Free(firsts);
    return rc;
}

/* iter_end.get(o, -1); -2 with the error set (an end is never below -1). */
static int64_t tl_end_of(PyObject *ends, int64_t o)
{
    PyObject *key = PyLong_FromLongLong(o);
    if (key == NULL)
        return -2;
    PyObject *had = PyDict_GetItemWithError(ends, key); /* borrowed */
    Py_DECREF(key);
    if (had == NULL)
        return PyErr_Occurred() ? -2 : -1;
    long long end = PyLong_AsLongLong(had);
    return end == -1 && PyErr_Occurred() ? -2 : end;
}

/* The finished windows' rows, growing (a chunk finishes a few: an iteration's operations). */
typedef struct {
    int64_t *rows, room[16 * TL_ROW];
    Py_ssize_t n, cap;
} tl_windows;

static int tl_window(tl_windows *w, int64_t key, int64_t t0, int64_t t1, const int64_t *sums)
{
    if (w->n == w->cap) {
        Py_ssize_t cap = 2 * w->cap;
        int64_t *grown = PyMem_Malloc((size_t)(cap * TL_ROW + TL_SUMS) * sizeof(int64_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(grown, w->rows, (size_t)(w->n * TL_ROW) * sizeof(int64_t));
        if (w->rows != w->room)
            PyMem_Free(w->rows);
        w->rows = grown;
        w->cap = cap;
    }
    int64_t *row = w->rows + w->n++ * TL_ROW;
    row[0] = key;
    row[1] = t0;
    row[2] = t1;
    memcpy(row + 3, sums, TL_SUMS * sizeof(int64_t));
    return 0;
}

PyObject *cupti_timeline_place(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *rows_obj, *ends, *acc_obj;
    long long key, max_ord, fa, fk, win_start, neg, launch_gap;
    if (!PyArg_ParseTuple(args, "OO!(LLLLL)O(LL)", &rows_obj, &PyDict_Type, &ends, &key,
                          &max_ord, &fa, &fk, &win_start, &acc_obj, &neg, &launch_gap))
        return NULL;
    held h = {PyMem_Calloc(2, sizeof(Py_buffer)), 0, 2};
    if (h.views == NULL)
        return PyErr_NoMemory();
    PyObject *result = NULL;
    tl_windows w = {NULL, {0}, 0, (Py_ssize_t)(sizeof w.room / sizeof w.room[0]) / TL_ROW - 1};
    w.rows = w.room; /* (room for the open window's sums after the rows) */
    Py_ssize_t cells = -1, n_acc = TL_SUMS;
    const int64_t *r = int64s(&h, rows_obj, &cells, 0);
    const int64_t *acc_in = r != NULL ? int64s(&h, acc_obj, &n_acc, 0) : NULL;
    if (acc_in == NULL)
        goto done;
    if (cells % TL_W) {
        PyErr_SetString(PyExc_ValueError, "timeline_place: rows of 7");
        goto done;
    }
    const Py_ssize_t n = cells / TL_W;
    if (tl_raise_ends(ends, r, n) < 0)
        goto done;
    int64_t acc[TL_SUMS];
    memcpy(acc, acc_in, sizeof acc);
    int64_t window = key, running = max_ord, fa_run = fa, fk_run = fk, fk_out = fk;
    int64_t looked = -1, looked_end = -1; /* the last ordinal looked up (-1: none) and its end */
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t *row = r + TL_W * i;
        const int64_t start = row[TL_START], end = row[TL_END], launch = row[TL_LAUNCH];
        const int64_t ordinal = row[TL_ORDINAL];
        const int is_kernel = row[TL_KERNEL] == 1, loop = row[TL_LOOP] == 1;
        running = max64(running, loop ? ordinal : -1);
        int64_t key_i = -1;
        if (running >= 0) {
            int flip = 0;
            if (loop && ordinal < 0) { /* what the loop thread launched after its iteration */
                if (running != looked) {
                    if ((looked_end = tl_end_of(ends, running)) == -2)
                        goto done;
                    looked = running;
                }
                flip = looked_end >= 0 && launch > looked_end;
            }
            key_i = (int64_t)(2 * (uint64_t)running + (uint64_t)flip);
        }
        const int boundary = key_i > window;
        const int64_t fa_prev = fa_run, fk_prev = fk_run;
        const int64_t gap = fa_prev == neg ? 0 : max64(0, wrap_sub(start, max64(fa_prev, neg + 1)));
        const int64_t all_c = max64(0, wrap_sub(end, max64(start, fa_prev)));
        const int64_t busy_c = is_kernel ? max64(0, wrap_sub(end, max64(start, fk_prev))) : 0;
        const int late = launch >= 0 && launch > fa_prev && fa_prev != neg;
        /* the gap whole to one cause, in the window it ends (before a boundary: the old one) */
        const int cause = late ? (boundary ? 4 : 2) : gap < launch_gap ? 5 : 3;
        acc[cause] = (int64_t)((uint64_t)acc[cause] + (uint64_t)gap);
        if (boundary) { /* union time that ran on past it moves to the window it ran in */
            const int64_t over_all = max64(0, wrap_sub(fa_prev, start));
            const int64_t over_k = max64(0, wrap_sub(fk_prev, start));
            acc[1] = wrap_sub(acc[1], over_all);
            acc[0] = wrap_sub(acc[0], over_k);
            if (tl_window(&w, window, win_start, start, acc) < 0)
                goto done;
            acc[0] = over_k;
            acc[1] = over_all;
            acc[2] = acc[3] = acc[4] = acc[5] = 0;
            window = key_i;
            win_start = start;
        }
        acc[0] = (int64_t)((uint64_t)acc[0] + (uint64_t)busy_c);
        acc[1] = (int64_t)((uint64_t)acc[1] + (uint64_t)all_c);
        fa_run = max64(fa_run, end);
        fk_run = max64(fk_run, is_kernel ? end : neg);
        if (is_kernel)
            fk_out = max64(fk_out, end);
    }
    memcpy(w.rows + w.n * TL_ROW, acc, sizeof acc);
    PyObject *out = PyBytes_FromStringAndSize(
        (const char *)w.rows, (Py_ssize_t)((size_t)(w.n * TL_ROW + TL_SUMS) * sizeof(int64_t)));
    if (out != NULL)
        result = Py_BuildValue("(NLLLLL)", out, (long long)window, (long long)win_start,
                               (long long)(n ? running : max_ord), (long long)fa_run,
                               (long long)fk_out);
done:
    if (w.rows != w.room)
        PyMem_Free(w.rows);
    release_all(&h);
    return result;
}

/* Of rows[lo:hi], sorted by start, the first whose start passes x (> x; or, `ties` 0, a tie
 * passes too: >= x), galloped to from lo (the blocks merged are mostly short). */
static Py_ssize_t tl_first_past(const int64_t *rows, Py_ssize_t lo, Py_ssize_t hi, int64_t x,
                                int ties)
{
#define TL_PAST(r) (ties ? rows[TL_W * (r) + TL_START] > x : rows[TL_W * (r) + TL_START] >= x)
    Py_ssize_t before = lo - 1, at = lo, step = 1; /* not past at `before` (or none) */
    while (at < hi && !TL_PAST(at)) {
        before = at;
        at += step;
        step <<= 1;
    }
    if (at > hi)
        at = hi; /* past at `at`, or at == hi */
    while (at - before > 1) {
        Py_ssize_t mid = before + (at - before) / 2;
        if (TL_PAST(mid))
            at = mid;
        else
            before = mid;
    }
    return at;
#undef TL_PAST
}

/* Room for `rows` rows in *tmp (holding *room); 0, or -1 with the error set. */
static int tl_room(int64_t **tmp, Py_ssize_t *room, Py_ssize_t rows)
{
    if (rows <= *room)
        return 0;
    PyMem_Free(*tmp);
    if ((*tmp = PyMem_Malloc((size_t)(TL_W * rows) * sizeof(int64_t))) == NULL) {
        *room = 0;
        PyErr_NoMemory();
        return -1;
    }
    *room = rows;
    return 0;
}

/* The sorted runs [a, m) and [m, b) of out merged stably in place (ties: the first run's
 * first): the rows already in place left there, the shorter run's rest moved aside (into
 * *tmp) and merged back block by block, from the front or from the back (a buffer's few
 * copies into its kernels: those moved once); 0, or -1 with the error set. */
static int tl_merge(int64_t *out, Py_ssize_t a, Py_ssize_t m, Py_ssize_t b, int64_t **tmp,
                    Py_ssize_t *room)
{
    const size_t row = TL_W * sizeof(int64_t);
    if (out[TL_W * (m - 1) + TL_START] <= out[TL_W * m + TL_START])
        return 0; /* in order already (the usual: one buffer after another) */
    a = tl_first_past(out, a, m, out[TL_W * m + TL_START], 1);
    b = tl_first_past(out, m, b, out[TL_W * (m - 1) + TL_START], 0);
    const Py_ssize_t left = m - a, right = b - m;
    if (tl_room(tmp, room, left < right ? left : right) < 0)
        return -1;
    int64_t *t = *tmp;
    if (left <= right) { /* the first run's rest aside, merged from the front */
        memcpy(t, out + TL_W * a, (size_t)left * row);
        Py_ssize_t i = 0, j = m, d = a; /* d <= j: the rows written never pass those to read */
        while (i < left && j < b) {
            Py_ssize_t k;
            if (t[TL_W * i + TL_START] <= out[TL_W * j + TL_START]) {
                k = tl_first_past(t, i, left, out[TL_W * j + TL_START], 1);
                memcpy(out + TL_W * d, t + TL_W * i, (size_t)(k - i) * row);
                d += k - i;
                i = k;
            } else {
                k = tl_first_past(out, j, b, t[TL_W * i + TL_START], 0);
                memmove(out + TL_W * d, out + TL_W * j, (size_t)(k - j) * row);
                d += k - j;
                j = k;
            }
        }
        memcpy(out + TL_W * d, t + TL_W * i, (size_t)(left - i) * row); /* (the second's: in
                                                                          * place) */
        return 0;
    }
    /* the second run's rest aside, merged from the back: i, j the last rows unread of each,
     * d the last row unwritten (d >= i: the rows written never pass those to read) */
    memcpy(t, out + TL_W * m, (size_t)right * row);
    Py_ssize_t i = m - 1, j = right - 1, d = b - 1;
    while (i >= a && j >= 0) {
        Py_ssize_t k;
        if (out[TL_W * i + TL_START] > t[TL_W * j + TL_START]) { /* the first run's, later */
            k = tl_first_past(out, a, i + 1, t[TL_W * j + TL_START], 1);
            memmove(out + TL_W * (d - (i - k)), out + TL_W * k, (size_t)(i + 1 - k) * row);
            d -= i + 1 - k;
            i = k - 1;
        } else { /* the second run's, from its first at or after the first run's row */
            k = tl_first_past(t, 0, j + 1, out[TL_W * i + TL_START], 0);
            memcpy(out + TL_W * (d - (j - k)), t + TL_W * k, (size_t)(j + 1 - k) * row);
            d -= j + 1 - k;
            j = k - 1;
        }
    }
    memcpy(out + TL_W * a, t, (size_t)(j + 1) * row); /* (the first's: in place) */
    return 0;
}

/* timeline_sort(chunks, out): the timeline's pooled chunks (int64[m][7] each) one after
 * another into out (int64[n][7], n their rows), sorted stably by start (NumPy's argsort,
 * kind "stable", and take): the rows in runs in order (a row a few places back moved
 * there), the runs merged pairwise (the pool's chunks, and a buffer's kernels and copies,
 * come as such runs: each merge mostly blocks copied, or none). */
PyObject *cupti_timeline_sort(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *chunks_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "OO", &chunks_obj, &out_obj))
        return NULL;
    PyObject *chunks = PySequence_Fast(chunks_obj, "timeline_sort: a sequence of row arrays");
    if (chunks == NULL)
        return NULL;
    const Py_ssize_t k = PySequence_Fast_GET_SIZE(chunks);
    held h = {PyMem_Calloc((size_t)k + 1, sizeof(Py_buffer)), 0, k + 1};
    Py_ssize_t bounds_room[64], *bounds = bounds_room, runs = 0, tmp_room = 0;
    int64_t *tmp = NULL;
    PyObject *result = NULL;
    if (h.views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t cells = -1, filled = 0;
    int64_t *out = int64s(&h, out_obj, &cells, 1);
    if (out == NULL)
        goto done;
    for (Py_ssize_t c = 0; c < k; c++) {
        Py_ssize_t m = -1;
        const int64_t *rows = int64s(&h, PySequence_Fast_GET_ITEM(chunks, c), &m, 0);
        if (rows == NULL)
            goto done;
        if (m % TL_W || m > cells - filled)
            break;
        memcpy(out + filled, rows, (size_t)m * sizeof(int64_t));
        filled += m;
    }
    if (filled != cells || cells % TL_W) {
        PyErr_SetString(PyExc_ValueError, "timeline_sort: rows of 7, out their length");
        goto done;
    }
    const Py_ssize_t n = cells / TL_W;
    Py_ssize_t run = 0; /* the runs: bounds[r] their first rows, then n */
    bounds[runs++] = 0;
    for (Py_ssize_t i = 1; i < n; i++) {
        const int64_t x = out[TL_W * i + TL_START];
        if (out[TL_W * (i - 1) + TL_START] <= x)
            continue;
        Py_ssize_t j = i - 1; /* out[j] starts after x: its place is j or before */
        while (j > run && i - j < 8 && out[TL_W * (j - 1) + TL_START] > x)
            j--;
        if (j == run || out[TL_W * (j - 1) + TL_START] <= x) { /* a few places back */
            int64_t moved[TL_W];
            memcpy(moved, out + TL_W * i, sizeof moved);
            memmove(out + TL_W * (j + 1), out + TL_W * j,
                    (size_t)(TL_W * (i - j)) * sizeof(int64_t));
            memcpy(out + TL_W * j, moved, sizeof moved);
            continue;
        }
        if (runs + 1 == 64 && bounds == bounds_room) { /* many runs: room for every row's */
            if ((bounds = PyMem_Malloc((size_t)(n + 1) * sizeof(Py_ssize_t))) == NULL) {
                bounds = bounds_room;
                PyErr_NoMemory();
                goto done;
            }
            memcpy(bounds, bounds_room, sizeof bounds_room);
        }
        bounds[runs++] = run = i;
    }
    bounds[runs] = n;
    while (runs > 1) { /* pairwise, the runs halved each turn */
        Py_ssize_t kept = 0;
        for (Py_ssize_t r = 0; r < runs; r += 2) {
            if (r + 1 < runs && tl_merge(out, bounds[r], bounds[r + 1], bounds[r + 2], &tmp,
                                         &tmp_room) < 0)
                goto done;
            bounds[kept++] = bounds[r];
        }
        bounds[kept] = n;
        runs = kept;
    }
    result = Py_NewRef(Py_None);
done:
    if (bounds != bounds_room)
        PyMem_Free(bounds);
    PyMem_Free(tmp);
    release_all(&h);
    Py_DECREF(chunks);
    return result;
}
