/*
 * _native.c -- the native implementation of chainer_autoprof's hot path.
 *
 * The twin of python.py in this directory: the same protocol, one per
 * implementation, chosen in __init__.py (select()).  What runs here on every
 * Link call, FunctionNode apply and backprop step, and on every range:
 *
 *   Core        a tracer's range begin/end: the per-thread range stack (the
 *               ThreadState's Python list of (RangeInfo, t0) tuples, so that
 *               other threads and the Python code read it as before), the
 *               NVTX push/pop with attributes built once, the recorder's
 *               append into a per-thread int64 buffer, sinks written in
 *               Python called as they come.  Thread state: a C thread-local
 *               cache in front of the thread's own dict.
 *   Wrapper     what replaces a patched function: a function-like callable
 *               with vectorcall that is a method descriptor (an instance's
 *               call reaches it unbound, and its __get__ returns a plain bound
 *               method, so bound methods pickle and deepcopy as usual),
 *               attribute reads forwarded to the original, pickled as the
 *               original's global name.  Kinds: "around" (Python enter/exit
 *               hooks called before and after the original, from C: no
 *               Python frame of ours is on the stack while the user's code
 *               runs), "link", "apply" and "backprop" (the hot targets,
 *               entirely in C, calling Python only for rare events).
 *   NvtxDomain  one NVTX domain: registered strings, categories, attributes.
 *   RecordBuffer, RecorderHook  the recorder's per-thread buffer and its
 *               per-range append.
 *
 * Reentrancy: any allocation may run Python code (gc callbacks, weakref
 * callbacks, __del__) that begins and ends ranges on this same thread.  Every
 * state change is made in one step after the allocations it needs, so that a
 * nested begin/end in between finds a consistent state and stays balanced.
 *
 * Objects of the Python side (ThreadState, RangeInfo, LinkEntry) keep their
 * Python classes; their __slots__ are read at the offsets their member
 * descriptors give (found by name when a Core or Wrapper is built, and each
 * object's type is checked before it is read).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <time.h>

#include <nvtx3/nvToolsExt.h>

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

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))
/* The wrappers' bodies stay functions of their own (profiles show each). */
#define NOINLINE __attribute__((noinline))

static PyObject *call1(PyObject *f, PyObject *a)
{
    PyObject *args[1] = {a};
    return PyObject_Vectorcall(f, args, 1, NULL);
}

static PyObject *call2(PyObject *f, PyObject *a, PyObject *b)
{
    PyObject *args[2] = {a, b};
    return PyObject_Vectorcall(f, args, 2, NULL);
}

static PyObject *call3(PyObject *f, PyObject *a, PyObject *b, PyObject *c)
{
    PyObject *args[3] = {a, b, c};
    return PyObject_Vectorcall(f, args, 3, NULL);
}

static PyObject *call4(PyObject *f, PyObject *a, PyObject *b, PyObject *c, PyObject *d)
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
static void slot_set(PyObject *obj, Py_ssize_t off, PyObject *value)
{
    PyObject *old = SLOT(obj, off);
    SLOT(obj, off) = Py_XNewRef(value);
    Py_XDECREF(old);
}

/* The offset of slot `name` of `type` (a writable object slot of a class with __slots__). */
static int slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *out)
{
    PyObject *key = PyUnicode_FromString(name);
    PyObject *descr;

    if (key == NULL)
        return -1;
    descr = _PyType_Lookup(type, key);
    Py_DECREF(key);
    if (descr == NULL || !PyObject_TypeCheck(descr, &PyMemberDescr_Type)
        || ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX
        || (((PyMemberDescrObject *)descr)->d_member->flags & READONLY)) {
        PyErr_Format(PyExc_TypeError, "%s has no writable slot %s", type->tp_name, name);
        return -1;
    }
    *out = ((PyMemberDescrObject *)descr)->d_member->offset;
    return 0;
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

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);  /* time.perf_counter_ns() on Linux */
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* The current exception (normalized; new reference), the error indicator cleared. */
static PyObject *fetch_exception(void)
{
    PyObject *type, *value, *tb;

    PyErr_Fetch(&type, &value, &tb);
    if (type == NULL)
        return NULL;
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
}

/* Contain our own error: an Exception goes to `fail` (the patch turns itself off); anything
 * else (KeyboardInterrupt, SystemExit) stays raised.  Returns 0 when contained. */
static int contain(PyObject *fail)
{
    PyObject *exc, *r;

    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    exc = fetch_exception();
    if (exc == NULL)
        return 0;
    if (fail != NULL && fail != Py_None) {
        r = call1(fail, exc);
        if (r == NULL)
            PyErr_WriteUnraisable(fail);
        Py_XDECREF(r);
    }
    Py_DECREF(exc);
    return 0;
}

/* Saved error state around our bookkeeping after the user's call raised. */
typedef struct {
    PyObject *type, *value, *tb;
} saved_error;

static void save_error(saved_error *s) { PyErr_Fetch(&s->type, &s->value, &s->tb); }

static void restore_error(saved_error *s)
{
    if (s->type == NULL)
        return;
    if (PyErr_Occurred())  /* cannot happen: what we did in between was contained */
        PyErr_WriteUnraisable(NULL);
    PyErr_Restore(s->type, s->value, s->tb);
    s->type = s->value = s->tb = NULL;
}

/* An error of our bookkeeping after the user's call: contained when it is an Exception;
 * else (KeyboardInterrupt in a callback of ours) kept in `ours`, raised instead of the
 * call's outcome. */
static void after_call_error(PyObject *fail, saved_error *ours)
{
    if (contain(fail) == 0)
        return;
    if (ours->type == NULL)
        save_error(ours);
    else
        PyErr_Clear();
}

/* The call's outcome: `out` (or the user's saved error), unless ours must be raised. */
static PyObject *finish_call(PyObject *out, saved_error *user, saved_error *ours)
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

/* ================================================================================= */
/* Switch: a patch's on/off state and hit count                                      */
/* ================================================================================= */

typedef struct {
    PyObject_HEAD
    int on;
    long long hits;
} Switch;

static PyTypeObject SwitchType;

static PyObject *switch_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    Switch *self = (Switch *)type->tp_alloc(type, 0);
    if (self != NULL)
        self->on = 1;
    return (PyObject *)self;
}

static PyObject *switch_get_on(Switch *self, void *c) { return PyBool_FromLong(self->on); }

static int switch_set_on(Switch *self, PyObject *v, void *c)
{
    int on = v == NULL ? 0 : PyObject_IsTrue(v);
    if (on < 0)
        return -1;
    self->on = on;
    return 0;
}

static PyObject *switch_get_hits(Switch *self, void *c) { return PyLong_FromLongLong(self->hits); }

static int switch_set_hits(Switch *self, PyObject *v, void *c)
{
    long long hits;
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete hits");
        return -1;
    }
    hits = PyLong_AsLongLong(v);
    if (hits == -1 && PyErr_Occurred())
        return -1;
    self->hits = hits;
    return 0;
}

static PyGetSetDef switch_getset[] = {
    {"on", (getter)switch_get_on, (setter)switch_set_on, "whether the hook runs", NULL},
    {"hits", (getter)switch_get_hits, (setter)switch_set_hits, "calls seen", NULL},
    {NULL}
};

static PyTypeObject SwitchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "chainer_autoprof.runtime.hotpath._native.Switch",
    .tp_basicsize = sizeof(Switch),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A patch's state: on (the hook runs) and hits (calls seen).",
    .tp_new = switch_new,
    .tp_getset = switch_getset,
};

/* ================================================================================= */
/* NVTX: a domain, its registered strings and categories, prebuilt attributes          */
/* ================================================================================= */

typedef struct {
    PyObject_HEAD
    nvtxDomainHandle_t domain;
    PyObject *strings;     /* str -> capsule-free int handle (registered string) */
    PyObject *categories;  /* str -> int id, numbered from 1 in order of first use */
    PyObject *name;
} NvtxDomain;

typedef struct {
    PyObject_HEAD
    nvtxEventAttributes_t attr;
    PyObject *message;  /* keeps the text alive for ASCII messages */
} NvtxAttr;

static PyTypeObject NvtxDomainType, NvtxAttrType;

static PyObject *nvtx_domain_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *names[] = {"name", NULL};
    const char *name;
    NvtxDomain *self;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "s", names, &name))
        return NULL;
    self = (NvtxDomain *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->strings = PyDict_New();
    self->categories = PyDict_New();
    self->name = PyUnicode_FromString(name);
    if (self->strings == NULL || self->categories == NULL || self->name == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    /* With no tool attached NVTX answers NULL: the domain is off. */
    self->domain = nvtxDomainCreateA(name);
    return (PyObject *)self;
}

static void nvtx_domain_dealloc(NvtxDomain *self)
{
    Py_XDECREF(self->strings);
    Py_XDECREF(self->categories);
    Py_XDECREF(self->name);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The registered string for `text` (registered on first use; with `keep` 0 registered
 * anew and not remembered: a name beyond the tracer's cap). */
static nvtxStringHandle_t nvtx_string(NvtxDomain *self, PyObject *text, int keep)
{
    PyObject *known = keep ? PyDict_GetItemWithError(self->strings, text) : NULL;
    const char *utf8;
    nvtxStringHandle_t handle;
    PyObject *value;

    if (known != NULL)
        return (nvtxStringHandle_t)PyLong_AsVoidPtr(known);
    if (PyErr_Occurred())
        return NULL;
    utf8 = PyUnicode_AsUTF8(text);
    if (utf8 == NULL)
        return NULL;
    handle = nvtxDomainRegisterStringA(self->domain, utf8);
    if (!keep)
        return handle;
    value = PyLong_FromVoidPtr((void *)handle);
    if (value == NULL || PyDict_SetItem(self->strings, text, value) < 0) {
        Py_XDECREF(value);
        return NULL;
    }
    Py_DECREF(value);
    return handle;
}

/* The id of category `name`, named in the domain on first use (ids from 1). */
static int nvtx_category(NvtxDomain *self, PyObject *name, uint32_t *out)
{
    PyObject *known = PyDict_GetItemWithError(self->categories, name);
    const char *utf8;
    PyObject *value;
    uint32_t id;

    if (known != NULL) {
        *out = (uint32_t)PyLong_AsUnsignedLong(known);
        return 0;
    }
    if (PyErr_Occurred())
        return -1;
    utf8 = PyUnicode_AsUTF8(name);
    if (utf8 == NULL)
        return -1;
    id = (uint32_t)PyDict_GET_SIZE(self->categories) + 1;
    value = PyLong_FromUnsignedLong(id);
    if (value == NULL || PyDict_SetItem(self->categories, name, value) < 0) {
        Py_XDECREF(value);
        return -1;
    }
    Py_DECREF(value);
    nvtxDomainNameCategoryA(self->domain, id, utf8);
    *out = id;
    return 0;
}

static NvtxAttr *nvtx_make_attr(NvtxDomain *self, PyObject *message, PyObject *color,
                                PyObject *category, int keep)
{
    NvtxAttr *attr = PyObject_New(NvtxAttr, &NvtxAttrType);
    uint32_t cat = 0;

    if (attr == NULL)
        return NULL;
    memset(&attr->attr, 0, sizeof(attr->attr));
    attr->message = NULL;
    attr->attr.version = NVTX_VERSION;
    attr->attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attr->attr.colorType = NVTX_COLOR_ARGB;
    if (color != NULL && color != Py_None) {
        attr->attr.color = (uint32_t)PyLong_AsUnsignedLongMask(color);
        if (PyErr_Occurred())
            goto error;
    }
    if (category != NULL && category != Py_None) {
        if (nvtx_category(self, category, &cat) < 0)
            goto error;
        attr->attr.category = cat;
    }
    if (message != NULL && message != Py_None) {
        nvtxStringHandle_t handle = nvtx_string(self, message, keep);
        if (handle == NULL && PyErr_Occurred())
            goto error;
        attr->attr.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
        attr->attr.message.registered = handle;
        attr->message = Py_NewRef(message);
    }
    return attr;
error:
    Py_DECREF(attr);
    return NULL;
}

static PyObject *nvtx_domain_attributes(NvtxDomain *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"message", "color", "category", "keep", NULL};
    PyObject *message = Py_None, *color = Py_None, *category = Py_None;
    int keep = 1;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OOOp", names, &message, &color, &category,
                                     &keep))
        return NULL;
    return (PyObject *)nvtx_make_attr(self, message, color, category, keep);
}

static PyObject *nvtx_domain_mark(NvtxDomain *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"message", "color", NULL};
    PyObject *message = Py_None, *color = Py_None;
    NvtxAttr *attr;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO", names, &message, &color))
        return NULL;
    attr = nvtx_make_attr(self, message, color, NULL, 1);
    if (attr == NULL)
        return NULL;
    nvtxDomainMarkEx(self->domain, &attr->attr);
    Py_DECREF(attr);
    Py_RETURN_NONE;
}

static PyObject *nvtx_domain_push(NvtxDomain *self, PyObject *attr)
{
    if (!Py_IS_TYPE(attr, &NvtxAttrType)) {
        PyErr_SetString(PyExc_TypeError, "push() takes attributes made by this domain");
        return NULL;
    }
    nvtxDomainRangePushEx(self->domain, &((NvtxAttr *)attr)->attr);
    Py_RETURN_NONE;
}

static PyObject *nvtx_domain_pop(NvtxDomain *self, PyObject *unused)
{
    nvtxDomainRangePop(self->domain);
    Py_RETURN_NONE;
}

static PyObject *nvtx_domain_start_range(NvtxDomain *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"message", "color", NULL};
    PyObject *message = Py_None, *color = Py_None;
    NvtxAttr *attr;
    nvtxRangeId_t id;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO", names, &message, &color))
        return NULL;
    attr = nvtx_make_attr(self, message, color, NULL, 1);
    if (attr == NULL)
        return NULL;
    id = nvtxDomainRangeStartEx(self->domain, &attr->attr);
    Py_DECREF(attr);
    return PyLong_FromUnsignedLongLong(id);
}

static PyObject *nvtx_domain_end_range(NvtxDomain *self, PyObject *arg)
{
    unsigned long long id = PyLong_AsUnsignedLongLong(arg);
    if (id == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    nvtxDomainRangeEnd(self->domain, (nvtxRangeId_t)id);
    Py_RETURN_NONE;
}

static PyObject *nvtx_domain_enabled(NvtxDomain *self, void *c)
{
    return PyBool_FromLong(self->domain != NULL);
}

static PyMethodDef nvtx_domain_methods[] = {
    {"attributes", (PyCFunction)(void (*)(void))nvtx_domain_attributes,
     METH_VARARGS | METH_KEYWORDS, "Event attributes (message registered, category named; keep=False: a string not remembered)."},
    {"mark", (PyCFunction)(void (*)(void))nvtx_domain_mark, METH_VARARGS | METH_KEYWORDS,
     "An instantaneous marker."},
    {"push", (PyCFunction)nvtx_domain_push, METH_O, "Push a range with prebuilt attributes."},
    {"pop", (PyCFunction)nvtx_domain_pop, METH_NOARGS, "Pop the innermost range."},
    {"start_range", (PyCFunction)(void (*)(void))nvtx_domain_start_range,
     METH_VARARGS | METH_KEYWORDS, "Start a process-wide range; returns its id."},
    {"end_range", (PyCFunction)nvtx_domain_end_range, METH_O, "End a range by id."},
    {NULL}
};

static PyGetSetDef nvtx_domain_getset[] = {
    {"enabled", (getter)nvtx_domain_enabled, NULL, "whether an NVTX tool listens", NULL},
    {NULL}
};

static PyMemberDef nvtx_domain_members[] = {
    {"name", T_OBJECT, offsetof(NvtxDomain, name), READONLY, "the domain's name"},
    {NULL}
};

static PyTypeObject NvtxDomainType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "chainer_autoprof.runtime.hotpath._native.NvtxDomain",
    .tp_basicsize = sizeof(NvtxDomain),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "NvtxDomain(name): one NVTX domain, its strings, categories and attributes.",
    .tp_new = nvtx_domain_new,
    .tp_dealloc = (destructor)nvtx_domain_dealloc,
    .tp_methods = nvtx_domain_methods,
    .tp_getset = nvtx_domain_getset,
    .tp_members = nvtx_domain_members,
};

static void nvtx_attr_dealloc(NvtxAttr *self)
{
    Py_XDECREF(self->message);
    PyObject_Free(self);
}

static PyTypeObject NvtxAttrType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "chainer_autoprof.runtime.hotpath._native.NvtxAttr",
    .tp_basicsize = sizeof(NvtxAttr),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Prebuilt NVTX event attributes.",
    .tp_dealloc = (destructor)nvtx_attr_dealloc,
};

/* ================================================================================= */
/* The recorder's per-thread buffer: (index, t0, t1, depth) int64 rows               */
/* ================================================================================= */

typedef struct {
    PyObject_HEAD
    int64_t *data;
    Py_ssize_t n;         /* rows */
    Py_ssize_t capacity;  /* rows */
} RecordBuffer;

static PyTypeObject RecordBufferType;

static RecordBuffer *record_buffer_make(Py_ssize_t capacity)
{
    RecordBuffer *self = PyObject_New(RecordBuffer, &RecordBufferType);
    if (self == NULL)
        return NULL;
    if (capacity < 1)
        capacity = 1;
    self->n = 0;
    self->capacity = capacity;
    self->data = PyMem_Malloc((size_t)capacity * 4 * sizeof(int64_t));
    if (self->data == NULL) {
        self->capacity = 0;
        Py_DECREF(self);
        PyErr_NoMemory();
        return NULL;
    }
    return self;
}

static PyObject *record_buffer_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *names[] = {"capacity", NULL};
    Py_ssize_t capacity = 4096;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|n", names, &capacity))
        return NULL;
    return (PyObject *)record_buffer_make(capacity);
}

static void record_buffer_dealloc(RecordBuffer *self)
{
    PyMem_Free(self->data);
    PyObject_Free(self);
}

/* Append one row; grows (never fails but for memory) when a flush could not drain it. */
static int record_buffer_append(RecordBuffer *self, int64_t a, int64_t b, int64_t c, int64_t d)
{
    int64_t *row;
    if (self->n >= self->capacity) {
        Py_ssize_t grown = self->capacity * 2;
        int64_t *data = PyMem_Realloc(self->data, (size_t)grown * 4 * sizeof(int64_t));
        if (data == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->data = data;
        self->capacity = grown;
    }
    row = self->data + 4 * self->n;
    row[0] = a;
    row[1] = b;
    row[2] = c;
    row[3] = d;
    self->n++;
    return 0;
}

static PyObject *record_buffer_append_py(RecordBuffer *self, PyObject *row)
{
    long long v[4];
    PyObject *seq = PySequence_Fast(row, "append() takes (index, t0, t1, depth)");
    if (seq == NULL)
        return NULL;
    if (PySequence_Fast_GET_SIZE(seq) != 4) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "append() takes (index, t0, t1, depth)");
        return NULL;
    }
    for (int i = 0; i < 4; i++) {
        v[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    if (record_buffer_append(self, v[0], v[1], v[2], v[3]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* The rows as bytes (a copy), and (take) the buffer emptied in the same step. */
static PyObject *record_buffer_copy(RecordBuffer *self, PyObject *unused)
{
    return PyByteArray_FromStringAndSize((const char *)self->data,
                                         self->n * 4 * (Py_ssize_t)sizeof(int64_t));
}

static PyObject *record_buffer_take(RecordBuffer *self, PyObject *unused)
{
    PyObject *out = record_buffer_copy(self, NULL);
    if (out != NULL)
        self->n = 0;
    return out;
}

static Py_ssize_t record_buffer_len(RecordBuffer *self) { return self->n; }

static PyMethodDef record_buffer_methods[] = {
    {"append", (PyCFunction)record_buffer_append_py, METH_O, "Append (index, t0, t1, depth)."},
    {"copy", (PyCFunction)record_buffer_copy, METH_NOARGS, "The rows as int64 bytes (a copy)."},
    {"take", (PyCFunction)record_buffer_take, METH_NOARGS,
     "The rows as int64 bytes, the buffer emptied."},
    {NULL}
};

static PySequenceMethods record_buffer_as_sequence = {
    .sq_length = (lenfunc)record_buffer_len,
};

static PyTypeObject RecordBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "chainer_autoprof.runtime.hotpath._native.RecordBuffer",
    .tp_basicsize = sizeof(RecordBuffer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RecordBuffer(capacity): a thread's recorded ranges, int64 rows of 4.",
    .tp_new = record_buffer_new,
    .tp_dealloc = (destructor)record_buffer_dealloc,
    .tp_methods = record_buffer_methods,
    .tp_as_sequence = &record_buffer_as_sequence,
};

/* The recorder as the core runs it: the buffer size, the iteration's info (handed to
 * Python, once per iteration), the flush of a full buffer (Python). */
typedef struct {
    PyObject_HEAD
    Py_ssize_t capacity;
    PyObject *iter_info;
    PyObject *iteration_ended;  /* (buf, t0, t1, ts) */
    PyObject *flush;            /* (ts) */
} RecorderHook;

static PyTypeObject RecorderHookType;

static PyObject *recorder_hook_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *names[] = {"capacity", "iter_info", "iteration_ended", "flush", NULL};
    Py_ssize_t capacity;
    PyObject *iter_info, *iteration_ended, *flush;
    RecorderHook *self;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "nOOO", names, &capacity, &iter_info,
                                     &iteration_ended, &flush))
        return NULL;
    self = (RecorderHook *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->capacity = capacity < 1 ? 1 : capacity;
    self->iter_info = Py_NewRef(iter_info);
    self->iteration_ended = Py_NewRef(iteration_ended);
    self->flush = Py_NewRef(flush);
    return (PyObject *)self;
}

static int recorder_hook_traverse(RecorderHook *self, visitproc visit, void *arg)
{
    Py_VISIT(self->iter_info);
    Py_VISIT(self->iteration_ended);
    Py_VISIT(self->flush);
    return 0;
}

static int recorder_hook_clear(RecorderHook *self)
{
    Py_CLEAR(self->iter_info);
    Py_CLEAR(self->iteration_ended);
    Py_CLEAR(self->flush);
    return 0;
}

static void recorder_hook_dealloc(RecorderHook *self)
{
    PyObject_GC_UnTrack(self);
    recorder_hook_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject RecorderHookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "chainer_autoprof.runtime.hotpath._native.RecorderHook",
    .tp_basicsize = sizeof(RecorderHook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "RecorderHook(capacity, iter_info, iteration_ended, flush): the recorder, "
              "run by the core.",
    .tp_new = recorder_hook_new,
    .tp_traverse = (traverseproc)recorder_hook_traverse,
    .tp_clear = (inquiry)recorder_hook_clear,
    .tp_dealloc = (destructor)recorder_hook_dealloc,
};

/* ================================================================================= */
/* Core: a tracer's ranges                                                            */
/* ================================================================================= */

enum { SINK_NVTX = 1, SINK_RECORDER = 2, SINK_PYTHON = 3 };

typedef struct {
    int kind;
    PyObject *obj;    /* NvtxDomain, RecorderHook, or the Python begin callable (or NULL) */
    PyObject *end;    /* the Python end callable (or NULL) */
} sink_t;

/* The sinks, as a block shared by the ranges being begun or ended: set_sinks (a sink
 * added from inside a sink, such as the GPU timer) replaces the core's block, and the
 * block in use lives until its last user lets go, as a Python tuple being iterated would. */
typedef struct {
    Py_ssize_t refs;
    Py_ssize_t n;
    sink_t items[1];
} sinks_t;

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
        Py_XDECREF(s->items[i].obj);
        Py_XDECREF(s->items[i].end);
    }
    PyMem_Free(s);
}

typedef struct {
    PyObject_HEAD
    uint64_t serial;          /* identifies this core in the thread-local cache */
    PyObject *key;            /* its key in each thread's dict */
    PyTypeObject *state_type, *info_type;
    Py_ssize_t off_stack, off_record, off_links, off_quiet, off_phase, off_bwd_link,
        off_bwd_link_tok;
    Py_ssize_t off_emit, off_sync, off_index, off_nvtx, off_stack_entry;
    PyThreadState *last_tstate;  /* the thread asked last, and its ThreadState (strong: a */
    uint64_t last_id;            /*   thread's teardown clears its dict before its last */
    PyObject *last_state;        /*   calls; the id tells a later thread at that address) */
    PyObject *new_state;      /* () -> a new ThreadState for this thread, registered */
    PyObject *sync;           /* () -> None: synchronize the devices */
    PyObject *window;         /* None, or an object whose .open says whether to emit */
    PyObject *clock;          /* None: CLOCK_MONOTONIC; else a callable -> int ns */
    int timed;                /* a sink reads t0/t1 */
    sinks_t *sinks;
} Core;

static PyTypeObject CoreType;
static uint64_t next_serial = 1;
static PyObject *str_open;

static PyObject *core_state_slow(Core *core, int create)
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

/* This thread's ThreadState (borrowed), created on first use. */
static inline PyObject *core_state(Core *core)
{
    PyThreadState *tstate = PyThreadState_Get();
    if (tstate == core->last_tstate && PyThreadState_GetID(tstate) == core->last_id)
        return core->last_state;
    return core_state_slow(core, 1);
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
    *out = PyLong_AsLongLong(t);
    Py_DECREF(t);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int core_sync(Core *core)
{
    PyObject *r = PyObject_CallNoArgs(core->sync);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* The recorder's append for a range that ended (ts.stack already popped). */
static int core_record(Core *core, RecorderHook *rec, PyObject *ts, PyObject *info, int64_t t0,
                       int64_t t1, PyObject *t0obj)
{
    PyObject *buf = SLOT(ts, core->off_record);
    PyObject *index_obj, *stack;
    long long index;

    if (buf == NULL || !Py_IS_TYPE(buf, &RecordBufferType)) {
        RecordBuffer *fresh = record_buffer_make(rec->capacity);  /* not GC-tracked */
        if (fresh == NULL)
            return -1;
        buf = SLOT(ts, core->off_record);
        if (buf == NULL || !Py_IS_TYPE(buf, &RecordBufferType)) {
            slot_set(ts, core->off_record, (PyObject *)fresh);
            buf = (PyObject *)fresh;
        }
        Py_DECREF(fresh);
    }
    if (info == rec->iter_info) {
        PyObject *t1obj = PyLong_FromLongLong(t1), *r;
        if (t1obj == NULL)
            return -1;
        Py_INCREF(buf);
        r = call4(rec->iteration_ended, buf, t0obj, t1obj, ts);
        Py_DECREF(buf);
        Py_DECREF(t1obj);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
        return 0;
    }
    index_obj = SLOT(info, core->off_index);
    if (index_obj == NULL) {
        PyErr_SetString(PyExc_AttributeError, "index");
        return -1;
    }
    index = int64_of(index_obj);
    if (index == -1 && PyErr_Occurred())
        return -1;
    stack = SLOT(ts, core->off_stack);
    if (record_buffer_append((RecordBuffer *)buf, index, t0, t1,
                             stack != NULL ? PyList_GET_SIZE(stack) : 0) < 0)
        return -1;
    if (((RecordBuffer *)buf)->n >= rec->capacity) {
        PyObject *r = call1(rec->flush, ts);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    return 0;
}

static PyObject *const_zero;

static int check_state(Core *core, PyObject *ts)
{
    if (!Py_IS_TYPE(ts, core->state_type)) {
        PyErr_SetString(PyExc_TypeError, "not a ThreadState of this tracer");
        return -1;
    }
    return 0;
}

/* Begin `info` on `ts` (borrowed; NULL: this thread's).  Returns the token (new reference:
 * info, or None when nothing was emitted), NULL on error. */
static PyObject *core_begin(Core *core, PyObject *info, PyObject *ts)
{
    PyObject *emit, *t0obj, *entry, *stack, *nvtx;
    sinks_t *sinks;
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
    for (i = 0; i < sinks->n; i++) {
        sink_t *s = &sinks->items[i];
        if (s->kind == SINK_NVTX) {
            nvtx = SLOT(info, core->off_nvtx);
            if (nvtx != NULL && Py_IS_TYPE(nvtx, &NvtxAttrType))
                nvtxDomainRangePushEx(((NvtxDomain *)s->obj)->domain, &((NvtxAttr *)nvtx)->attr);
        } else if (s->kind == SINK_PYTHON && s->obj != NULL) {
            PyObject *r = call2(s->obj, info, ts);
            if (r == NULL) {
                /* End it in the sinks that began it, and forget it: the caller gets the
                 * error (its hook turns off) and never ends this range. */
                saved_error err;
                Py_ssize_t j, n;
                save_error(&err);
                stack = SLOT(ts, core->off_stack);
                n = stack != NULL ? PyList_GET_SIZE(stack) : 0;
                if (n > 0 && PyTuple_GET_ITEM(PyList_GET_ITEM(stack, n - 1), 0) == info) {
                    PyObject *top = list_pop(stack);
                    PyObject *t0keep = Py_NewRef(PyTuple_GET_ITEM(top, 1));
                    Py_DECREF(top);
                    for (j = 0; j < i; j++) {
                        sink_t *b = &sinks->items[j];
                        if (b->kind == SINK_NVTX) {
                            nvtx = SLOT(info, core->off_nvtx);
                            if (nvtx != NULL && Py_IS_TYPE(nvtx, &NvtxAttrType))
                                nvtxDomainRangePop(((NvtxDomain *)b->obj)->domain);
                        } else if (b->kind == SINK_PYTHON && b->obj != NULL && b->end != NULL) {
                            PyObject *e = call4(b->end, info, t0keep, t0keep, ts);
                            if (e == NULL)
                                PyErr_Clear();  /* already failing: the first error counts */
                            Py_XDECREF(e);
                        }
                    }
                    Py_DECREF(t0keep);
                }
                restore_error(&err);
                sinks_release(sinks);
                goto error;
            }
            Py_DECREF(r);
        }
    }
    sinks_release(sinks);
    Py_DECREF(ts);
    return Py_NewRef(info);
error:
    Py_DECREF(ts);
    return NULL;
}

/* End `token` on `ts` (borrowed; NULL: this thread's).  0, or -1 on error. */
static int core_end(Core *core, PyObject *token, PyObject *ts)
{
    PyObject *stack, *top, *info, *t0obj, *t1obj = NULL;
    Py_ssize_t n, i;
    int64_t t0, t1;
    int rc = -1;
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
    sinks = core->sinks;
    sinks->refs++;
    for (i = 0; i < sinks->n; i++) {
        sink_t *s = &sinks->items[i];
        if (s->kind == SINK_NVTX) {
            PyObject *nvtx = Py_IS_TYPE(info, core->info_type) ? SLOT(info, core->off_nvtx) : NULL;
            if (nvtx != NULL && Py_IS_TYPE(nvtx, &NvtxAttrType))
                nvtxDomainRangePop(((NvtxDomain *)s->obj)->domain);
        } else if (s->kind == SINK_RECORDER) {
            if (Py_IS_TYPE(info, core->info_type)
                && core_record(core, (RecorderHook *)s->obj, ts, info, t0, t1, t0obj) < 0) {
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

static int core_traverse(Core *self, visitproc visit, void *arg)
{
    Py_VISIT(self->new_state);
    Py_VISIT(self->sync);
    Py_VISIT(self->window);
    Py_VISIT(self->clock);
    Py_VISIT(self->last_state);
    if (self->sinks != NULL) {
        for (Py_ssize_t i = 0; i < self->sinks->n; i++) {
            Py_VISIT(self->sinks->items[i].obj);
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
    Py_CLEAR(self->new_state);
    Py_CLEAR(self->sync);
    Py_CLEAR(self->window);
    Py_CLEAR(self->clock);
    self->last_tstate = NULL;
    Py_CLEAR(self->last_state);
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
        || slot_offset(self->state_type, "stack", &self->off_stack) < 0
        || slot_offset(self->state_type, "record", &self->off_record) < 0
        || slot_offset(self->state_type, "links", &self->off_links) < 0
        || slot_offset(self->state_type, "quiet", &self->off_quiet) < 0
        || slot_offset(self->state_type, "phase", &self->off_phase) < 0
        || slot_offset(self->state_type, "bwd_link", &self->off_bwd_link) < 0
        || slot_offset(self->state_type, "bwd_link_tok", &self->off_bwd_link_tok) < 0
        || slot_offset(self->info_type, "emit", &self->off_emit) < 0
        || slot_offset(self->info_type, "sync", &self->off_sync) < 0
        || slot_offset(self->info_type, "index", &self->off_index) < 0
        || slot_offset(self->info_type, "nvtx", &self->off_nvtx) < 0
        || slot_offset(self->info_type, "stack_entry", &self->off_stack_entry) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyObject *core_state_py(Core *self, PyObject *unused)
{
    return Py_XNewRef(core_state(self));
}

static PyObject *core_current_py(Core *self, PyObject *unused)
{
    PyObject *ts = core_state_slow(self, 0);
    if (ts == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    return Py_NewRef(ts);
}

static PyObject *core_forget_py(Core *self, PyObject *unused)
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

/* set_sinks(entries, timed): each entry ("nvtx", NvtxDomain), ("recorder", RecorderHook) or
 * ("python", begin or None, end or None), in the order the sinks were added. */
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
        const char *kind;
        PyObject *a = NULL, *b = NULL;
        if (!PyArg_ParseTuple(entry, "s|OO", &kind, &a, &b))
            goto error;
        if (strcmp(kind, "nvtx") == 0 && a != NULL && Py_IS_TYPE(a, &NvtxDomainType)) {
            sinks->items[i].kind = SINK_NVTX;
        } else if (strcmp(kind, "recorder") == 0 && a != NULL
                   && Py_IS_TYPE(a, &RecorderHookType)) {
            sinks->items[i].kind = SINK_RECORDER;
        } else if (strcmp(kind, "python") == 0) {
            sinks->items[i].kind = SINK_PYTHON;
            if (a == Py_None)
                a = NULL;
            if (b == Py_None)
                b = NULL;
            sinks->items[i].end = Py_XNewRef(b);
        } else {
            PyErr_Format(PyExc_ValueError, "unknown sink entry %R", entry);
            goto error;
        }
        sinks->items[i].obj = Py_XNewRef(a);
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
     "set_sinks(entries, timed): the sinks, in order."},
    {NULL}
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "chainer_autoprof.runtime.hotpath._native.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Core(state_cls, info_cls, new_state, sync, window=None, clock=None): "
              "a tracer's ranges.",
    .tp_new = core_new,
    .tp_traverse = (traverseproc)core_traverse,
    .tp_clear = (inquiry)core_clear,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_methods = core_methods,
};

/* ================================================================================= */
/* Wrapper: what replaces a patched function                                          */
/* ================================================================================= */

enum { KIND_AROUND = 1, KIND_LINK = 2, KIND_APPLY = 3, KIND_BACKPROP = 4 };

/* The link wrapper's cache of link entries by (link, parent entry): most calls find their
 * entry here, without the id() key of the parent's dict.  It holds the parent entry (its
 * address is not reused while cached) and the entry, whose weak reference must still
 * point at the link for a hit. */
#define ENTRY_CACHE_BITS 10
#define ENTRY_CACHE_SIZE (1 << ENTRY_CACHE_BITS)

typedef struct {
    PyObject *link;    /* compared by address only */
    PyObject *parent;  /* strong: the parent entry, or None */
    PyObject *entry;   /* strong */
} entry_slot;

/* The slot of (link, parent): multiplicative hashing, whose high bits spread objects that
 * lie far apart (links are scattered over the heap, so the low bits of their addresses
 * collide: 50 Linear links shared 36 of 256 slots by address bits, and those sharing one
 * missed every call). */
static inline entry_slot *entry_cache_slot(entry_slot *cache, PyObject *link, PyObject *parent)
{
    uint64_t h = ((uint64_t)(uintptr_t)link >> 4) * 0x9E3779B97F4A7C15ull
                 ^ ((uint64_t)(uintptr_t)parent >> 4) * 0xC2B2AE3D27D4EB4Full;
    return &cache[h >> (64 - ENTRY_CACHE_BITS)];
}

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int kind;
    int method;            /* the first positional argument is the instance */
    PyObject *original;
    Switch *sw;
    PyObject *fail;        /* (exc) -> None: our own error; the patch turns off */
    PyObject *weakreflist;
    /* around */
    PyObject *enter, *exit;
    int replace_args;
    /* link, apply, backprop */
    Core *core;
    /* link */
    PyObject *roots, *make_entry, *outer_enter, *outer_exit;
    PyTypeObject *entry_type, *variable_type;
    Py_ssize_t off_children, off_ref, off_info, off_index;
    int inner_links_matter, attribute_backward;
    entry_slot *entry_cache;
    /* apply, backprop */
    PyObject *infos_by_type, *infos_by_label, *new_info, *default_label, *entries;
    PyObject *backward;    /* the backward phase's name */
    Py_ssize_t off_bwd_info;
    int function_ranges;
} Wrapper;

static PyTypeObject WrapperType;
static PyObject *str_label, *str_node, *str_creator_node, *str_link_attr, *str_qualname;

static inline PyObject *call_original(Wrapper *w, PyObject *const *args, size_t nargsf,
                                      PyObject *kwnames)
{
    return PyObject_Vectorcall(w->original, args, nargsf, kwnames);
}

/* -- around ----------------------------------------------------------------------- */

/* kwargs dict from vectorcall keyword names/values (new reference, or NULL). */
static PyObject *kwargs_dict(PyObject *const *values, PyObject *kwnames)
{
    PyObject *d = PyDict_New();
    if (d == NULL || kwnames == NULL)
        return d;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
        if (PyDict_SetItem(d, PyTuple_GET_ITEM(kwnames, i), values[i]) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    }
    return d;
}

static NOINLINE PyObject *around_call(Wrapper *w, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *instance = Py_None, *rest = NULL, *kwargs = NULL, *state = NULL, *result;
    PyObject *call_args = NULL, *call_kwargs = NULL;
    Py_ssize_t skip = 0;

    if (w->method) {
        if (nargs < 1)
            return call_original(w, args, nargsf, kwnames);
        instance = args[0];
        skip = 1;
    }
    rest = PyTuple_New(nargs - skip);
    if (rest == NULL)
        return NULL;
    for (Py_ssize_t i = skip; i < nargs; i++)
        PyTuple_SET_ITEM(rest, i - skip, Py_NewRef(args[i]));
    kwargs = kwargs_dict(args + nargs, kwnames);
    if (kwargs == NULL) {
        Py_DECREF(rest);
        return NULL;
    }
    state = call3(w->enter, instance, rest, kwargs);
    if (state == NULL) {
        if (contain(w->fail) < 0)
            goto error;
        state = Py_NewRef(Py_None);
    }
    if (state == Py_None) {
        Py_DECREF(state);
        Py_DECREF(rest);
        Py_DECREF(kwargs);
        return call_original(w, args, nargsf, kwnames);
    }
    if (w->replace_args) {
        PyObject *new_state, *new_args, *new_kwargs;
        if (!PyTuple_Check(state) || PyTuple_GET_SIZE(state) != 3) {
            PyErr_SetString(PyExc_TypeError, "enter() must return (state, args, kwargs)");
            Py_DECREF(state);
            if (contain(w->fail) < 0)
                goto error;
            Py_DECREF(rest);
            Py_DECREF(kwargs);
            return call_original(w, args, nargsf, kwnames);
        }
        new_state = Py_NewRef(PyTuple_GET_ITEM(state, 0));
        new_args = PyTuple_GET_ITEM(state, 1);
        new_kwargs = PyTuple_GET_ITEM(state, 2);
        if (!PyTuple_Check(new_args) || !PyDict_Check(new_kwargs)) {
            Py_DECREF(new_state);
            Py_DECREF(state);
            PyErr_SetString(PyExc_TypeError, "enter() must return (state, tuple, dict)");
            if (contain(w->fail) < 0)
                goto error;
            Py_DECREF(rest);
            Py_DECREF(kwargs);
            return call_original(w, args, nargsf, kwnames);
        }
        if (w->method) {
            call_args = PyTuple_New(PyTuple_GET_SIZE(new_args) + 1);
            if (call_args == NULL) {
                Py_DECREF(new_state);
                Py_DECREF(state);
                goto error;
            }
            PyTuple_SET_ITEM(call_args, 0, Py_NewRef(instance));
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(new_args); i++)
                PyTuple_SET_ITEM(call_args, i + 1, Py_NewRef(PyTuple_GET_ITEM(new_args, i)));
        } else {
            call_args = Py_NewRef(new_args);
        }
        call_kwargs = Py_NewRef(new_kwargs);
        Py_DECREF(state);
        state = new_state;
        if (state == Py_None) {  /* arguments replaced, no exit */
            Py_DECREF(state);
            Py_DECREF(rest);
            Py_DECREF(kwargs);
            result = PyObject_Call(w->original, call_args, call_kwargs);
            Py_DECREF(call_args);
            Py_DECREF(call_kwargs);
            return result;
        }
        result = PyObject_Call(w->original, call_args, call_kwargs);
        Py_CLEAR(call_args);
        Py_CLEAR(call_kwargs);
    } else {
        result = call_original(w, args, nargsf, kwnames);
    }
    Py_CLEAR(rest);
    Py_CLEAR(kwargs);
    if (w->exit != Py_None) {
        saved_error user = {NULL, NULL, NULL}, ours = {NULL, NULL, NULL};
        PyObject *exc = NULL, *r;
        if (result == NULL) {
            exc = fetch_exception();
            if (exc != NULL)
                PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), Py_NewRef(exc),
                              PyException_GetTraceback(exc));
            save_error(&user);
        }
        r = call3(w->exit, state, result != NULL ? result : Py_None,
                  exc != NULL ? exc : Py_None);
        Py_XDECREF(exc);
        if (r == NULL)
            after_call_error(w->fail, &ours);
        Py_XDECREF(r);
        result = finish_call(result, &user, &ours);
    }
    Py_DECREF(state);
    return result;
error:
    Py_XDECREF(rest);
    Py_XDECREF(kwargs);
    Py_XDECREF(call_args);
    Py_XDECREF(call_kwargs);
    return NULL;
}

/* -- link --------------------------------------------------------------------------- */

static NOINLINE PyObject *link_call(Wrapper *w, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Core *core = w->core;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *instance, *ts, *links, *parent = NULL, *table, *key = NULL, *entry = NULL;
    PyObject *mode = NULL, *tok = NULL, *out, *info;
    entry_slot *slot = NULL;
    Py_ssize_t n;
    int pushed = 0;

    if (nargs < 1)
        return call_original(w, args, nargsf, kwnames);
    instance = args[0];
    ts = core_state(core);
    if (ts == NULL) {
        if (contain(w->fail) < 0)
            return NULL;
        return call_original(w, args, nargsf, kwnames);
    }
    links = SLOT(ts, core->off_links);
    if (links == NULL || !PyList_Check(links)) {
        PyErr_SetString(PyExc_TypeError, "ThreadState.links is not a list");
        if (contain(w->fail) < 0)
            return NULL;
        return call_original(w, args, nargsf, kwnames);
    }
    n = PyList_GET_SIZE(links);
    if (n > 0) {
        PyObject *ref;
        parent = PyList_GET_ITEM(links, n - 1);
        if (!w->inner_links_matter)
            return call_original(w, args, nargsf, kwnames);  /* inner links: nothing to do */
        ref = Py_IS_TYPE(parent, w->entry_type) ? SLOT(parent, w->off_ref) : NULL;
        if (ref != NULL && PyWeakref_Check(ref) && PyWeakref_GET_OBJECT(ref) == instance)
            return call_original(w, args, nargsf, kwnames);  /* super().__call__ of this link */
    }
    Py_INCREF(ts);
    Py_INCREF(links);
    Py_XINCREF(parent);
    /* -- enter: our bookkeeping; an error of ours is contained and the call goes on -- */
    if (parent != NULL && !Py_IS_TYPE(parent, w->entry_type)) {
        PyErr_SetString(PyExc_TypeError, "not a link entry");
        goto enter_failed;
    }
    {
        PyObject *parent_key = parent != NULL ? parent : Py_None;
        slot = entry_cache_slot(w->entry_cache, instance, parent_key);
        if (slot->link == instance && slot->parent == parent_key && slot->entry != NULL) {
            PyObject *ref = SLOT(slot->entry, w->off_ref);
            if (ref != NULL && PyWeakref_Check(ref) && PyWeakref_GET_OBJECT(ref) == instance)
                entry = Py_NewRef(slot->entry);
        }
    }
    if (entry != NULL)
        goto have_entry;
    table = parent != NULL ? SLOT(parent, w->off_children) : w->roots;
    if (table == NULL || !PyDict_Check(table)) {
        PyErr_SetString(PyExc_TypeError, "link entry table is not a dict");
        goto enter_failed;
    }
    key = PyLong_FromVoidPtr(instance);
    if (key == NULL)
        goto enter_failed;
    entry = PyDict_GetItemWithError(table, key);
    Py_CLEAR(key);
    if (entry != NULL) {
        PyObject *ref = Py_IS_TYPE(entry, w->entry_type) ? SLOT(entry, w->off_ref) : NULL;
        if (ref == NULL || !PyWeakref_Check(ref) || PyWeakref_GET_OBJECT(ref) != instance)
            entry = NULL;
        else
            Py_INCREF(entry);
    } else if (PyErr_Occurred()) {
        goto enter_failed;
    }
    if (entry == NULL) {
        entry = call2(w->make_entry, instance, parent != NULL ? parent : Py_None);
        if (entry == NULL)
            goto enter_failed;
        if (!Py_IS_TYPE(entry, w->entry_type)) {
            PyErr_SetString(PyExc_TypeError, "make_entry() returned no link entry");
            goto enter_failed;
        }
    }
    {
        PyObject *old_parent = slot->parent, *old_entry = slot->entry;
        slot->link = instance;
        slot->parent = Py_NewRef(parent != NULL ? parent : Py_None);
        slot->entry = Py_NewRef(entry);
        Py_XDECREF(old_parent);
        Py_XDECREF(old_entry);
    }
have_entry:
    if (n == 0) {  /* the outermost link: the forward phase, or inference (Python) */
        mode = call2(w->outer_enter, instance, ts);
        if (mode == NULL)
            goto enter_failed;
        if (mode == Py_None)
            Py_CLEAR(mode);
    }
    if (PyList_Append(links, entry) < 0)
        goto enter_failed;
    pushed = 1;
    info = SLOT(entry, w->off_info);
    if (info != NULL && info != Py_None) {
        tok = core_begin(core, info, ts);
        if (tok == NULL)
            goto enter_failed;
        if (tok == Py_None)
            Py_CLEAR(tok);
    }
    goto call;
enter_failed:
    if (contain(w->fail) < 0) {
        /* not ours to contain (KeyboardInterrupt): undo what is ours, then raise */
        saved_error err;
        save_error(&err);
        if (pushed && PyList_GET_SIZE(links) > 0)
            Py_DECREF(list_pop(links));
        if (mode != NULL) {
            PyObject *r = call2(w->outer_exit, ts, mode);
            if (r == NULL)
                PyErr_Clear();
            Py_XDECREF(r);
        }
        restore_error(&err);
        Py_XDECREF(mode);
        Py_XDECREF(entry);
        Py_XDECREF(parent);
        Py_DECREF(links);
        Py_DECREF(ts);
        return NULL;
    }
call:
    out = call_original(w, args, nargsf, kwnames);
    /* -- exit -- */
    {
        saved_error user = {NULL, NULL, NULL}, ours = {NULL, NULL, NULL};
        if (out == NULL)
            save_error(&user);
        if (pushed && PyList_GET_SIZE(links) > 0)
            Py_DECREF(list_pop(links));
        if (tok != NULL && core_end(core, tok, ts) < 0)
            after_call_error(w->fail, &ours);
        if (mode != NULL) {
            PyObject *r = call2(w->outer_exit, ts, mode);
            if (r == NULL)
                after_call_error(w->fail, &ours);
            Py_XDECREF(r);
        }
        out = finish_call(out, &user, &ours);
    }
    Py_XDECREF(tok);
    Py_XDECREF(mode);
    Py_XDECREF(parent);
    Py_DECREF(links);
    /* The innermost link that returned a Variable owns its creator's backward. */
    if (out != NULL && w->attribute_backward && pushed && entry != NULL
        && PyObject_TypeCheck(out, w->variable_type)) {
        PyObject *node = NULL, *creator = NULL, *owner = NULL;
        if (_PyObject_LookupAttr(out, str_node, &node) < 0)
            goto attribution_failed;
        if (node != NULL && node != Py_None
            && _PyObject_LookupAttr(node, str_creator_node, &creator) < 0)
            goto attribution_failed;
        if (creator != NULL && creator != Py_None) {
            if (_PyObject_LookupAttr(creator, str_link_attr, &owner) < 0)
                goto attribution_failed;
            if (owner == NULL || owner == Py_None) {
                PyObject *index = SLOT(entry, w->off_index);
                if (index == NULL || PyObject_SetAttr(creator, str_link_attr, index) < 0)
                    goto attribution_failed;
            }
        }
        goto attribution_done;
attribution_failed:
        if (contain(w->fail) < 0) {
            Py_XDECREF(node);
            Py_XDECREF(creator);
            Py_XDECREF(owner);
            Py_XDECREF(entry);
            Py_DECREF(ts);
            Py_DECREF(out);
            return NULL;
        }
attribution_done:
        Py_XDECREF(node);
        Py_XDECREF(creator);
        Py_XDECREF(owner);
    }
    Py_XDECREF(entry);
    Py_DECREF(ts);
    return out;
}

/* -- function ranges: the RangeInfo of a FunctionNode ------------------------------------ */

/* The info for `node` (a new reference), through the per-type cache when its label is the
 * default (the class's own `label` property) and the per-label cache otherwise.  A label seen
 * the first time goes to `new_info(label)` -> (info, cache): a label past the tracer's cap
 * of names (cache false) is not remembered, so labels such as "_ * 0.37" cannot grow it. */
static PyObject *new_function_info(Wrapper *w, PyObject *label, int *cache)
{
    PyObject *made = call1(w->new_info, label), *info;
    if (made == NULL)
        return NULL;
    if (!PyTuple_CheckExact(made) || PyTuple_GET_SIZE(made) != 2) {
        Py_DECREF(made);
        PyErr_SetString(PyExc_TypeError, "new_info() must return (info, cache)");
        return NULL;
    }
    info = Py_NewRef(PyTuple_GET_ITEM(made, 0));
    *cache = PyObject_IsTrue(PyTuple_GET_ITEM(made, 1));
    Py_DECREF(made);
    if (*cache < 0 || (*cache && PyDict_SetItem(w->infos_by_label, label, info) < 0)) {
        Py_DECREF(info);
        return NULL;
    }
    return info;
}

static PyObject *function_info(Wrapper *w, PyObject *node)
{
    PyTypeObject *type = Py_TYPE(node);
    PyObject *label_descr = _PyType_Lookup(type, str_label);
    PyObject *info, *label;
    int cache = 1;

    if (label_descr == w->default_label) {
        info = PyDict_GetItemWithError(w->infos_by_type, (PyObject *)type);
        if (info != NULL)
            return Py_NewRef(info);
        if (PyErr_Occurred())
            return NULL;
    }
    label = PyObject_GetAttr(node, str_label);
    if (label == NULL)
        return NULL;
    info = PyDict_GetItemWithError(w->infos_by_label, label);
    if (info != NULL)
        Py_INCREF(info);
    else if (!PyErr_Occurred())
        info = new_function_info(w, label, &cache);
    Py_DECREF(label);
    if (info != NULL && cache && label_descr == w->default_label
        && PyDict_SetItem(w->infos_by_type, (PyObject *)type, info) < 0)
        Py_CLEAR(info);
    return info;
}

/* The original call inside the range `tok` (ours: NULL when none was begun), which ends
 * after it whether it returned or raised; `ts` is ours too.  The user's error wins over ours
 * (which turns the hook off). */
static inline PyObject *call_in_range(Wrapper *w, PyObject *const *args, size_t nargsf,
                                      PyObject *kwnames, PyObject *tok, PyObject *ts)
{
    PyObject *out = call_original(w, args, nargsf, kwnames);
    if (tok != NULL) {
        saved_error user = {NULL, NULL, NULL}, ours = {NULL, NULL, NULL};
        if (out == NULL)
            save_error(&user);
        if (core_end(w->core, tok, ts) < 0)
            after_call_error(w->fail, &ours);
        out = finish_call(out, &user, &ours);
        Py_DECREF(tok);
    }
    Py_DECREF(ts);
    return out;
}

/* -- FunctionNode.apply ------------------------------------------------------------------ */

static NOINLINE PyObject *apply_call(Wrapper *w, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Core *core = w->core;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *node, *ts, *info = NULL, *links, *tok = NULL;

    if (nargs < 1)
        return call_original(w, args, nargsf, kwnames);
    node = args[0];
    ts = core_state(core);
    if (ts == NULL) {
        if (contain(w->fail) < 0)
            return NULL;
        return call_original(w, args, nargsf, kwnames);
    }
    Py_INCREF(ts);
    info = function_info(w, node);
    if (info == NULL)
        goto failed;
    links = SLOT(ts, core->off_links);
    if (links != NULL && PyList_Check(links) && PyList_GET_SIZE(links) > 0) {
        /* the innermost link being called owns its backward */
        PyObject *entry = PyList_GET_ITEM(links, PyList_GET_SIZE(links) - 1);
        PyObject *index = Py_IS_TYPE(entry, w->entry_type) ? SLOT(entry, w->off_index) : NULL;
        if (index == NULL) {
            PyErr_SetString(PyExc_TypeError, "not a link entry");
            goto failed;
        }
        if (PyObject_SetAttr(node, str_link_attr, index) < 0)
            goto failed;
    }
    tok = core_begin(core, info, ts);
    Py_CLEAR(info);
    if (tok == NULL)
        goto failed;
    if (tok == Py_None)
        Py_CLEAR(tok);
    goto call;
failed:
    Py_XDECREF(info);
    if (contain(w->fail) < 0) {
        Py_DECREF(ts);
        return NULL;
    }
call:
    return call_in_range(w, args, nargsf, kwnames, tok, ts);
}

/* -- _backprop_utils.backprop_step -------------------------------------------------------- */

static int same_owner(PyObject *a, PyObject *b)
{
    int eq;
    if (a == b)
        return 1;
    if (a == NULL || b == NULL || a == Py_None || b == Py_None)
        return 0;
    if (PyLong_CheckExact(a) && PyLong_CheckExact(b)) {  /* entry numbers: compare values */
        long long x = PyLong_AsLongLong(a), y = PyLong_AsLongLong(b);
        if (!PyErr_Occurred())
            return x == y;
        PyErr_Clear();
    }
    eq = PyObject_RichCompareBool(a, b, Py_EQ);
    if (eq < 0)
        PyErr_Clear();
    return eq > 0;
}

static NOINLINE PyObject *backprop_call(Wrapper *w, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames)
{
    Core *core = w->core;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *ts, *phase, *func = NULL, *owner = NULL, *tok = NULL;

    ts = core_state(core);
    if (ts == NULL) {
        if (contain(w->fail) < 0)
            return NULL;
        return call_original(w, args, nargsf, kwnames);
    }
    phase = SLOT(ts, core->off_phase);
    if (phase != w->backward) {
        int eq = phase != NULL && phase != Py_None && PyUnicode_Check(phase)
                 && PyUnicode_Compare(phase, w->backward) == 0;
        if (!eq)
            return call_original(w, args, nargsf, kwnames);
    }
    Py_INCREF(ts);
    if (nargs >= 1) {
        func = args[0];
    } else if (kwnames != NULL) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++)
            if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, i), "func") == 0)
                func = args[nargs + i];
    }
    if (func == NULL) {
        PyErr_SetString(PyExc_TypeError, "backprop_step without func");
        goto failed;
    }
    /* The link that owns this node: at link granularity the innermost link that returned
     * its output (a node no link returned stays in the current range); at function
     * granularity the innermost link it was applied in (none: outside every link). */
    if (_PyObject_LookupAttr(func, str_link_attr, &owner) < 0)
        goto failed;
    if (owner != NULL && owner != Py_None) {
        PyObject *current = SLOT(ts, core->off_bwd_link);
        if (!same_owner(owner, current)) {
            PyObject *open = SLOT(ts, core->off_bwd_link_tok);
            PyObject *entry, *info, *started;
            if (open != NULL && open != Py_None) {
                Py_INCREF(open);
                if (core_end(core, open, ts) < 0) {
                    Py_DECREF(open);
                    goto failed;
                }
                Py_DECREF(open);
            }
            slot_set(ts, core->off_bwd_link, owner);
            entry = PyDict_GetItemWithError(w->entries, owner);
            if (entry == NULL && PyErr_Occurred())
                goto failed;
            info = entry != NULL && Py_IS_TYPE(entry, w->entry_type)
                   ? SLOT(entry, w->off_bwd_info) : NULL;
            if (info != NULL && info != Py_None) {
                Py_INCREF(info);
                started = core_begin(core, info, ts);
                Py_DECREF(info);
                if (started == NULL) {
                    slot_set(ts, core->off_bwd_link_tok, Py_None);
                    goto failed;
                }
            } else {
                started = Py_NewRef(Py_None);
            }
            slot_set(ts, core->off_bwd_link_tok, started);
            Py_DECREF(started);
        }
    } else if (w->function_ranges) {
        PyObject *current = SLOT(ts, core->off_bwd_link);
        if (current != NULL && current != Py_None) {
            PyObject *open = SLOT(ts, core->off_bwd_link_tok);
            if (open != NULL && open != Py_None) {
                Py_INCREF(open);
                if (core_end(core, open, ts) < 0) {
                    Py_DECREF(open);
                    goto failed;
                }
                Py_DECREF(open);
            }
            slot_set(ts, core->off_bwd_link, Py_None);
            slot_set(ts, core->off_bwd_link_tok, Py_None);
        }
    }
    if (w->function_ranges) {
        PyObject *info = function_info(w, func);
        if (info == NULL)
            goto failed;
        tok = core_begin(core, info, ts);
        Py_DECREF(info);
        if (tok == NULL)
            goto failed;
        if (tok == Py_None)
            Py_CLEAR(tok);
    }
    goto call;
failed:
    if (contain(w->fail) < 0) {
        Py_XDECREF(owner);
        Py_DECREF(ts);
        return NULL;
    }
call:
    Py_XDECREF(owner);
    return call_in_range(w, args, nargsf, kwnames, tok, ts);
}

/* -- the type ------------------------------------------------------------------------ */

static PyObject *wrapper_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                    PyObject *kwnames)
{
    Wrapper *w = (Wrapper *)self;
    w->sw->hits++;
    if (!w->sw->on)
        return call_original(w, args, nargsf, kwnames);
    switch (w->kind) {
    case KIND_LINK:
        return link_call(w, args, nargsf, kwnames);
    case KIND_APPLY:
        return apply_call(w, args, nargsf, kwnames);
    case KIND_BACKPROP:
        return backprop_call(w, args, nargsf, kwnames);
    default:
        return around_call(w, args, nargsf, kwnames);
    }
}

static int wrapper_traverse(Wrapper *w, visitproc visit, void *arg)
{
    Py_VISIT(w->original);
    Py_VISIT(w->sw);
    Py_VISIT(w->fail);
    Py_VISIT(w->enter);
    Py_VISIT(w->exit);
    Py_VISIT(w->core);
    Py_VISIT(w->roots);
    Py_VISIT(w->make_entry);
    Py_VISIT(w->outer_enter);
    Py_VISIT(w->outer_exit);
    Py_VISIT(w->entry_type);
    Py_VISIT(w->variable_type);
    Py_VISIT(w->infos_by_type);
    Py_VISIT(w->infos_by_label);
    Py_VISIT(w->new_info);
    Py_VISIT(w->default_label);
    Py_VISIT(w->entries);
    Py_VISIT(w->backward);
    if (w->entry_cache != NULL) {
        for (int i = 0; i < ENTRY_CACHE_SIZE; i++) {
            Py_VISIT(w->entry_cache[i].parent);
            Py_VISIT(w->entry_cache[i].entry);
        }
    }
    return 0;
}

static int wrapper_clear(Wrapper *w)
{
    Py_CLEAR(w->original);
    Py_CLEAR(w->sw);
    Py_CLEAR(w->fail);
    Py_CLEAR(w->enter);
    Py_CLEAR(w->exit);
    Py_CLEAR(w->core);
    Py_CLEAR(w->roots);
    Py_CLEAR(w->make_entry);
    Py_CLEAR(w->outer_enter);
    Py_CLEAR(w->outer_exit);
    Py_CLEAR(w->entry_type);
    Py_CLEAR(w->variable_type);
    Py_CLEAR(w->infos_by_type);
    Py_CLEAR(w->infos_by_label);
    Py_CLEAR(w->new_info);
    Py_CLEAR(w->default_label);
    Py_CLEAR(w->entries);
    Py_CLEAR(w->backward);
    if (w->entry_cache != NULL) {
        for (int i = 0; i < ENTRY_CACHE_SIZE; i++) {
            w->entry_cache[i].link = NULL;
            Py_CLEAR(w->entry_cache[i].parent);
            Py_CLEAR(w->entry_cache[i].entry);
        }
    }
    return 0;
}

static void wrapper_dealloc(Wrapper *w)
{
    PyObject_GC_UnTrack(w);
    if (w->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)w);
    wrapper_clear(w);
    PyMem_Free(w->entry_cache);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

/* Bound like a function: an instance gets a plain bound method. */
static PyObject *wrapper_descr_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

/* Attribute reads the wrapper does not answer itself go to the original. */
static PyObject *wrapper_getattro(PyObject *self, PyObject *name)
{
    PyObject *r = PyObject_GenericGetAttr(self, name);
    if (r != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError))
        return r;
    PyErr_Clear();
    return PyObject_GetAttr(((Wrapper *)self)->original, name);
}

static int wrapper_setattro(PyObject *self, PyObject *name, PyObject *value)
{
    return PyObject_SetAttr(((Wrapper *)self)->original, name, value);
}

static PyObject *wrapper_get_forwarded(Wrapper *w, void *name)
{
    return PyObject_GetAttrString(w->original, (const char *)name);
}

static int wrapper_set_forwarded(Wrapper *w, PyObject *value, void *name)
{
    return PyObject_SetAttrString(w->original, (const char *)name, value);
}

static PyObject *wrapper_get_wrapped(Wrapper *w, void *c) { return Py_NewRef(w->original); }

static PyObject *wrapper_get_switch(Wrapper *w, void *c) { return Py_NewRef((PyObject *)w->sw); }

static PyGetSetDef wrapper_getset[] = {
    {"__wrapped__", (getter)wrapper_get_wrapped, NULL, "the original", NULL},
    {"__doc__", (getter)wrapper_get_forwarded, (setter)wrapper_set_forwarded, NULL, "__doc__"},
    {"__name__", (getter)wrapper_get_forwarded, (setter)wrapper_set_forwarded, NULL,
     "__name__"},
    {"__qualname__", (getter)wrapper_get_forwarded, (setter)wrapper_set_forwarded, NULL,
     "__qualname__"},
    {"__module__", (getter)wrapper_get_forwarded, (setter)wrapper_set_forwarded, NULL,
     "__module__"},
    {"_chainer_autoprof_switch", (getter)wrapper_get_switch, NULL, "the patch's switch", NULL},
    {NULL}
};

/* Pickled as the original's global name, like a function. */
static PyObject *wrapper_reduce(Wrapper *w, PyObject *unused)
{
    return PyObject_GetAttr(w->original, str_qualname);
}

static PyObject *wrapper_repr(Wrapper *w)
{
    return PyUnicode_FromFormat("<chainer_autoprof wrapper of %R>", w->original);
}

static PyMethodDef wrapper_methods[] = {
    {"__reduce__", (PyCFunction)wrapper_reduce, METH_NOARGS, "pickled as the original"},
    {NULL}
};

static PyTypeObject WrapperType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "chainer_autoprof.runtime.hotpath._native.Wrapper",
    .tp_basicsize = sizeof(Wrapper),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL
                | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "A patched function: calls its hooks around the original, from C.",
    .tp_vectorcall_offset = offsetof(Wrapper, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = wrapper_descr_get,
    .tp_getattro = wrapper_getattro,
    .tp_setattro = wrapper_setattro,
    .tp_repr = (reprfunc)wrapper_repr,
    .tp_traverse = (traverseproc)wrapper_traverse,
    .tp_clear = (inquiry)wrapper_clear,
    .tp_dealloc = (destructor)wrapper_dealloc,
    .tp_weaklistoffset = offsetof(Wrapper, weakreflist),
    .tp_methods = wrapper_methods,
    .tp_getset = wrapper_getset,
};

static Wrapper *wrapper_make(int kind, PyObject *original, PyObject *sw, PyObject *fail,
                             int method)
{
    Wrapper *w;
    if (!Py_IS_TYPE(sw, &SwitchType)) {
        PyErr_SetString(PyExc_TypeError, "switch must be a Switch");
        return NULL;
    }
    if (!PyCallable_Check(original)) {
        PyErr_SetString(PyExc_TypeError, "the original is not callable");
        return NULL;
    }
    w = PyObject_GC_New(Wrapper, &WrapperType);
    if (w == NULL)
        return NULL;
    memset((char *)w + offsetof(Wrapper, vectorcall), 0,
           sizeof(Wrapper) - offsetof(Wrapper, vectorcall));
    w->vectorcall = wrapper_vectorcall;
    w->kind = kind;
    w->method = method;
    w->original = Py_NewRef(original);
    w->sw = (Switch *)Py_NewRef(sw);
    w->fail = Py_NewRef(fail);
    PyObject_GC_Track(w);
    return w;
}

static PyObject *mod_around(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *names[] = {"original", "switch", "enter", "exit", "fail", "method",
                            "replace_args", "proxy", NULL};
    PyObject *original, *sw, *enter, *exit, *fail;
    int method = 0, replace_args = 0, proxy = 0;
    Wrapper *w;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO|ppp", names, &original, &sw, &enter,
                                     &exit, &fail, &method, &replace_args, &proxy))
        return NULL;
    w = wrapper_make(KIND_AROUND, original, sw, fail, method);
    if (w == NULL)
        return NULL;
    w->enter = Py_NewRef(enter);
    w->exit = Py_NewRef(exit);
    w->replace_args = replace_args;
    return (PyObject *)w;
}

static int check_core(PyObject *core)
{
    if (!Py_IS_TYPE(core, &CoreType)) {
        PyErr_SetString(PyExc_TypeError, "core must be a Core");
        return -1;
    }
    return 0;
}

static PyObject *mod_link_wrapper(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *names[] = {"original", "switch", "fail", "core", "roots", "make_entry",
                            "outer_enter", "outer_exit", "entry_cls", "variable_cls",
                            "inner_links_matter", "attribute_backward", NULL};
    PyObject *original, *sw, *fail, *core, *roots, *make_entry, *outer_enter, *outer_exit;
    PyObject *entry_cls, *variable_cls;
    int inner = 1, attribute = 0;
    Wrapper *w;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO!OOOO!O!pp", names, &original, &sw, &fail,
                                     &core, &PyDict_Type, &roots, &make_entry, &outer_enter,
                                     &outer_exit, &PyType_Type, &entry_cls, &PyType_Type,
                                     &variable_cls, &inner, &attribute))
        return NULL;
    if (check_core(core) < 0)
        return NULL;
    w = wrapper_make(KIND_LINK, original, sw, fail, 1);
    if (w == NULL)
        return NULL;
    w->core = (Core *)Py_NewRef(core);
    w->roots = Py_NewRef(roots);
    w->make_entry = Py_NewRef(make_entry);
    w->outer_enter = Py_NewRef(outer_enter);
    w->outer_exit = Py_NewRef(outer_exit);
    w->entry_type = (PyTypeObject *)Py_NewRef(entry_cls);
    w->variable_type = (PyTypeObject *)Py_NewRef(variable_cls);
    w->inner_links_matter = inner;
    w->attribute_backward = attribute;
    w->entry_cache = PyMem_Calloc(ENTRY_CACHE_SIZE, sizeof(entry_slot));
    if (w->entry_cache == NULL) {
        Py_DECREF(w);
        return PyErr_NoMemory();
    }
    if (slot_offset(w->entry_type, "children", &w->off_children) < 0
        || slot_offset(w->entry_type, "ref", &w->off_ref) < 0
        || slot_offset(w->entry_type, "info", &w->off_info) < 0
        || slot_offset(w->entry_type, "index", &w->off_index) < 0) {
        Py_DECREF(w);
        return NULL;
    }
    return (PyObject *)w;
}

/* apply_wrapper / backprop_wrapper share their parameters. */
static PyObject *make_function_wrapper(int kind, PyObject *args, PyObject *kw)
{
    static char *names[] = {"original", "switch", "fail", "core", "new_info", "default_label",
                            "entry_cls", "entries", "backward", "function_ranges", "method",
                            NULL};
    PyObject *original, *sw, *fail, *core, *new_info, *default_label, *entry_cls;
    PyObject *entries = Py_None, *backward = Py_None;
    int function_ranges = 1, method = 0;
    Wrapper *w;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOO!|OOpp", names, &original, &sw, &fail,
                                     &core, &new_info, &default_label, &PyType_Type, &entry_cls,
                                     &entries, &backward, &function_ranges, &method))
        return NULL;
    if (check_core(core) < 0)
        return NULL;
    if (kind == KIND_BACKPROP && (!PyDict_Check(entries) || !PyUnicode_Check(backward))) {
        PyErr_SetString(PyExc_TypeError, "backprop_wrapper needs entries (dict) and backward");
        return NULL;
    }
    w = wrapper_make(kind, original, sw, fail, method);
    if (w == NULL)
        return NULL;
    w->core = (Core *)Py_NewRef(core);
    w->new_info = Py_NewRef(new_info);
    w->default_label = Py_NewRef(default_label);
    w->entry_type = (PyTypeObject *)Py_NewRef(entry_cls);
    w->entries = Py_NewRef(entries);
    w->backward = Py_NewRef(backward);
    if (PyUnicode_Check(backward))
        PyUnicode_InternInPlace(&w->backward);
    w->function_ranges = function_ranges;
    w->infos_by_type = PyDict_New();
    w->infos_by_label = PyDict_New();
    if (w->infos_by_type == NULL || w->infos_by_label == NULL
        || slot_offset(w->entry_type, "index", &w->off_index) < 0
        || slot_offset(w->entry_type, "bwd_info", &w->off_bwd_info) < 0) {
        Py_DECREF(w);
        return NULL;
    }
    return (PyObject *)w;
}

static PyObject *mod_apply_wrapper(PyObject *mod, PyObject *args, PyObject *kw)
{
    return make_function_wrapper(KIND_APPLY, args, kw);
}

static PyObject *mod_backprop_wrapper(PyObject *mod, PyObject *args, PyObject *kw)
{
    return make_function_wrapper(KIND_BACKPROP, args, kw);
}

static PyObject *mod_switch_of(PyObject *mod, PyObject *obj)
{
    if (Py_IS_TYPE(obj, &WrapperType))
        return Py_NewRef((PyObject *)((Wrapper *)obj)->sw);
    Py_RETURN_NONE;
}

static PyObject *mod_is_wrapper(PyObject *mod, PyObject *obj)
{
    return PyBool_FromLong(Py_IS_TYPE(obj, &WrapperType));
}

static PyMethodDef module_methods[] = {
    {"around", (PyCFunction)(void (*)(void))mod_around, METH_VARARGS | METH_KEYWORDS,
     "around(original, switch, enter, exit, fail, method=False, replace_args=False, "
     "proxy=False): a wrapper calling enter/exit hooks around the original."},
    {"link_wrapper", (PyCFunction)(void (*)(void))mod_link_wrapper,
     METH_VARARGS | METH_KEYWORDS, "The Link.__call__ wrapper."},
    {"apply_wrapper", (PyCFunction)(void (*)(void))mod_apply_wrapper,
     METH_VARARGS | METH_KEYWORDS, "The FunctionNode.apply wrapper."},
    {"backprop_wrapper", (PyCFunction)(void (*)(void))mod_backprop_wrapper,
     METH_VARARGS | METH_KEYWORDS, "The backprop_step wrapper."},
    {"switch_of", (PyCFunction)mod_switch_of, METH_O,
     "The Switch of a wrapper made here, else None."},
    {"is_wrapper", (PyCFunction)mod_is_wrapper, METH_O, "Whether obj is a wrapper made here."},
    {NULL}
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "chainer_autoprof.runtime.hotpath._native",
    .m_doc = "The native implementation of the hot path (the twin of python.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    PyObject *m;
    PyTypeObject *types[] = {&SwitchType, &NvtxDomainType, &NvtxAttrType, &RecordBufferType,
                             &RecorderHookType, &CoreType, &WrapperType};
    const char *type_names[] = {"Switch", "NvtxDomain", "NvtxAttr", "RecordBuffer",
                                "RecorderHook", "Core", "Wrapper"};

    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (PyType_Ready(types[i]) < 0)
            return NULL;
    str_open = PyUnicode_InternFromString("open");
    str_label = PyUnicode_InternFromString("label");
    str_node = PyUnicode_InternFromString("_node");
    str_creator_node = PyUnicode_InternFromString("_creator_node");
    str_link_attr = PyUnicode_InternFromString("_chainer_autoprof_link");
    str_qualname = PyUnicode_InternFromString("__qualname__");
    const_zero = PyLong_FromLong(0);
    if (!str_open || !str_label || !str_node || !str_creator_node || !str_link_attr
        || !str_qualname || !const_zero)
        return NULL;
    m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, type_names[i], (PyObject *)types[i]) < 0) {
            Py_DECREF(types[i]);
            Py_DECREF(m);
            return NULL;
        }
    }
    if (PyModule_AddIntConstant(m, "PROTOCOL", 2) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
