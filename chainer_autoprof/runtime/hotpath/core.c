/*
 * core.c -- Core: a tracer's ranges (twin of core.py).
 *
 * begin/end on the per-thread range stack (the ThreadState's Python list of
 * (RangeInfo, t0) tuples, so that other threads and the Python code read it as
 * before), and the sinks' calls: each sink gets the ranges of the categories in its
 * mask (a bit test of the RangeInfo's category_index, read only when some sink has a
 * mask); a native sink kind runs in C (NVTX, the recorder), a sink written in Python
 * is called.  Thread state: a C cache of the thread asked last in front of the
 * thread's own dict.
 */

#include "native.h"

/* The sink kinds the core runs in C: a part of one of these types runs as that kind. */
static const native_sink_kind *const native_sink_kinds[] = {
    &nvtx_sink_kind,
    &record_sink_kind,
};

#define ALL_CATEGORIES UINT64_MAX

static uint64_t next_serial = 1;
static PyObject *str_open, *const_zero;

/* -- the sinks ------------------------------------------------------------------------- */

static sinks_t *sinks_alloc(Py_ssize_t n)
{
    sinks_t *s = PyMem_Calloc(1, sizeof(sinks_t) + (size_t)(n > 0 ? n - 1 : 0) * sizeof(sink_t));
    if (s != NULL)
        s->refs = 1;
    return s;
}

static inline void sinks_release(sinks_t *s)
{
    if (s == NULL || --s->refs > 0)
        return;
    for (Py_ssize_t i = 0; i < s->n; i++) {
        Py_XDECREF(s->items[i].part);
        Py_XDECREF(s->items[i].begin);
        Py_XDECREF(s->items[i].end);
    }
    PyMem_Free(s);
}

/* The category bit of `info` (a RangeInfo): what the sinks' masks are tested against. */
static inline uint64_t category_bit(Core *core, PyObject *info)
{
    PyObject *index = SLOT(info, core->off_category_index);
    int64_t value;
    if (index == NULL)
        return 0;
    value = int64_of(index);
    if (value < 0 || value >= 64) {
        PyErr_Clear();  /* not a category's number: no sink with a mask gets it */
        return 0;
    }
    return (uint64_t)1 << value;
}

/* -- this thread's state ----------------------------------------------------------------- */

PyObject *core_state_slow(Core *core, int create)
{
    PyThreadState *tstate = PyThreadState_Get();
    PyObject *dict = PyThreadState_GetDict();
    PyObject *ts;

    if (dict == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "no thread state dict");
        return NULL;
    }
    ts = PyDict_GetItemWithError(dict, core->key);
    if (ts == NULL) {
        if (PyErr_Occurred() || !create)
            return NULL;
        ts = PyObject_CallNoArgs(core->new_state);
        if (ts == NULL)
            return NULL;
        if (!Py_IS_TYPE(ts, core->state_type)) {
            Py_DECREF(ts);
            PyErr_SetString(PyExc_TypeError, "new_state() returned no ThreadState");
            return NULL;
        }
        /* new_state may have run for this thread already (nested through gc) */
        {
            PyObject *again = PyDict_GetItemWithError(dict, core->key);
            if (again != NULL) {
                Py_DECREF(ts);
                ts = again;
            } else if (PyErr_Occurred() || PyDict_SetItem(dict, core->key, ts) < 0) {
                Py_DECREF(ts);
                return NULL;
            } else {
                Py_DECREF(ts);  /* the dict holds it */
            }
        }
    }
    core->last_tstate = tstate;
    core->last_id = PyThreadState_GetID(tstate);
    Py_XSETREF(core->last_state, Py_NewRef(ts));  /* the old one may go: nothing of ours after */
    return ts;
}

static int core_window_closed(Core *core)
{
    PyObject *open;
    int is_open;

    if (core->window == Py_None)
        return 0;
    open = PyObject_GetAttr(core->window, str_open);
    if (open == NULL)
        return -1;
    is_open = PyObject_IsTrue(open);
    Py_DECREF(open);
    return is_open < 0 ? -1 : !is_open;
}

static inline int core_now(Core *core, int64_t *out)
{
    PyObject *t;
    int rc;
    if (!core->timed) {
        *out = 0;
        return 0;
    }
    if (core->clock == Py_None) {
        *out = now_ns();
        return 0;
    }
    t = PyObject_CallNoArgs(core->clock);
    if (t == NULL)
        return -1;
    rc = int64_from(t, out);
    Py_DECREF(t);
    return rc;
}

static int core_sync(Core *core)
{
    PyObject *r = PyObject_CallNoArgs(core->sync);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static int check_state(Core *core, PyObject *ts)
{
    if (!Py_IS_TYPE(ts, core->state_type)) {
        PyErr_SetString(PyExc_TypeError, "not a ThreadState of this tracer");
        return -1;
    }
    return 0;
}

/* -- begin and end ------------------------------------------------------------------------- */

/* A sink failed to begin `info` (sinks before `failed` began it): end it in those, and
 * forget it.  The caller gets the error (its hook turns off) and never ends this range. */
static void undo_begin(Core *core, sinks_t *sinks, Py_ssize_t failed, uint64_t bit,
                       PyObject *info, PyObject *ts)
{
    saved_error err;
    PyObject *stack, *top, *t0keep;
    Py_ssize_t j, n;

    save_error(&err);
    stack = SLOT(ts, core->off_stack);
    n = stack != NULL ? PyList_GET_SIZE(stack) : 0;
    if (n > 0 && PyTuple_GET_ITEM(PyList_GET_ITEM(stack, n - 1), 0) == info) {
        top = list_pop(stack);
        t0keep = Py_NewRef(PyTuple_GET_ITEM(top, 1));
        Py_DECREF(top);
        for (j = 0; j < failed; j++) {
            sink_t *b = &sinks->items[j];
            if (!(b->mask & bit))
                continue;
            if (b->kind != NULL) {
                if (b->kind->begin != NULL && b->kind->end(core, b->part, info, 0, 0, t0keep,
                                                           ts) < 0)
                    PyErr_Clear();  /* already failing: the first error counts */
            } else if (b->begin != NULL && b->end != NULL) {
                PyObject *e = call4(b->end, info, t0keep, t0keep, ts);
                if (e == NULL)
                    PyErr_Clear();
                Py_XDECREF(e);
            }
        }
        Py_DECREF(t0keep);
    }
    restore_error(&err);
}

PyObject *core_begin(Core *core, PyObject *info, PyObject *ts)
{
    PyObject *emit, *t0obj, *entry, *stack;
    sinks_t *sinks;
    uint64_t bit;
    int64_t t0;
    Py_ssize_t i;

    if (!Py_IS_TYPE(info, core->info_type)) {
        PyErr_SetString(PyExc_TypeError, "begin() takes a RangeInfo");
        return NULL;
    }
    emit = SLOT(info, core->off_emit);
    if (emit != Py_True && (emit == NULL || emit == Py_False || !PyObject_IsTrue(emit))) {
        if (emit != NULL && PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    if (core->window != Py_None) {
        int closed = core_window_closed(core);
        if (closed < 0)
            return NULL;
        if (closed)
            Py_RETURN_NONE;
    }
    if (ts == NULL) {
        ts = core_state(core);
        if (ts == NULL)
            return NULL;
    } else if (check_state(core, ts) < 0) {
        return NULL;
    }
    Py_INCREF(ts);
    if (SLOT(info, core->off_sync) == Py_True && core_sync(core) < 0)
        goto error;
    if (core_now(core, &t0) < 0)
        goto error;
    entry = t0 == 0 ? SLOT(info, core->off_stack_entry) : NULL;  /* untimed: (info, 0), built once */
    if (entry != NULL && PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == 2
        && PyTuple_GET_ITEM(entry, 0) == info) {
        Py_INCREF(entry);
    } else {
        t0obj = t0 == 0 ? Py_NewRef(const_zero) : PyLong_FromLongLong(t0);
        if (t0obj == NULL)
            goto error;
        entry = PyTuple_Pack(2, info, t0obj);  /* may run gc: nothing of ours is half done */
        Py_DECREF(t0obj);
        if (entry == NULL)
            goto error;
    }
    stack = SLOT(ts, core->off_stack);
    if (stack == NULL || !PyList_Check(stack)) {
        Py_DECREF(entry);
        PyErr_SetString(PyExc_TypeError, "ThreadState.stack is not a list");
        goto error;
    }
    if (PyList_Append(stack, entry) < 0) {
        Py_DECREF(entry);
        goto error;
    }
    Py_DECREF(entry);
    sinks = core->sinks;
    sinks->refs++;
    bit = sinks->masked ? category_bit(core, info) : ALL_CATEGORIES;
    for (i = 0; i < sinks->n; i++) {
        sink_t *s = &sinks->items[i];
        int rc = 0;
        if (!(s->mask & bit))
            continue;
        if (s->kind != NULL) {
            if (s->kind->begin != NULL)
                rc = s->kind->begin(core, s->part, info, ts);
        } else if (s->begin != NULL) {
            PyObject *r = call2(s->begin, info, ts);
            if (r == NULL)
                rc = -1;
            Py_XDECREF(r);
        }
        if (rc < 0) {
            undo_begin(core, sinks, i, bit, info, ts);
            sinks_release(sinks);
            goto error;
        }
    }
    sinks_release(sinks);
    Py_DECREF(ts);
    return Py_NewRef(info);
error:
    Py_DECREF(ts);
    return NULL;
}

int core_end(Core *core, PyObject *token, PyObject *ts)
{
    PyObject *stack, *top, *info, *t0obj, *t1obj = NULL;
    Py_ssize_t n, i;
    int64_t t0, t1;
    uint64_t bit;
    int rc = -1, ours;
    sinks_t *sinks = NULL;

    if (token == Py_None)
        return 0;
    if (ts == NULL) {
        ts = core_state(core);
        if (ts == NULL)
            return -1;
    } else if (check_state(core, ts) < 0) {
        return -1;
    }
    stack = SLOT(ts, core->off_stack);
    if (stack == NULL || !PyList_Check(stack))
        return 0;
    n = PyList_GET_SIZE(stack);
    if (n == 0 || PyTuple_GET_ITEM(PyList_GET_ITEM(stack, n - 1), 0) != token)
        return 0;  /* opened before a fork or a reset: nothing of ours to close */
    Py_INCREF(ts);
    if (Py_IS_TYPE(token, core->info_type) && SLOT(token, core->off_sync) == Py_True) {
        if (core_sync(core) < 0)
            goto done;
        stack = SLOT(ts, core->off_stack);
        n = PyList_GET_SIZE(stack);
        if (n == 0)
            goto ok;
    }
    top = list_pop(stack);  /* our reference now */
    info = PyTuple_GET_ITEM(top, 0);
    t0obj = PyTuple_GET_ITEM(top, 1);
    t0 = t0obj == const_zero ? 0 : int64_of(t0obj);
    if (core_now(core, &t1) < 0) {
        Py_DECREF(top);
        goto done;
    }
    ours = Py_IS_TYPE(info, core->info_type);  /* the native sinks read its slots */
    sinks = core->sinks;
    sinks->refs++;
    bit = !sinks->masked ? ALL_CATEGORIES : ours ? category_bit(core, info) : 0;
    for (i = 0; i < sinks->n; i++) {
        sink_t *s = &sinks->items[i];
        if (!(s->mask & bit))
            continue;
        if (s->kind != NULL) {
            if (ours && s->kind->end(core, s->part, info, t0, t1, t0obj, ts) < 0) {
                Py_DECREF(top);
                goto done;
            }
        } else if (s->end != NULL) {
            PyObject *r;
            if (t1obj == NULL) {
                t1obj = t1 == 0 ? Py_NewRef(const_zero) : PyLong_FromLongLong(t1);
                if (t1obj == NULL) {
                    Py_DECREF(top);
                    goto done;
                }
            }
            r = call4(s->end, info, t0obj, t1obj, ts);
            if (r == NULL) {
                Py_DECREF(top);
                goto done;
            }
            Py_DECREF(r);
        }
    }
    Py_DECREF(top);
ok:
    rc = 0;
done:
    sinks_release(sinks);
    Py_XDECREF(t1obj);
    Py_DECREF(ts);
    return rc;
}

/* -- the type -------------------------------------------------------------------------------- */

/* What a Core holds, beside its sinks (VISIT_FIELD, CLEAR_FIELD; its key and classes, held
 * for its whole life, are left out). */
#define CORE_OBJECTS(F) F(new_state) F(sync) F(window) F(clock) F(last_state)

static int core_traverse(Core *self, visitproc visit, void *arg)
{
    CORE_OBJECTS(VISIT_FIELD)
    if (self->sinks != NULL) {
        for (Py_ssize_t i = 0; i < self->sinks->n; i++) {
            Py_VISIT(self->sinks->items[i].part);
            Py_VISIT(self->sinks->items[i].begin);
            Py_VISIT(self->sinks->items[i].end);
        }
    }
    return 0;
}

static void core_drop_sinks(Core *self)
{
    sinks_t *sinks = self->sinks;
    self->sinks = NULL;
    sinks_release(sinks);
}

static int core_clear(Core *self)
{
    self->last_tstate = NULL;  /* first: last_state is no thread's from here on */
    CORE_OBJECTS(CLEAR_FIELD)
    core_drop_sinks(self);
    return 0;
}

static void core_dealloc(Core *self)
{
    PyObject_GC_UnTrack(self);
    core_clear(self);
    Py_XDECREF(self->key);
    Py_XDECREF((PyObject *)self->state_type);
    Py_XDECREF((PyObject *)self->info_type);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *core_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *names[] = {"state_cls", "info_cls", "new_state", "sync", "window", "clock",
                            NULL};
    PyObject *state_cls, *info_cls, *new_state, *sync, *window = Py_None, *clock = Py_None;
    Core *self;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O!OO|OO", names, &PyType_Type, &state_cls,
                                     &PyType_Type, &info_cls, &new_state, &sync, &window,
                                     &clock))
        return NULL;
    self = (Core *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->state_type = (PyTypeObject *)Py_NewRef(state_cls);
    self->info_type = (PyTypeObject *)Py_NewRef(info_cls);
    self->new_state = Py_NewRef(new_state);
    self->sync = Py_NewRef(sync);
    self->window = Py_NewRef(window);
    self->clock = Py_NewRef(clock);
    self->serial = next_serial++;
    self->sinks = sinks_alloc(0);
    if (self->sinks == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->key = PyUnicode_FromFormat("chainer_autoprof.core.%llu",
                                     (unsigned long long)self->serial);
    if (self->key == NULL
        || slot_offsets(self->state_type, "stack", &self->off_stack, "record", &self->off_record,
                        "links", &self->off_links, "quiet", &self->off_quiet,
                        "phase", &self->off_phase, "bwd_link", &self->off_bwd_link,
                        "bwd_link_tok", &self->off_bwd_link_tok, NULL) < 0
        || slot_offsets(self->info_type, "emit", &self->off_emit, "sync", &self->off_sync,
                        "index", &self->off_index, "nvtx", &self->off_nvtx,
                        "stack_entry", &self->off_stack_entry,
                        "category_index", &self->off_category_index, NULL) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyObject *core_state_py(Core *self, PyObject *Py_UNUSED(unused))
{
    return Py_XNewRef(core_state(self));
}

static PyObject *core_current_py(Core *self, PyObject *Py_UNUSED(unused))
{
    PyObject *ts = core_state_slow(self, 0);
    if (ts == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    return Py_NewRef(ts);
}

static PyObject *core_forget_py(Core *self, PyObject *Py_UNUSED(unused))
{
    /* the thread's dict as it is: none in a thread's teardown, and none is made for us */
    PyObject *dict = PyThreadState_Get()->dict;
    self->last_tstate = NULL;
    Py_CLEAR(self->last_state);
    if (dict != NULL && PyDict_GetItemWithError(dict, self->key) != NULL) {
        if (PyDict_DelItem(dict, self->key) < 0)
            return NULL;
    }
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* The `ts` of begin(info, ts=None) / end(token, ts=None): NULL for this thread's; -1 with a
 * TypeError naming `usage` for other arguments. */
static int thread_state_arg(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                            const char *usage, PyObject **ts)
{
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    *ts = NULL;
    if (nargs + nkw == 2 && nargs >= 1
        && (nkw == 0 || (PyUnicode_Check(PyTuple_GET_ITEM(kwnames, 0))
                         && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0),
                                                             "ts") == 0))) {
        *ts = args[1] == Py_None ? NULL : args[1];
        return 0;
    }
    if (nargs == 1 && nkw == 0)
        return 0;
    PyErr_SetString(PyExc_TypeError, usage);
    return -1;
}

static PyObject *core_begin_py(Core *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    PyObject *ts;
    if (thread_state_arg(args, nargs, kwnames, "begin(info, ts=None)", &ts) < 0)
        return NULL;
    return core_begin(self, args[0], ts);
}

static PyObject *core_end_py(Core *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames)
{
    PyObject *ts;
    if (thread_state_arg(args, nargs, kwnames, "end(token, ts=None)", &ts) < 0
        || core_end(self, args[0], ts) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* The kind `part` runs as (NULL with a ValueError: a part of no kind known here). */
static const native_sink_kind *kind_of(PyObject *part)
{
    for (size_t k = 0; k < sizeof(native_sink_kinds) / sizeof(native_sink_kinds[0]); k++)
        if (Py_IS_TYPE(part, native_sink_kinds[k]->type))
            return native_sink_kinds[k];
    PyErr_Format(PyExc_ValueError, "no native sink kind runs a %s", Py_TYPE(part)->tp_name);
    return NULL;
}

/* set_sinks(entries, timed): each entry (native part or None, begin or None, end or None,
 * category mask), in the order the sinks were added. */
static PyObject *core_set_sinks(Core *self, PyObject *args)
{
    PyObject *entries, *seq;
    int timed;
    Py_ssize_t n, i;
    sinks_t *sinks, *old;

    if (!PyArg_ParseTuple(args, "Op", &entries, &timed))
        return NULL;
    seq = PySequence_Fast(entries, "set_sinks() takes a sequence");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    sinks = sinks_alloc(n);
    if (sinks == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    sinks->n = n;
    for (i = 0; i < n; i++) {
        PyObject *entry = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *part, *begin, *end, *mask;
        sink_t *s = &sinks->items[i];
        if (!PyArg_ParseTuple(entry, "OOOO!", &part, &begin, &end, &PyLong_Type, &mask))
            goto error;
        s->mask = (uint64_t)PyLong_AsUnsignedLongLongMask(mask);
        if (s->mask == (uint64_t)-1 && PyErr_Occurred())
            goto error;
        if (s->mask != ALL_CATEGORIES)
            sinks->masked = 1;
        if (part != Py_None) {
            s->kind = kind_of(part);
            if (s->kind == NULL)
                goto error;
            s->part = Py_NewRef(part);
        }
        s->begin = begin != Py_None ? Py_NewRef(begin) : NULL;
        s->end = end != Py_None ? Py_NewRef(end) : NULL;
    }
    Py_DECREF(seq);
    old = self->sinks;
    self->sinks = sinks;
    self->timed = timed;
    sinks_release(old);
    Py_RETURN_NONE;
error:
    sinks_release(sinks);
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef core_methods[] = {
    {"state", (PyCFunction)core_state_py, METH_NOARGS,
     "This thread's ThreadState (created on first use)."},
    {"current", (PyCFunction)core_current_py, METH_NOARGS,
     "This thread's ThreadState, or None (never created)."},
    {"forget", (PyCFunction)core_forget_py, METH_NOARGS,
     "Drop this thread's ThreadState from the core."},
    {"begin", (PyCFunction)(void (*)(void))core_begin_py, METH_FASTCALL | METH_KEYWORDS,
     "begin(info, ts=None) -> token: open info on this thread."},
    {"end", (PyCFunction)(void (*)(void))core_end_py, METH_FASTCALL | METH_KEYWORDS,
     "end(token, ts=None): close the range begun with token."},
    {"set_sinks", (PyCFunction)core_set_sinks, METH_VARARGS,
     "set_sinks(entries, timed): the sinks, in order: (native, begin, end, mask) each."},
    {NULL}
};

PyTypeObject CoreType = {
    NATIVE_GC_TYPE_HEAD("Core", Core, core_new, core_dealloc, core_traverse, core_clear, 0),
    .tp_doc = "Core(state_cls, info_cls, new_state, sync, window=None, clock=None): "
              "a tracer's ranges.",
    .tp_methods = core_methods,
};

int core_ready(PyObject *module)
{
    const_zero = PyLong_FromLong(0);
    if (const_zero == NULL || intern_strings(&str_open, "open", NULL) < 0)
        return -1;
    return add_types(module, &CoreType, NULL);
}
