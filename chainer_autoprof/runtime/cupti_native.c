/* cupti_native.c -- CUPTI's activity buffers read in C (module chainer_autoprof.runtime._cupti).
 *
 * Why: through cupti-python every record becomes a Python object on CUPTI's thread and is
 * converted again, about 9 us each with the GIL held: on a host-bound model that costs the
 * training thread more than the profile is worth.  Here libcupti is loaded at run time
 * (dlopen of the path the Python side chose: the nvidia-cuda-cupti wheel, the CUDA toolkit,
 * or a test library), this module registers its own buffer callbacks, and each completed
 * buffer is walked in C with CUPTI's record structs (cupti_activity.h), without the GIL.
 *
 * What comes out, per buffer, as two int64 tables (column after column, handed over without
 * a copy), queued here; CUPTI's thread never takes the GIL (it never waits for the training
 * thread, nor can a flush made with the GIL held wait on it).  Python takes the queue when it
 * drains (hand_over(): the GIL held, on its own thread), giving each buffer's tables to one
 * callable:
 *   ops: kernels, copies and memsets, one row of OP_COLUMNS each (the order of
 *        common.gpu_records.GpuOps), -1 where a column does not apply;
 *   api: the runtime/driver calls that launched those operations (API_COLUMNS, the order
 *        of ApiCalls), each handed over once.
 * The launch calls that launch nothing (12 of 13 API records in the recorded CNN) are kept
 * here only: a table indexed by the low bits of the correlation id holds the newest
 * API_SLOTS calls; an operation takes its call from it (or, when the call is still to come,
 * leaves its id in a table of waiting ids that the call finds).  So the attribution joins
 * every operation to its call exactly as it would with every API record, at one API row per
 * operation instead of thirteen.
 *
 * Kernel names are interned here (by CUPTI's name pointer, then by text) into the current
 * collector's NameStore, a Python object: a buffer tells Python only the range of ids new in
 * it; the texts stay here until the name table asks for them (NameStore.texts, at exit for
 * the figures), so reading makes no Python string per name.  A store outlives its collector
 * for as long as a name table still needs its texts.
 *
 * Each record's row is written in one place, every cell a store: tables of 2^10 .. 2^18
 * rows have a power of two of them and the walk is compiled for each such size, so a
 * column's cell is a constant offset from its row.
 *
 * Only the leading fields of each record are read; they have kept their offsets in every
 * record version since (new fields are appended), so the structs named here are the oldest
 * that hold them (Kernel9, Memcpy6, Memset4: in the headers of CUDA 12 and 13 alike) and a
 * libcupti of either serves its own newest version to them.  The tests' libcupti serves the
 * newest version and checks at build time that the fields lie where these structs say.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cupti_activity.h>
#include <cupti_version.h>
#include <cupti_driver_cbid.h>
#include <cupti_runtime_cbid.h>

#include "cupti_locate.h"

/* -- libcupti's functions, resolved by dlsym -------------------------------------------- */
typedef CUptiResult (*register_fn)(CUpti_BuffersCallbackRequestFunc,
                                   CUpti_BuffersCallbackCompleteFunc);
typedef CUptiResult (*kind_fn)(CUpti_ActivityKind);
typedef CUptiResult (*api_switch_fn)(CUpti_CallbackId, uint8_t);
typedef CUptiResult (*flag_fn)(uint32_t);
typedef CUptiResult (*next_fn)(uint8_t *, size_t, CUpti_Activity **);
typedef CUptiResult (*dropped_fn)(CUcontext, uint32_t, size_t *);
typedef CUptiResult (*timestamp_fn)(uint64_t *);
typedef CUptiResult (*thread_type_fn)(CUpti_ActivityThreadIdType);
typedef CUptiResult (*result_string_fn)(CUptiResult, const char **);

static struct {
    void *handle;
    char *path;
    register_fn register_callbacks;
    kind_fn enable, disable;
    api_switch_fn enable_runtime, enable_driver; /* optional (CUDA 12.? and later) */
    flag_fn flush_all, flush_period;             /* flush_period optional */
    next_fn next_record;
    dropped_fn dropped;                          /* optional */
    timestamp_fn timestamp;
    thread_type_fn thread_type;                  /* optional */
    result_string_fn result_string;              /* optional */
} lib;

/* -- the columns ------------------------------------------------------------------------- */
enum { OP_KIND, OP_START, OP_END, OP_CORR, OP_DEVICE, OP_CONTEXT, OP_STREAM, OP_NAME, OP_BYTES,
       OP_COPY_KIND, OP_SRC_KIND, OP_DST_KIND, OP_VALUE, OP_GRID_X, OP_GRID_Y, OP_GRID_Z,
       OP_BLOCK_X, OP_BLOCK_Y, OP_BLOCK_Z, OP_REGISTERS, OP_STATIC_SMEM, OP_DYNAMIC_SMEM,
       OP_NCOLS };
static const char *const OP_COLUMNS[OP_NCOLS] = {
    "kind", "start", "end", "correlation", "device", "context", "stream", "name", "bytes",
    "copy_kind", "src_kind", "dst_kind", "value", "grid_x", "grid_y", "grid_z", "block_x",
    "block_y", "block_z", "registers", "static_smem", "dynamic_smem"};
enum { API_DOMAIN, API_START, API_END, API_CORR, API_CBID, API_THREAD, API_NCOLS };
static const char *const API_COLUMNS[API_NCOLS] = {
    "domain", "start", "end", "correlation", "cbid", "thread"};
/* GpuOps.kind and ApiCalls.domain (common/gpu_records.py) */
enum { KIND_KERNEL = 0, KIND_MEMCPY = 1, KIND_MEMSET = 2 };
enum { DOMAIN_RUNTIME = 0, DOMAIN_DRIVER = 1 };

/* -- state shared by the buffer callbacks (under `lock`) ---------------------------------- */
#define API_BITS 18
#define API_SLOTS (1u << API_BITS)
#define WAIT_BITS 16
#define WAIT_SLOTS (1u << WAIT_BITS)
#define NAME_CACHE 4096 /* pointer -> id, two ways a set (NAME_CACHE / 2 sets); a power of 2 */

/* A kept call: its record as CUPTI wrote it, copied whole (kind 0: an empty slot), but for
 * `returnValue`, which this module does not read: there, whether it was handed over. */
typedef CUpti_ActivityAPI api_slot;
#define HANDED(a) ((a)->returnValue)

typedef struct {
    char *text;
    size_t len;
    uint64_t hash;
} name_entry;

/* One collector's kernel names (a Python object, so that a name table that still needs its
 * texts keeps them after the collector stopped and another started): the walk appends to
 * the current store (`store`) under `lock`; texts are read from any store under `lock`. */
/* Where a store's texts lie: chunks of TEXT_CHUNK bytes (a longer text gets one of its
 * own), each after a link to the previous one, freed with the store: one allocation for a
 * few hundred names, not one each (a run's names come in its first buffers, dozens at once). */
#define TEXT_CHUNK ((size_t)64 << 10)
typedef struct text_chunk {
    struct text_chunk *prev;
} text_chunk;

typedef struct {
    PyObject_HEAD
    name_entry *names; /* by id */
    size_t n, cap;
    int64_t *index;    /* open addressing by hash: id + 1, 0 empty */
    size_t cap_index;
    text_chunk *chunks; /* the newest first */
    char *free_at;      /* the newest chunk's room left: free_left bytes from free_at */
    size_t free_left;
    pid_t pid;         /* the process that made it (a forked child takes `lock` only if free) */
} NameStore;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static api_slot *api_table;      /* API_SLOTS */
static uint32_t *waiting;        /* WAIT_SLOTS: ids of operations whose call is still to come */
static NameStore *store;         /* the current collector's names (a reference held here) */
static unsigned long store_generation; /* changes with `store` (under lock, the GIL held) */
static struct { const char *ptr; int64_t id; } name_cache[NAME_CACHE];

static size_t buffer_bytes = 8u << 20;
/* called by py_hand_over, once per buffer, with (ops Block, its rows, api Block, its rows,
 * rows of room, the first new name's id, how many new names, the NameStore that holds their
 * texts, the buffer's clock pair or None) */
static PyObject *on_buffer;
static volatile int closed = 1;   /* set: completed buffers are freed unread */
static long long walked_records; /* counts.records, readable without the lock */
static struct {
    long long buffers, records, ops, api_handed, incomplete, dropped, errors, unread, overflow;
} counts;

/* -- column tables (one per buffer, room for every record it can hold) ------------------ */
typedef struct {
    int64_t *cols; /* column c, row i at cols[c * cap + i] */
    size_t n, cap, width;
} table;

/* A walked buffer waiting for Python (py_hand_over): its tables, the range of names new in
 * it, the store it added them to (by generation), its clock pair. */
typedef struct waiting_buffer {
    struct waiting_buffer *next;
    table ops, api;
    size_t first_name, new_names;
    unsigned long generation;
    int64_t p0, p1; /* CLOCK_MONOTONIC around CUPTI's clock */
    uint64_t cupti_ns;
    int clock_ok;
} waiting_buffer;
/* The rows' bytes waiting at most (under `lock`; set by register): beyond, a buffer's
 * tables are freed and its operations counted (counts.overflow).  Python takes the queue at
 * every drain (a few buffers), and a collector's stop takes it whole. */
static size_t max_waiting_bytes = (size_t)256 << 20; /* register's third argument */
static waiting_buffer *waiting_head, *waiting_tail;
static size_t waiting_count, waiting_bytes;
static pid_t owner_pid; /* the process that registered (a forked child takes no lock) */

static size_t rows_bytes(const table *t)
{
    return t->n * t->width * sizeof(int64_t);
}

/* The smallest record this module reads (CUpti_ActivityAPI): a buffer of `valid` bytes holds
 * fewer rows of any table than valid / MIN_RECORD + 1. */
#define MIN_RECORD 40

/* Tables of 2^(FIXED_MIN - 1) + 1 .. 2^FIXED_MAX rows get the next power of two of them (at
 * most twice the room, untouched pages costing nothing: only the rows written are touched):
 * the walk is compiled for each such size, so a cell's column is a constant offset from its
 * row (a store each, no address arithmetic).  Smaller tables (a flush's few records) and
 * larger ones keep their exact size. */
#define FIXED_MIN 10
#define FIXED_MAX 18

static size_t table_rows(size_t valid)
{
    size_t rows = valid / MIN_RECORD + 1, fixed = (size_t)1 << FIXED_MIN;
    if (rows <= fixed / 2 || rows > ((size_t)1 << FIXED_MAX))
        return rows;
    while (fixed < rows)
        fixed <<= 1;
    return fixed;
}

static int table_init(table *t, size_t width, size_t valid)
{
    t->n = 0;
    t->width = width;
    t->cap = table_rows(valid);
    t->cols = malloc(width * t->cap * sizeof(int64_t)); /* pages touched as rows are written */
    return t->cols == NULL ? -1 : 0;
}

/* A new row's index, or -1 (never: the table has room for every record). */
static inline long table_row(table *t)
{
    return t->n < t->cap ? (long)t->n++ : -1;
}


/* -- kernel names ------------------------------------------------------------------------- */
/* A kernel name's hash, eight bytes a step (mangled names run to hundreds of bytes), and its
 * length. */
static uint64_t text_hash(const char *s, size_t *len)
{
    const size_t n = strlen(s);
    uint64_t h = 1469598103934665603ull ^ n, w;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0x9e3779b97f4a7c15ull;
        h ^= h >> 32;
    }
    w = 0;
    memcpy(&w, s + i, n - i);
    h = (h ^ w) * 0xff51afd7ed558ccdull; /* then MurmurHash3's finish: every bit mixed down */
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    *len = n;
    return h;
}

static void index_insert(NameStore *st, int64_t id)
{
    size_t mask = st->cap_index - 1, i = (size_t)st->names[id].hash & mask;
    while (st->index[i])
        i = (i + 1) & mask;
    st->index[i] = id + 1;
}

/* The id of kernel name `s` in the current store (new ones appended); -1 when out of
 * memory.  Python learns a buffer's new ids as a range and fetches texts when it needs
 * them (NameStore.texts): no Python object is made here. */
static __attribute__((noinline)) int64_t name_looked_up(const char *s, size_t slot);

static inline __attribute__((always_inline)) int64_t name_id(const char *s)
{
    if (s == NULL)
        return -1;
    /* the set by every bit of the pointer (multiplied by 2^64 / phi: where the heap put
     * the names decides their low bits, and some layouts gave many the same ones), two ways
     * a set (two names that share one do not evict each other as kernels alternate) */
    const size_t slot = (size_t)(((uint64_t)(uintptr_t)s * UINT64_C(0x9E3779B97F4A7C15)) >> 52)
                        & (NAME_CACHE - 2);
    if (name_cache[slot].ptr == s)
        return name_cache[slot].id;
    if (name_cache[slot + 1].ptr == s)
        return name_cache[slot + 1].id;
    return name_looked_up(s, slot); /* out of line: the walk's registers stay its own */
}

/* Room for `size` bytes of text in st's chunks; NULL when out of memory. */
static char *store_text(NameStore *st, size_t size)
{
    if (size > st->free_left) {
        const size_t bytes = size > TEXT_CHUNK ? size : TEXT_CHUNK;
        text_chunk *c = malloc(sizeof(text_chunk) + bytes);
        if (c == NULL)
            return NULL;
        c->prev = st->chunks;
        st->chunks = c;
        st->free_at = (char *)(c + 1);
        st->free_left = bytes;
    }
    char *at = st->free_at;
    st->free_at += size;
    st->free_left -= size;
    return at;
}

/* name_id's lookup past the pointer cache: by text, new names appended. */
/* `s` as the newest of its set (the older way keeps the set's other name); its id. */
static int64_t cached(size_t slot, const char *s, int64_t id)
{
    name_cache[slot + 1] = name_cache[slot];
    name_cache[slot].ptr = s;
    name_cache[slot].id = id;
    return id;
}

static int64_t name_looked_up(const char *s, size_t slot)
{
    NameStore *st = store;
    size_t len;
    uint64_t h = text_hash(s, &len);
    if (st->cap_index) {
        size_t mask = st->cap_index - 1;
        for (size_t i = (size_t)h & mask; st->index[i]; i = (i + 1) & mask) {
            name_entry *e = &st->names[st->index[i] - 1];
            if (e->hash == h && e->len == len && memcmp(e->text, s, len) == 0)
                return cached(slot, s, st->index[i] - 1);
        }
    }
    if (st->n == st->cap) {
        size_t cap = st->cap ? st->cap * 2 : 256;
        name_entry *grown = realloc(st->names, cap * sizeof(name_entry));
        if (grown == NULL)
            return -1;
        st->names = grown;
        st->cap = cap;
    }
    if (2 * (st->n + 1) > st->cap_index) { /* rehash into twice the room */
        size_t cap = st->cap_index ? st->cap_index * 2 : 512;
        int64_t *index = calloc(cap, sizeof(int64_t));
        if (index == NULL)
            return -1;
        free(st->index);
        st->index = index;
        st->cap_index = cap;
        for (size_t i = 0; i < st->n; i++)
            index_insert(st, (int64_t)i);
    }
    char *text = store_text(st, len + 1);
    if (text == NULL)
        return -1;
    memcpy(text, s, len + 1);
    int64_t id = (int64_t)st->n++;
    st->names[id].text = text;
    st->names[id].len = len;
    st->names[id].hash = h;
    index_insert(st, id);
    return cached(slot, s, id);
}

/* -- the walk of one buffer ---------------------------------------------------------------- */
/* A row's cells: column c of the row at `row` is row[c * stride] (a table's layout). */
#define AT(c) row[(size_t)(c) * stride]

/* A kept call handed over: its row of `api`; 0, or -1 (never: the table has room). */
static inline __attribute__((always_inline)) int hand_api(api_slot *a, table *api,
                                                         const size_t stride)
{
    if (api->n >= stride) /* its rows: as many as the operations' table */
        return -1;
    int64_t *row = api->cols + api->n++;
    const CUpti_ActivityAPI *c = a;
    AT(API_DOMAIN) = c->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? DOMAIN_RUNTIME : DOMAIN_DRIVER;
    AT(API_START) = (int64_t)c->start;
    AT(API_END) = (int64_t)c->end;
    AT(API_CORR) = c->correlationId;
    AT(API_CBID) = c->cbid;
    AT(API_THREAD) = c->threadId;
    HANDED(a) = 1;
    return 0;
}

/* A new operation's row (its index in `ops` taken); out of room (never: the table has a row
 * for every record, `stride` of them) goes to `full`. */
#define OP_ROW()                                                                           \
    do {                                                                                   \
        if (ops.n >= stride)                                                               \
            goto full;                                                                     \
        row = ops.cols + ops.n++;                                                          \
    } while (0)

/* The fields every operation kind has, at the same names in CUPTI's structs. */
#define OP_HEAD(op_kind, r)                                                                \
    do {                                                                                   \
        AT(OP_KIND) = (op_kind);                                                           \
        AT(OP_START) = (int64_t)(r)->start;                                                \
        AT(OP_END) = (int64_t)(r)->end;                                                    \
        AT(OP_CORR) = corr = (r)->correlationId;                                           \
        AT(OP_DEVICE) = (r)->deviceId;                                                     \
        AT(OP_CONTEXT) = (r)->contextId;                                                   \
        AT(OP_STREAM) = (r)->streamId;                                                     \
    } while (0)

_Static_assert(CUPTI_ACTIVITY_KIND_RUNTIME == CUPTI_ACTIVITY_KIND_DRIVER + 1,
               "the walk tests the call kinds as one range");

/* Walk `buffer` into `ops` and `api` (new names into the store), each record's row written
 * in one place, the tables and counters held in locals; 0, or -1 out of room. */
static inline __attribute__((always_inline)) int walk_rows(uint8_t *buffer, size_t valid,
                                                          table *ops_out, table *api_out,
                                                          const size_t stride)
{
    table ops = *ops_out, api = *api_out; /* stride: the rows of each */
    const next_fn next = lib.next_record;
    api_slot *const calls = api_table;
    uint32_t *const wait = waiting;
    long long records = 0, incomplete = 0;
    int failed = 0;
    CUpti_Activity *record = NULL;
    while (next(buffer, valid, &record) == CUPTI_SUCCESS) {
        int64_t *row;
        uint32_t corr;
        const uint32_t kind = (uint32_t)record->kind;
        /* by frequency (most records are calls), tested in order rather than by a jump */
        if (kind - CUPTI_ACTIVITY_KIND_DRIVER <= 1u) { /* DRIVER or RUNTIME */
            /* a call: kept (the record copied whole) until its operation comes, or handed
             * over now if the operation came first */
            const CUpti_ActivityAPI *c = (const CUpti_ActivityAPI *)record;
            records++;
            corr = c->correlationId;
            api_slot *a = &calls[corr & (API_SLOTS - 1)];
            memcpy(a, c, sizeof(CUpti_ActivityAPI));
            HANDED(a) = 0;
            uint32_t *w = &wait[corr & (WAIT_SLOTS - 1)];
            if (*w == corr && corr != 0) {
                *w = 0;
                if (hand_api(a, &api, stride))
                    goto full;
            }
            continue;
        }
        if (kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel9 *k = (const CUpti_ActivityKernel9 *)record;
            records++;
            if (k->start == 0 || k->end < k->start) {
                incomplete++;
                continue;
            }
            OP_ROW();
            OP_HEAD(KIND_KERNEL, k);
            AT(OP_NAME) = name_id(k->name);
            AT(OP_BYTES) = AT(OP_COPY_KIND) = AT(OP_SRC_KIND) = AT(OP_DST_KIND) = -1;
            AT(OP_VALUE) = -1; /* a copy's, a memset's */
            AT(OP_GRID_X) = k->gridX;
            AT(OP_GRID_Y) = k->gridY;
            AT(OP_GRID_Z) = k->gridZ;
            AT(OP_BLOCK_X) = k->blockX;
            AT(OP_BLOCK_Y) = k->blockY;
            AT(OP_BLOCK_Z) = k->blockZ;
            AT(OP_REGISTERS) = k->registersPerThread;
            AT(OP_STATIC_SMEM) = k->staticSharedMemory;
            AT(OP_DYNAMIC_SMEM) = k->dynamicSharedMemory;
        } else if (kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)record;
            records++;
            if (m->start == 0 || m->end < m->start) {
                incomplete++;
                continue;
            }
            OP_ROW();
            OP_HEAD(KIND_MEMCPY, m);
            AT(OP_NAME) = AT(OP_VALUE) = -1;
            AT(OP_BYTES) = (int64_t)m->bytes;
            AT(OP_COPY_KIND) = m->copyKind;
            AT(OP_SRC_KIND) = m->srcKind;
            AT(OP_DST_KIND) = m->dstKind;
            for (int c = OP_GRID_X; c < OP_NCOLS; c++) /* a kernel's */
                AT(c) = -1;
        } else if (kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)record;
            records++;
            if (m->start == 0 || m->end < m->start) {
                incomplete++;
                continue;
            }
            OP_ROW();
            OP_HEAD(KIND_MEMSET, m);
            AT(OP_NAME) = AT(OP_COPY_KIND) = AT(OP_SRC_KIND) = AT(OP_DST_KIND) = -1;
            AT(OP_BYTES) = (int64_t)m->bytes;
            AT(OP_VALUE) = m->value;
            for (int c = OP_GRID_X; c < OP_NCOLS; c++) /* a kernel's */
                AT(c) = -1;
        } else {
            continue;
        }
        /* the operation's launching call, handed over with it (or awaited) */
        api_slot *a = &calls[corr & (API_SLOTS - 1)];
        if (a->correlationId == corr && a->kind != 0) {
            if (!HANDED(a) && hand_api(a, &api, stride))
                goto full;
        } else {
            wait[corr & (WAIT_SLOTS - 1)] = corr;
        }
    }
    goto done;
full:
    failed = -1;
done:
    counts.records += records;
    counts.incomplete += incomplete;
    *ops_out = ops;
    *api_out = api;
    return failed;
}
#undef OP_ROW
#undef OP_HEAD
#undef AT

/* walk_rows compiled for each fixed size (a function each: its own registers) and for any
 * other; both tables of a buffer have as many rows (table_init of the same bytes). */
#define FIXED(bits)                                                                        \
    static __attribute__((noinline)) int walk_##bits(uint8_t *buffer, size_t valid,        \
                                                     table *ops, table *api)               \
    {                                                                                      \
        return walk_rows(buffer, valid, ops, api, (size_t)1 << (bits));                    \
    }
FIXED(10) FIXED(11) FIXED(12) FIXED(13) FIXED(14) FIXED(15) FIXED(16) FIXED(17) FIXED(18)
#undef FIXED

static int walk(uint8_t *buffer, size_t valid, table *ops, table *api)
{
    switch (ops->cap) {
#define FIXED(bits)                                                                        \
    case (size_t)1 << (bits):                                                              \
        return walk_##bits(buffer, valid, ops, api);
        FIXED(10) FIXED(11) FIXED(12) FIXED(13) FIXED(14) FIXED(15) FIXED(16) FIXED(17)
        FIXED(18)
#undef FIXED
    default:
        return walk_rows(buffer, valid, ops, api, ops->cap);
    }
}
_Static_assert(FIXED_MIN == 10 && FIXED_MAX == 18, "walk: one case per fixed size");

/* -- CUPTI's callbacks --------------------------------------------------------------------- */
static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    void *p = NULL;
    if (posix_memalign(&p, 8, buffer_bytes) != 0)
        p = NULL;
    *buffer = p;
    *size = p ? buffer_bytes : 0;
    *max_records = 0;
}

/* A table's memory handed to Python without a copy: a buffer (read and write) that frees
 * it when the last view of it goes.  Column c of a table of `cap` rows starts at c * cap. */
typedef struct {
    PyObject_HEAD
    int64_t *data;
    Py_ssize_t bytes;
    Py_ssize_t n, cap, width; /* its table's rows filled, rows of room, columns */
} Block;

static int block_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    Block *b = (Block *)self;
    return PyBuffer_FillInfo(view, self, b->data, b->bytes, 0, flags);
}

static void block_dealloc(PyObject *self)
{
    free(((Block *)self)->data);
    Py_TYPE(self)->tp_free(self);
}

static PyBufferProcs block_buffer = {block_getbuffer, NULL};

static PyTypeObject BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "chainer_autoprof.runtime._cupti.Block",
    .tp_basicsize = sizeof(Block),
    .tp_dealloc = block_dealloc,
    .tp_as_buffer = &block_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A buffer's column table (column c of `cap` rows at c * cap).",
};

/* The table's memory as a Block (the table gives it up), or NULL. */
static PyObject *columns(table *t)
{
    Block *b = PyObject_New(Block, &BlockType);
    if (b == NULL)
        return NULL;
    b->data = t->cols;
    b->bytes = (Py_ssize_t)(t->width * t->cap * sizeof(int64_t));
    b->n = (Py_ssize_t)t->n;
    b->cap = (Py_ssize_t)t->cap;
    b->width = (Py_ssize_t)t->width;
    t->cols = NULL;
    return (PyObject *)b;
}

Py_ssize_t cupti_table_rows(PyObject *obj, int width, const int64_t **rows)
{
    if (!Py_IS_TYPE(obj, &BlockType))
        return -1;
    const Block *b = (const Block *)obj;
    if (b->width < width)
        return -1;
    for (int c = 0; c < width; c++)
        rows[c] = b->data + (size_t)c * (size_t)b->cap;
    return b->n;
}

/* two enums of two files: compared as ints */
_Static_assert((int)TABLE_OP_KIND == (int)OP_KIND && (int)TABLE_OP_START == (int)OP_START
                   && (int)TABLE_OP_END == (int)OP_END && (int)TABLE_OP_CORR == (int)OP_CORR
                   && (int)TABLE_OP_DEVICE == (int)OP_DEVICE && (int)TABLE_OP_NAME == (int)OP_NAME
                   && (int)TABLE_OP_ROWS == (int)OP_NAME + 1,
               "the operations' rows as cupti_locate.c reads them from a table");

/* -- the name store, a Python object ----------------------------------------------------- */
static void name_store_dealloc(PyObject *self)
{
    NameStore *st = (NameStore *)self; /* no longer the current store: no walk reaches it */
    while (st->chunks != NULL) {
        text_chunk *prev = st->chunks->prev;
        free(st->chunks);
        st->chunks = prev;
    }
    free(st->names);
    free(st->index);
    Py_TYPE(self)->tp_free(self);
}

/* texts(first, stop): names first .. stop - 1 as str (invalid UTF-8 replaced).  In a forked
 * child, `lock` is taken only if free (the thread that held it is gone): RuntimeError if not. */
static PyObject *name_store_texts(PyObject *self, PyObject *args)
{
    NameStore *st = (NameStore *)self;
    Py_ssize_t first, stop;
    if (!PyArg_ParseTuple(args, "nn:texts", &first, &stop))
        return NULL;
    if (st->pid == getpid())
        pthread_mutex_lock(&lock);
    else if (pthread_mutex_trylock(&lock) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "kernel names held by a thread of the parent");
        return NULL;
    }
    PyObject *out = NULL;
    if (first < 0 || stop < first || (size_t)stop > st->n) {
        PyErr_Format(PyExc_IndexError, "names %zd .. %zd of %zu", first, stop, st->n);
    } else if ((out = PyList_New(stop - first)) != NULL) {
        for (Py_ssize_t i = first; i < stop; i++) {
            PyObject *text = PyUnicode_DecodeUTF8(st->names[i].text, (Py_ssize_t)st->names[i].len,
                                                  "replace");
            if (text == NULL) {
                Py_CLEAR(out);
                break;
            }
            PyList_SET_ITEM(out, i - first, text);
        }
    }
    pthread_mutex_unlock(&lock);
    return out;
}

static PyMethodDef name_store_methods[] = {
    {"texts", name_store_texts, METH_VARARGS, "texts(first, stop): those names' texts (list)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject NameStoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "chainer_autoprof.runtime._cupti.NameStore",
    .tp_basicsize = sizeof(NameStore),
    .tp_dealloc = name_store_dealloc,
    .tp_methods = name_store_methods,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One collector's kernel names, by id (texts fetched when needed).",
};

static NameStore *name_store_new(void)
{
    NameStore *st = PyObject_New(NameStore, &NameStoreType);
    if (st != NULL) {
        st->names = NULL;
        st->n = st->cap = st->cap_index = 0;
        st->index = NULL;
        st->chunks = NULL;
        st->free_at = NULL;
        st->free_left = 0;
        st->pid = getpid();
    }
    return st;
}

/* CLOCK_MONOTONIC in ns: time.perf_counter_ns() on Linux (CPython reads that clock). */
static int64_t monotonic_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

/* The clock pair of a buffer, (CUPTI ns, perf_counter ns, read ns) as
 * gpu_activity.read_clock_pair makes it (CUPTI's clock read between two of the agent's, the
 * pair's agent time their middle), read in C as the buffer completes: the reads stay close
 * together, and Python makes no call for them.  None where CUPTI's clock fails. */
static PyObject *clock_pair(int64_t p0, uint64_t cupti, int64_t p1, int ok)
{
    if (!ok)
        Py_RETURN_NONE;
    return Py_BuildValue("(KLL)", (unsigned long long)cupti, (long long)(p0 + (p1 - p0) / 2),
                         (long long)(p1 - p0));
}

/* Queue a walked buffer's tables for Python (moved into the queue: `ops` and `api` give them
 * up), with the clock pair read now: CUPTI's thread never waits for the GIL (Python takes
 * the queue on a thread of its own, py_hand_over).  Dropped and counted when closed or full. */
static void enqueue(table *ops, table *api, size_t first_name, size_t new_names,
                    unsigned long generation)
{
    waiting_buffer *w = closed ? NULL : malloc(sizeof(waiting_buffer));
    if (w != NULL) {
        w->next = NULL;
        w->ops = *ops;
        w->api = *api;
        w->first_name = first_name;
        w->new_names = new_names;
        w->generation = generation;
        w->p0 = monotonic_ns();
        w->clock_ok = lib.timestamp(&w->cupti_ns) == CUPTI_SUCCESS;
        w->p1 = monotonic_ns();
    }
    const size_t bytes = rows_bytes(ops) + rows_bytes(api);
    pthread_mutex_lock(&lock);
    if (closed || w == NULL || waiting_bytes + bytes > max_waiting_bytes) {
        if (!closed && w == NULL)
            counts.errors++; /* out of memory */
        else if (!closed)
            counts.overflow += (long long)ops->n; /* the queue is full */
        counts.unread++;
        pthread_mutex_unlock(&lock);
        free(w);
        return; /* the caller frees the tables */
    }
    if (waiting_tail != NULL)
        waiting_tail->next = w;
    else
        waiting_head = w;
    waiting_tail = w;
    waiting_count++;
    waiting_bytes += bytes;
    pthread_mutex_unlock(&lock);
    ops->cols = api->cols = NULL; /* the queue's now */
}

static void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t *buffer,
                                      size_t size, size_t valid)
{
    (void)size;
    table ops = {NULL, 0, 0, OP_NCOLS}, api = {NULL, 0, 0, API_NCOLS};
    int failed = 0;
    size_t first_name = 0, new_names = 0;
    unsigned long generation = 0; /* of the store the walk added names to */
    if (!closed && buffer != NULL
        && (table_init(&ops, OP_NCOLS, valid) || table_init(&api, API_NCOLS, valid)))
        failed = 1;
    pthread_mutex_lock(&lock);
    if (failed) {
        counts.errors++;
        counts.unread++;
    } else if (closed || buffer == NULL || api_table == NULL || store == NULL) {
        counts.unread += buffer != NULL && valid > 0;
    } else {
        generation = store_generation;
        first_name = store->n;
        failed = walk(buffer, valid, &ops, &api) != 0;
        new_names = store->n - first_name;
        __atomic_store_n(&walked_records, counts.records, __ATOMIC_RELEASE);
        counts.buffers++;
        counts.ops += (long long)ops.n;
        counts.api_handed += (long long)api.n;
        if (lib.dropped != NULL) {
            size_t dropped = 0;
            if (lib.dropped(context, stream, &dropped) == CUPTI_SUCCESS)
                counts.dropped += (long long)dropped;
        }
        if (failed)
            counts.errors++;
    }
    pthread_mutex_unlock(&lock);
    free(buffer);
    if (!failed && (ops.n || api.n || new_names))
        enqueue(&ops, &api, first_name, new_names, generation);
    free(ops.cols);
    free(api.cols);
}

static void free_waiting(waiting_buffer *w)
{
    while (w != NULL) {
        waiting_buffer *next = w->next;
        free(w->ops.cols);
        free(w->api.cols);
        free(w);
        w = next;
    }
}

/* Hand one waiting buffer to the callback (the GIL held): 0, or -1 when it raised (the
 * error cleared and counted: the next buffer still goes). */
static int hand(PyObject *callback, PyObject *names, waiting_buffer *w)
{
    PyObject *o = columns(&w->ops), *a = columns(&w->api);
    int ok = o != NULL && a != NULL;
    PyObject *args[9] = {o,
                         PyLong_FromSsize_t((Py_ssize_t)w->ops.n),
                         a,
                         PyLong_FromSsize_t((Py_ssize_t)w->api.n),
                         PyLong_FromSsize_t((Py_ssize_t)w->ops.cap),
                         PyLong_FromSsize_t((Py_ssize_t)w->first_name),
                         PyLong_FromSsize_t((Py_ssize_t)w->new_names),
                         names,
                         clock_pair(w->p0, w->cupti_ns, w->p1, w->clock_ok)};
    for (int k = 1; k < 9; k++)
        ok = ok && args[k] != NULL;
    if (ok) {
        PyObject *r = PyObject_Vectorcall(callback, args, 9, NULL);
        ok = r != NULL;
        Py_XDECREF(r);
    }
    for (int k = 1; k < 9; k++)
        if (k != 2 && k != 7)
            Py_XDECREF(args[k]);
    Py_XDECREF(o);
    Py_XDECREF(a);
    if (!ok)
        PyErr_Clear();
    return ok ? 0 : -1;
}

/* hand_over(): the buffers walked since the last call handed to the registered callback on
 * this thread, in the order CUPTI completed them; how many.  A buffer walked for another
 * collector's store (one registered since) is freed unread. */
static PyObject *py_hand_over(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    if (owner_pid != getpid())
        return PyLong_FromLong(0); /* a forked child: the queue is its parent's */
    pthread_mutex_lock(&lock);
    waiting_buffer *w = closed ? NULL : waiting_head;
    if (w != NULL) {
        waiting_head = waiting_tail = NULL;
        waiting_count = waiting_bytes = 0;
    }
    const unsigned long generation = store_generation;
    PyObject *callback = on_buffer, *names = (PyObject *)store;
    Py_XINCREF(callback);
    Py_XINCREF(names);
    pthread_mutex_unlock(&lock);
    long handed = 0, errors = 0, unread = 0;
    while (w != NULL) {
        waiting_buffer *next = w->next;
        w->next = NULL;
        if (callback == NULL || names == NULL || w->generation != generation)
            unread++;
        else if (hand(callback, names, w))
            errors++;
        else
            handed++;
        free_waiting(w);
        w = next;
    }
    Py_XDECREF(callback);
    Py_XDECREF(names);
    if (errors || unread) {
        pthread_mutex_lock(&lock);
        counts.errors += errors;
        counts.unread += unread;
        pthread_mutex_unlock(&lock);
    }
    return PyLong_FromLong(handed);
}

/* waiting(): buffers walked and not yet handed over. */
static PyObject *py_waiting(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    pthread_mutex_lock(&lock);
    size_t n = waiting_count;
    pthread_mutex_unlock(&lock);
    return PyLong_FromSize_t(n);
}

/* -- the module's functions --------------------------------------------------------------- */
static void *need(const char *name, PyObject **missing)
{
    void *f = dlsym(lib.handle, name);
    if (f == NULL && *missing == NULL)
        *missing = PyUnicode_FromString(name);
    return f;
}

/* Return CUPTI's result of `call`, made without the GIL, as a Python int. */
#define RESULT_WITHOUT_GIL(call)                                                               \
    do {                                                                                       \
        CUptiResult result_;                                                                   \
        Py_BEGIN_ALLOW_THREADS result_ = (call);                                               \
        Py_END_ALLOW_THREADS return PyLong_FromLong((long)result_);                            \
    } while (0)

static PyObject *py_load(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *path = PyUnicode_AsUTF8(arg);
    if (path == NULL)
        return NULL;
    if (lib.handle != NULL) {
        if (strcmp(lib.path, path) == 0)
            Py_RETURN_NONE;
        if (!closed)
            return PyUnicode_FromFormat("another libcupti is in use (%s)", lib.path);
        dlclose(lib.handle); /* no collector runs on it: another is asked for */
        free(lib.path);
        memset(&lib, 0, sizeof(lib));
    }
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        const char *why = dlerror();
        return PyUnicode_FromString(why ? why : "dlopen failed");
    }
    lib.handle = handle;
    lib.path = strdup(path);
    PyObject *missing = NULL;
    lib.register_callbacks = (register_fn)need("cuptiActivityRegisterCallbacks", &missing);
    lib.enable = (kind_fn)need("cuptiActivityEnable", &missing);
    lib.disable = (kind_fn)need("cuptiActivityDisable", &missing);
    lib.flush_all = (flag_fn)need("cuptiActivityFlushAll", &missing);
    lib.next_record = (next_fn)need("cuptiActivityGetNextRecord", &missing);
    lib.timestamp = (timestamp_fn)need("cuptiGetTimestamp", &missing);
    lib.enable_runtime = (api_switch_fn)dlsym(handle, "cuptiActivityEnableRuntimeApi");
    lib.enable_driver = (api_switch_fn)dlsym(handle, "cuptiActivityEnableDriverApi");
    lib.flush_period = (flag_fn)dlsym(handle, "cuptiActivityFlushPeriod");
    lib.dropped = (dropped_fn)dlsym(handle, "cuptiActivityGetNumDroppedRecords");
    lib.thread_type = (thread_type_fn)dlsym(handle, "cuptiSetThreadIdType");
    lib.result_string = (result_string_fn)dlsym(handle, "cuptiGetResultString");
    if (lib.path == NULL && missing == NULL)
        missing = PyUnicode_FromString("memory for its path");
    if (missing != NULL) {
        PyObject *why = PyUnicode_FromFormat("%s has no %U", path, missing);
        Py_DECREF(missing);
        dlclose(handle);
        free(lib.path);
        memset(&lib, 0, sizeof(lib));
        return why;
    }
    Py_RETURN_NONE;
}

/* A new collector starts afresh: no calls, names or counts of an earlier one (under lock,
 * the GIL held); `fresh` becomes the current store, the earlier one is returned (its
 * reference: let go of it after the lock). */
static NameStore *reset(NameStore *fresh)
{
    free(api_table);
    free(waiting);
    api_table = NULL;
    waiting = NULL;
    NameStore *earlier = store;
    store = fresh;
    store_generation++;
    memset(name_cache, 0, sizeof(name_cache));
    memset(&counts, 0, sizeof(counts));
    __atomic_store_n(&walked_records, 0, __ATOMIC_RELEASE);
    return earlier;
}

#define NEED_LIB()                                                                  \
    do {                                                                            \
        if (lib.handle == NULL) {                                                   \
            PyErr_SetString(PyExc_RuntimeError, "libcupti is not loaded");          \
            return NULL;                                                            \
        }                                                                           \
    } while (0)

static PyObject *py_register(PyObject *self, PyObject *args)
{
    (void)self;
    Py_ssize_t bytes, waiting_limit;
    PyObject *callback;
    if (!PyArg_ParseTuple(args, "nOn:register", &bytes, &callback, &waiting_limit))
        return NULL;
    NEED_LIB();
    if (bytes < 4096 || !PyCallable_Check(callback) || waiting_limit < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "register(bytes >= 4096, callable, waiting_bytes >= 0)");
        return NULL;
    }
    NameStore *fresh = name_store_new();
    if (fresh == NULL)
        return NULL;
    pthread_mutex_lock(&lock);
    NameStore *earlier = reset(fresh);
    waiting_buffer *left = waiting_head; /* an earlier collector's, never handed over */
    waiting_head = waiting_tail = NULL;
    waiting_count = waiting_bytes = 0;
    api_table = calloc(API_SLOTS, sizeof(api_slot));
    waiting = calloc(WAIT_SLOTS, sizeof(uint32_t));
    int ok = api_table != NULL && waiting != NULL;
    buffer_bytes = (size_t)bytes;
    max_waiting_bytes = (size_t)waiting_limit;
    pthread_mutex_unlock(&lock);
    free_waiting(left);
    Py_XDECREF(earlier); /* kept alive by a name table that still needs its texts */
    if (!ok)
        return PyErr_NoMemory();
    Py_INCREF(callback);
    Py_XSETREF(on_buffer, callback);
    owner_pid = getpid();
    closed = 0;
    RESULT_WITHOUT_GIL(lib.register_callbacks(buffer_requested, buffer_completed));
}

static PyObject *kind_call(kind_fn f, PyObject *arg)
{
    long kind = PyLong_AsLong(arg);
    if (kind == -1 && PyErr_Occurred())
        return NULL;
    NEED_LIB();
    RESULT_WITHOUT_GIL(f((CUpti_ActivityKind)kind));
}

static PyObject *py_enable(PyObject *self, PyObject *arg)
{
    (void)self;
    return kind_call(lib.enable, arg);
}

static PyObject *py_disable(PyObject *self, PyObject *arg)
{
    (void)self;
    return kind_call(lib.disable, arg);
}

/* enable_api(domain, cbid, on): CUPTI's per-call switch; -1 when this libcupti has none. */
static PyObject *py_enable_api(PyObject *self, PyObject *args)
{
    (void)self;
    int domain, on;
    unsigned int cbid;
    if (!PyArg_ParseTuple(args, "iIp:enable_api", &domain, &cbid, &on))
        return NULL;
    NEED_LIB();
    api_switch_fn f = domain == DOMAIN_RUNTIME ? lib.enable_runtime : lib.enable_driver;
    if (f == NULL)
        return PyLong_FromLong(-1);
    RESULT_WITHOUT_GIL(f((CUpti_CallbackId)cbid, (uint8_t)on));
}

static PyObject *py_system_thread_ids(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    NEED_LIB();
    if (lib.thread_type == NULL)
        return PyLong_FromLong(-1);
    return PyLong_FromLong((long)lib.thread_type(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM));
}

/* `arg` as the unsigned 32-bit argument of a libcupti call: 0, or -1 with the error set (not
 * such an integer, or libcupti not loaded). */
static int lib_u32_arg(PyObject *arg, uint32_t *out)
{
    unsigned long value = PyLong_AsUnsignedLong(arg);
    if (PyErr_Occurred())
        return -1;
    if (lib.handle == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "libcupti is not loaded");
        return -1;
    }
    *out = (uint32_t)value;
    return 0;
}

static PyObject *py_flush_period(PyObject *self, PyObject *arg)
{
    (void)self;
    uint32_t ms;
    if (lib_u32_arg(arg, &ms))
        return NULL;
    if (lib.flush_period == NULL)
        return PyLong_FromLong(-1);
    return PyLong_FromLong((long)lib.flush_period(ms));
}

/* flush_all(flag): CUPTI calls back (perhaps on this thread) before it returns. */
static PyObject *py_flush_all(PyObject *self, PyObject *arg)
{
    (void)self;
    uint32_t flag;
    if (lib_u32_arg(arg, &flag))
        return NULL;
    RESULT_WITHOUT_GIL(lib.flush_all(flag));
}

/* timestamp(): CUPTI's clock in ns (raises RuntimeError with CUPTI's code). */
static PyObject *py_timestamp(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    NEED_LIB();
    uint64_t ts = 0;
    CUptiResult r = lib.timestamp(&ts);
    if (r != CUPTI_SUCCESS) {
        PyErr_Format(PyExc_RuntimeError, "cuptiGetTimestamp failed (%d)", (int)r);
        return NULL;
    }
    return PyLong_FromUnsignedLongLong((unsigned long long)ts);
}

static PyObject *py_result_string(PyObject *self, PyObject *arg)
{
    (void)self;
    long code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    const char *text = NULL;
    if (lib.result_string == NULL || lib.result_string((CUptiResult)code, &text) != CUPTI_SUCCESS
        || text == NULL)
        return PyUnicode_FromFormat("CUPTI error %ld", code);
    return PyUnicode_FromString(text);
}

/* close(): buffers completed from now on, and those waiting, are freed unread (counted); the
 * callback is let go.  A forked child leaves the queue (its parent's) alone. */
static PyObject *py_close(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    closed = 1;
    if (owner_pid == getpid()) {
        pthread_mutex_lock(&lock);
        waiting_buffer *w = waiting_head;
        counts.unread += (long long)waiting_count;
        waiting_head = waiting_tail = NULL;
        waiting_count = waiting_bytes = 0;
        pthread_mutex_unlock(&lock);
        free_waiting(w);
    }
    Py_CLEAR(on_buffer);
    Py_RETURN_NONE;
}

static PyObject *py_counts(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    pthread_mutex_lock(&lock);
    PyObject *d = Py_BuildValue(
        "{sLsLsLsLsLsLsLsLsLsn}", "buffers", counts.buffers, "records", counts.records, "ops",
        counts.ops, "api_handed", counts.api_handed, "incomplete", counts.incomplete,
        "dropped_records", counts.dropped, "errors", counts.errors, "unread", counts.unread,
        "overflow", counts.overflow, "names", (Py_ssize_t)(store != NULL ? store->n : 0));
    pthread_mutex_unlock(&lock);
    return d;
}

/* count_values(): (buffers, records, ops, api_handed, incomplete, dropped_records, errors,
 * overflow), what counts() says, as a tuple (no dict built). */
static PyObject *py_count_values(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    pthread_mutex_lock(&lock);
    PyObject *t = Py_BuildValue("(LLLLLLLL)", counts.buffers, counts.records, counts.ops,
                                counts.api_handed, counts.incomplete, counts.dropped,
                                counts.errors, counts.overflow);
    pthread_mutex_unlock(&lock);
    return t;
}

/* walked(): the records read so far, without waiting for a walk in progress (no lock). */
static PyObject *py_walked(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return PyLong_FromLongLong(__atomic_load_n(&walked_records, __ATOMIC_ACQUIRE));
}

/* A table entry: the function py_<name> (cupti_locate.c adds its own: cupti_locate_ready). */
#define METHOD(name, flags, doc) {#name, py_##name, flags, doc}

static PyMethodDef methods[] = {
    METHOD(walked, METH_NOARGS, "Records read so far (no lock taken)."),
    METHOD(load, METH_O, "load(path): dlopen libcupti; None, or why not (str)."),
    METHOD(register, METH_VARARGS,
     "register(buffer_bytes, on_buffer, waiting_bytes): this module's buffer callbacks, the\n"
     "walked tables' bytes that may wait for hand_over; CUPTI's result."),
    METHOD(enable, METH_O, "enable(kind): cuptiActivityEnable's result."),
    METHOD(disable, METH_O, "disable(kind): cuptiActivityDisable's result."),
    METHOD(enable_api, METH_VARARGS,
     "enable_api(domain, cbid, on): runtime (0) or driver (1) call switch; -1: none."),
    METHOD(system_thread_ids, METH_NOARGS,
     "cuptiSetThreadIdType(SYSTEM)'s result; -1: no such function."),
    METHOD(flush_period, METH_O, "flush_period(ms): CUPTI's result; -1: none."),
    METHOD(flush_all, METH_O, "flush_all(flag): CUPTI's result (GIL released)."),
    METHOD(timestamp, METH_NOARGS, "CUPTI's clock (ns)."),
    METHOD(result_string, METH_O, "CUPTI's name of a result code."),
    METHOD(close, METH_NOARGS, "Completed buffers are freed unread from now on."),
    METHOD(hand_over, METH_NOARGS,
     "The buffers walked since the last call to the callback, on this thread; how many."),
    METHOD(waiting, METH_NOARGS, "Buffers walked and not yet handed over."),
    METHOD(counts, METH_NOARGS, "What the buffer callbacks saw (a dict)."),
    METHOD(count_values, METH_NOARGS, "counts() but names and unread, as a tuple."),
    {"timeline_place", cupti_timeline_place, METH_VARARGS, "A chunk of a GPU timeline placed."},
    {"timeline_sort", cupti_timeline_sort, METH_VARARGS, "A GPU timeline's rows sorted."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cupti",
                                    "CUPTI's activity buffers read in C.", -1, methods,
                                    NULL, NULL, NULL, NULL};

static PyObject *names_tuple(const char *const *items, int n)
{
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t != NULL && i < n; i++) {
        PyObject *s = PyUnicode_FromString(items[i]);
        if (s == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

/* The callback ids of the calls the agent turns off, by CUPTI's names. */
#define RT(n) {#n, CUPTI_RUNTIME_TRACE_CBID_##n}
#define DRV(n) {#n, CUPTI_DRIVER_TRACE_CBID_##n}
static const struct { const char *name; int cbid; } RUNTIME_IDS[] = {
    RT(cudaGetDevice_v3020), RT(cudaSetDevice_v3020), RT(cudaGetLastError_v3020),
    RT(cudaPeekAtLastError_v3020), RT(cudaStreamIsCapturing_v10000),
    RT(cudaDeviceGetAttribute_v5000)};
static const struct { const char *name; int cbid; } DRIVER_IDS[] = {
    DRV(cuGetProcAddress_v2), DRV(cuStreamGetCaptureInfo_v2), DRV(cuDeviceGetAttribute),
    DRV(cuCtxGetCurrent)};

/* The calls that put work on a stream, by callback id (the build reads them from the cbid
 * headers: hotpath/build.py's LAUNCH_CALLS), each list ended by -1. */
#ifndef LAUNCH_RUNTIME_CBIDS
#define LAUNCH_RUNTIME_CBIDS
#endif
#ifndef LAUNCH_DRIVER_CBIDS
#define LAUNCH_DRIVER_CBIDS
#endif
static const int RUNTIME_LAUNCHES[] = {LAUNCH_RUNTIME_CBIDS -1};
static const int DRIVER_LAUNCHES[] = {LAUNCH_DRIVER_CBIDS -1};

/* A -1-ended list as a tuple of ints, or NULL. */
static PyObject *ids_tuple(const int *ids)
{
    Py_ssize_t n = 0;
    while (ids[n] >= 0)
        n++;
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t i = 0; t != NULL && i < n; i++) {
        PyObject *v = PyLong_FromLong(ids[i]);
        if (v == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

PyMODINIT_FUNC PyInit__cupti(void)
{
    if (PyType_Ready(&BlockType) < 0 || PyType_Ready(&NameStoreType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject *rt = PyDict_New(), *drv = PyDict_New();
    for (size_t i = 0; rt != NULL && i < sizeof(RUNTIME_IDS) / sizeof(RUNTIME_IDS[0]); i++) {
        PyObject *v = PyLong_FromLong(RUNTIME_IDS[i].cbid);
        if (v == NULL || PyDict_SetItemString(rt, RUNTIME_IDS[i].name, v) < 0)
            Py_CLEAR(rt);
        Py_XDECREF(v);
    }
    for (size_t i = 0; drv != NULL && i < sizeof(DRIVER_IDS) / sizeof(DRIVER_IDS[0]); i++) {
        PyObject *v = PyLong_FromLong(DRIVER_IDS[i].cbid);
        if (v == NULL || PyDict_SetItemString(drv, DRIVER_IDS[i].name, v) < 0)
            Py_CLEAR(drv);
        Py_XDECREF(v);
    }
    if (rt == NULL || drv == NULL || PyModule_AddObject(m, "RUNTIME_CBIDS", rt) < 0
        || PyModule_AddObject(m, "DRIVER_CBIDS", drv) < 0
        || PyModule_AddObject(m, "RUNTIME_LAUNCH_CBIDS", ids_tuple(RUNTIME_LAUNCHES)) < 0
        || PyModule_AddObject(m, "DRIVER_LAUNCH_CBIDS", ids_tuple(DRIVER_LAUNCHES)) < 0
        || PyModule_AddObject(m, "OP_COLUMNS", names_tuple(OP_COLUMNS, OP_NCOLS)) < 0
        || PyModule_AddObject(m, "API_COLUMNS", names_tuple(API_COLUMNS, API_NCOLS)) < 0
        || cupti_locate_ready(m) < 0
        || PyModule_AddObject(m, "LOCATE_KINDS", cupti_locate_kinds()) < 0
        || PyModule_AddObject(m, "BLOCK_ROWS", cupti_block_rows()) < 0
        || PyModule_AddIntConstant(m, "API_SLOTS", API_SLOTS) < 0
        || PyModule_AddIntConstant(m, "CUPTI_API_VERSION", CUPTI_API_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
