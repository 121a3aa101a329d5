/*
 * native.h -- what the C files of the native hot path share.
 *
 * The extension `_native` is the twin of python.py (the protocol: protocol.py),
 * one C file per concern, each beside its Python twin:
 *
 *   module.c       the module: its types and functions, PROTOCOL
 *   util.c         calls, our own errors contained, slots of Python classes, the
 *                  objects a type holds, its types added to the module
 *   core.c         Core: a tracer's ranges (the per-thread stack, the sinks' calls
 *                  under their category masks) -- core.py
 *   nvtx_domain.c  NvtxDomain: an NVTX domain, prebuilt attributes; the NVTX sink run
 *                  by the core -- nvtx_domain.py
 *   record.c       RecordBuffer, RecorderHook: the recorder's per-thread rows; the
 *                  recorder sink run by the core -- record.py
 *   wrappers.c     Switch, Wrapper: what replaces a patched function (around, link,
 *                  apply, backprop) -- wrappers.py
 *   term_guard.c   SIGTERM at the default action: the agent's end, the kill never held
 *                  up (lifecycle/exit.py; no Python twin: without it, no guard)
 *
 * A sink the core runs in C is a *native sink kind* (native_sink_kind below): its
 * part's type and its begin/end in C.  core.c lists the kinds; a new one is a C file
 * with its type and kind, and one line there (the wrappers only ever call the core).
 *
 * Reentrancy: any allocation may run Python code (gc callbacks, weakref callbacks,
 * __del__) that begins and ends ranges on this same thread.  Every state change is
 * made in one step after the allocations it needs, so that a nested begin/end in
 * between finds a consistent state and stays balanced.
 *
 * Objects of the Python side (ThreadState, RangeInfo, LinkEntry) keep their Python
 * classes; their __slots__ are read at the offsets their member descriptors give
 * (found by name when a Core or Wrapper is built, and each object's type is checked
 * before it is read).
 */

#ifndef CHAINER_AUTOPROF_NATIVE_H
#define CHAINER_AUTOPROF_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <time.h>

#ifndef CHAINER_AUTOPROF_PROTOCOL
#error "CHAINER_AUTOPROF_PROTOCOL is given by build.py (from protocol.py): build with it"
#endif

/* -- compatibility (Python 3.8 to 3.11) -------------------------------------------- */

#if PY_VERSION_HEX < 0x03090000
#define PyObject_Vectorcall _PyObject_Vectorcall
#define Py_TPFLAGS_HAVE_VECTORCALL _Py_TPFLAGS_HAVE_VECTORCALL
#define PyObject_CallNoArgs(f) PyObject_CallObject((f), NULL)
#endif
#ifndef Py_IS_TYPE
#define Py_IS_TYPE(ob, type) (Py_TYPE(ob) == (type))
#endif
#if PY_VERSION_HEX < 0x03090000
static inline uint64_t PyThreadState_GetID(PyThreadState *tstate) { return tstate->id; }
#endif
#ifndef Py_SET_SIZE
#define Py_SET_SIZE(ob, size) (Py_SIZE(ob) = (size))
#endif
#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *Py_NewRef(PyObject *o) { Py_INCREF(o); return o; }
static inline PyObject *Py_XNewRef(PyObject *o) { Py_XINCREF(o); return o; }
#endif

/* Everything declared from here on stays inside the extension (direct calls, no PLT). */
#pragma GCC visibility push(hidden)

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))
/* The wrappers' bodies stay functions of their own (profiles show each). */
#define NOINLINE __attribute__((noinline))
/* A step of theirs written once, inlined into each (as if written out there). */
#define ALWAYS_INLINE inline __attribute__((always_inline))

static inline PyObject *call1(PyObject *f, PyObject *a)
{
    PyObject *args[1] = {a};
    return PyObject_Vectorcall(f, args, 1, NULL);
}

static inline PyObject *call2(PyObject *f, PyObject *a, PyObject *b)
{
    PyObject *args[2] = {a, b};
    return PyObject_Vectorcall(f, args, 2, NULL);
}

static inline PyObject *call3(PyObject *f, PyObject *a, PyObject *b, PyObject *c)
{
    PyObject *args[3] = {a, b, c};
    return PyObject_Vectorcall(f, args, 3, NULL);
}

static inline PyObject *call4(PyObject *f, PyObject *a, PyObject *b, PyObject *c, PyObject *d)
{
    PyObject *args[4] = {a, b, c, d};
    return PyObject_Vectorcall(f, args, 4, NULL);
}

/* Pop the last item of a non-empty list; the caller owns the reference.  The list keeps
 * its allocation (no resize, no allocation: nothing can run in between). */
static inline PyObject *list_pop(PyObject *list)
{
    Py_ssize_t n = PyList_GET_SIZE(list);
    PyObject *item = PyList_GET_ITEM(list, n - 1);
    Py_SET_SIZE(list, n - 1);
    return item;
}

/* Replace the slot at `off` of `obj` by `value` (new reference taken), then drop the old one. */
static inline void slot_set(PyObject *obj, Py_ssize_t off, PyObject *value)
{
    PyObject *old = SLOT(obj, off);
    SLOT(obj, off) = Py_XNewRef(value);
    Py_XDECREF(old);
}

/* An int's value, quickly for the two-digit ints of nanosecond timestamps (CPython up to 3.11
 * stores ints as 30-bit digits with the sign in the size); -1 with an error otherwise. */
static inline int64_t int64_of(PyObject *o)
{
#if PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30
    if (PyLong_CheckExact(o)) {
        Py_ssize_t size = Py_SIZE(o);
        const digit *d = ((PyLongObject *)o)->ob_digit;
        if (size == 0)
            return 0;
        if (size == 1)
            return (int64_t)d[0];
        if (size == 2)
            return (int64_t)d[0] | ((int64_t)d[1] << PyLong_SHIFT);
    }
#endif
    return PyLong_AsLongLong(o);
}

/* `o` (an int) as an int64 in `out`: 0, or -1 with an error. */
static inline int int64_from(PyObject *o, int64_t *out)
{
    *out = int64_of(o);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static inline int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);  /* time.perf_counter_ns() on Linux */
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* -- util.c: slots, our own errors ---------------------------------------------------- */

/* The offsets of slots of `type` (writable object slots of a class with __slots__): pairs
 * (const char *name, Py_ssize_t *out), then NULL.  0, or -1 with a TypeError. */
int slot_offsets(PyTypeObject *type, ...) __attribute__((sentinel));

/* Interned strings: pairs (PyObject **out, const char *text), then NULL.  0, or -1. */
int intern_strings(PyObject **out, const char *text, ...) __attribute__((sentinel));

/* The object fields of `self` that a type's list names, its traverse visiting them and its
 * clear dropping them: the list is a macro, LIST(F) giving F(field) for each field, so that
 * the two never differ; it expands to the fields written out. */
#define VISIT_FIELD(field) Py_VISIT(self->field);
#define CLEAR_FIELD(field) Py_CLEAR(self->field);

/* The current exception (normalized; new reference), the error indicator cleared. */
PyObject *fetch_exception(void);

/* Contain our own error: an Exception goes to `fail` (the patch turns itself off); anything
 * else (KeyboardInterrupt, SystemExit) stays raised.  Returns 0 when contained. */
int contain(PyObject *fail);

/* Saved error state around our bookkeeping after the user's call raised. */
typedef struct {
    PyObject *type, *value, *tb;
} saved_error;

static inline void save_error(saved_error *s) { PyErr_Fetch(&s->type, &s->value, &s->tb); }
void restore_error(saved_error *s);

/* An error of our bookkeeping after the user's call: contained when it is an Exception;
 * else (KeyboardInterrupt in a callback of ours) kept in `ours`, raised instead of the
 * call's outcome. */
void after_call_error(PyObject *fail, saved_error *ours);

/* The call's outcome: `out` (or the user's saved error), unless ours must be raised. */
static inline PyObject *finish_call(PyObject *out, saved_error *user, saved_error *ours)
{
    if (ours->type != NULL) {
        Py_XDECREF(out);
        Py_XDECREF(user->type);
        Py_XDECREF(user->value);
        Py_XDECREF(user->tb);
        PyErr_Restore(ours->type, ours->value, ours->tb);
        return NULL;
    }
    if (out == NULL)
        PyErr_Restore(user->type, user->value, user->tb);
    return out;
}

/* -- core.c: a tracer's ranges ------------------------------------------------------- */

typedef struct Core Core;

/* A sink the core runs in C: its part's type, and what it does when a range of a category
 * in its mask begins and ends (`begin` NULL: nothing; it then is not undone either).
 * `t0obj` is the range's t0 as the stack held it.  0, or -1 with an error. */
typedef struct {
    PyTypeObject *type;
    int (*begin)(Core *core, PyObject *part, PyObject *info, PyObject *ts);
    int (*end)(Core *core, PyObject *part, PyObject *info, int64_t t0, int64_t t1,
               PyObject *t0obj, PyObject *ts);
} native_sink_kind;

/* One sink: run in C (`kind`, with its `part`), or called in Python (`begin`, `end`). */
typedef struct {
    uint64_t mask;                  /* the categories it wants: bit i, RangeInfo.category_index i */
    const native_sink_kind *kind;   /* NULL: a sink written in Python */
    PyObject *part;                 /* the native part (kind set) */
    PyObject *begin, *end;          /* the Python calls (or NULL) */
} sink_t;

/* The sinks, as a block shared by the ranges being begun or ended: set_sinks (a sink
 * added from inside a sink, such as the GPU timer) replaces the core's block, and the
 * block in use lives until its last user lets go, as a Python tuple being iterated would. */
typedef struct {
    Py_ssize_t refs;
    Py_ssize_t n;
    int masked;                     /* some sink wants only some categories */
    sink_t items[1];
} sinks_t;

struct Core {
    PyObject_HEAD
    uint64_t serial;          /* identifies this core in the thread-local cache */
    PyObject *key;            /* its key in each thread's dict */
    PyTypeObject *state_type, *info_type;
    /* ThreadState slots */
    Py_ssize_t off_stack, off_record, off_links, off_quiet, off_phase, off_bwd_link,
        off_bwd_link_tok;
    /* RangeInfo slots */
    Py_ssize_t off_emit, off_sync, off_index, off_nvtx, off_stack_entry, off_category_index;
    PyThreadState *last_tstate;  /* the thread asked last, and its ThreadState (strong: a */
    uint64_t last_id;            /*   thread's teardown clears its dict before its last */
    PyObject *last_state;        /*   calls; the id tells a later thread at that address) */
    PyObject *new_state;      /* () -> a new ThreadState for this thread, registered */
    PyObject *sync;           /* () -> None: synchronize the devices */
    PyObject *window;         /* None, or an object whose .open says whether to emit */
    PyObject *clock;          /* None: CLOCK_MONOTONIC; else a callable -> int ns */
    int timed;                /* a sink reads t0/t1 */
    sinks_t *sinks;
};

extern PyTypeObject CoreType;

PyObject *core_state_slow(Core *core, int create);

/* This thread's ThreadState (borrowed), created on first use. */
static inline PyObject *core_state(Core *core)
{
    PyThreadState *tstate = PyThreadState_Get();
    if (tstate == core->last_tstate && PyThreadState_GetID(tstate) == core->last_id)
        return core->last_state;
    return core_state_slow(core, 1);
}

/* Begin `info` on `ts` (borrowed; NULL: this thread's).  Returns the token (new reference:
 * info, or None when nothing was emitted), NULL on error. */
PyObject *core_begin(Core *core, PyObject *info, PyObject *ts);

/* End `token` on `ts` (borrowed; NULL: this thread's).  0, or -1 on error. */
int core_end(Core *core, PyObject *token, PyObject *ts);

/* -- each file's part of the module: its types (and functions) added to it ----------------- */

/* What each type object of the module begins with: its name there (under _native, where
 * add_types adds it), the struct of its objects, its flags, the functions that make one
 * (NULL: not made from Python) and free one (NULL: object's). */
#define NATIVE_TYPE_FIELDS(name, object, flags, new, dealloc)      \
    PyVarObject_HEAD_INIT(NULL, 0)                                 \
    .tp_name = "chainer_autoprof.runtime.hotpath._native." name,   \
    .tp_basicsize = sizeof(object),                                \
    .tp_flags = (flags),                                           \
    .tp_new = (new),                                               \
    .tp_dealloc = (destructor)(dealloc)

/* A type whose objects the garbage collector does not track (Py_TPFLAGS_DEFAULT). */
#define NATIVE_TYPE_HEAD(name, object, new, dealloc) \
    NATIVE_TYPE_FIELDS(name, object, Py_TPFLAGS_DEFAULT, new, dealloc)

/* A type whose objects it tracks (Py_TPFLAGS_HAVE_GC): with the functions that visit and
 * drop what one holds, and its flags beside those two. */
#define NATIVE_GC_TYPE_HEAD(name, object, new, dealloc, traverse, clear, flags)           \
    NATIVE_TYPE_FIELDS(name, object, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | (flags), new, \
                       dealloc),                                                          \
    .tp_traverse = (traverseproc)(traverse),                                              \
    .tp_clear = (inquiry)(clear)

/* Add types (PyTypeObject *, then NULL) to `module` after PyType_Ready, each by its name. */
int add_types(PyObject *module, ...) __attribute__((sentinel));

extern const native_sink_kind nvtx_sink_kind;
extern const native_sink_kind record_sink_kind;

int core_ready(PyObject *module);
int nvtx_ready(PyObject *module);
int record_ready(PyObject *module);
int wrappers_ready(PyObject *module);
int term_guard_ready(PyObject *module);  /* SIGTERM's guard: the lifecycle's, not the hot path's */

#pragma GCC visibility pop

#endif /* CHAINER_AUTOPROF_NATIVE_H */
