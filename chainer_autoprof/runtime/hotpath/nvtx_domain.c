/*
 * nvtx_domain.c -- NvtxDomain: one NVTX domain (twin of nvtx_domain.py), and the NVTX
 * sink the core runs: a range's prebuilt attributes (RangeInfo.nvtx, an NvtxAttr)
 * pushed at its begin, popped at its end.
 *
 * NVTX v3 is header-only: with no tool attached, nvtxDomainCreateA answers NULL and
 * the domain is off (`enabled` False).
 */

#include "native.h"

#include <nvtx3/nvToolsExt.h>

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
static PyObject *str_nvtx;
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

static PyObject *nvtx_domain_pop(NvtxDomain *self, PyObject *Py_UNUSED(unused))
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

/* -- the sink: what the core runs, and what a core that does not run it calls -------------- */

static inline NvtxAttr *prepared(Core *core, PyObject *info)
{
    PyObject *attr = SLOT(info, core->off_nvtx);
    return attr != NULL && Py_IS_TYPE(attr, &NvtxAttrType) ? (NvtxAttr *)attr : NULL;
}

static int nvtx_sink_begin(Core *core, PyObject *part, PyObject *info, PyObject *Py_UNUSED(ts))
{
    NvtxAttr *attr = prepared(core, info);
    if (attr != NULL)
        nvtxDomainRangePushEx(((NvtxDomain *)part)->domain, &attr->attr);
    return 0;
}

static int nvtx_sink_end(Core *core, PyObject *part, PyObject *info, int64_t Py_UNUSED(t0),
                         int64_t Py_UNUSED(t1), PyObject *Py_UNUSED(t0obj),
                         PyObject *Py_UNUSED(ts))
{
    if (prepared(core, info) != NULL)
        nvtxDomainRangePop(((NvtxDomain *)part)->domain);
    return 0;
}

const native_sink_kind nvtx_sink_kind = {
    .type = &NvtxDomainType,
    .begin = nvtx_sink_begin,
    .end = nvtx_sink_end,
};

/* begin(info, ts): push info.nvtx (the sink's call where no core runs the domain). */
static PyObject *nvtx_domain_begin(NvtxDomain *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *attr, *r;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "begin(info, ts)");
        return NULL;
    }
    attr = PyObject_GetAttr(args[0], str_nvtx);
    if (attr == NULL)
        return NULL;
    r = nvtx_domain_push(self, attr);
    Py_DECREF(attr);
    return r;
}

/* end(info, t0, t1, ts): pop. */
static PyObject *nvtx_domain_end(NvtxDomain *self, PyObject *const *Py_UNUSED(args),
                                 Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "end(info, t0, t1, ts)");
        return NULL;
    }
    nvtxDomainRangePop(self->domain);
    Py_RETURN_NONE;
}

/* -- the types -------------------------------------------------------------------------------- */

static PyObject *nvtx_domain_enabled(NvtxDomain *self, void *Py_UNUSED(c))
{
    return PyBool_FromLong(self->domain != NULL);
}

static PyMethodDef nvtx_domain_methods[] = {
    {"attributes", (PyCFunction)(void (*)(void))nvtx_domain_attributes,
     METH_VARARGS | METH_KEYWORDS,
     "Event attributes (message registered, category named; keep=False: a string not "
     "remembered)."},
    {"mark", (PyCFunction)(void (*)(void))nvtx_domain_mark, METH_VARARGS | METH_KEYWORDS,
     "An instantaneous marker."},
    {"push", (PyCFunction)nvtx_domain_push, METH_O, "Push a range with prebuilt attributes."},
    {"pop", (PyCFunction)nvtx_domain_pop, METH_NOARGS, "Pop the innermost range."},
    {"start_range", (PyCFunction)(void (*)(void))nvtx_domain_start_range,
     METH_VARARGS | METH_KEYWORDS, "Start a process-wide range; returns its id."},
    {"end_range", (PyCFunction)nvtx_domain_end_range, METH_O, "End a range by id."},
    {"begin", (PyCFunction)(void (*)(void))nvtx_domain_begin, METH_FASTCALL,
     "begin(info, ts): push info.nvtx (the NVTX sink's begin)."},
    {"end", (PyCFunction)(void (*)(void))nvtx_domain_end, METH_FASTCALL,
     "end(info, t0, t1, ts): pop (the NVTX sink's end)."},
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
    NATIVE_TYPE_HEAD("NvtxDomain", NvtxDomain, nvtx_domain_new, nvtx_domain_dealloc),
    .tp_doc = "NvtxDomain(name): one NVTX domain, its strings, categories and attributes.",
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
    NATIVE_TYPE_HEAD("NvtxAttr", NvtxAttr, NULL, nvtx_attr_dealloc),
    .tp_doc = "Prebuilt NVTX event attributes.",
};

int nvtx_ready(PyObject *module)
{
    if (intern_strings(&str_nvtx, "nvtx", NULL) < 0)
        return -1;
    return add_types(module, &NvtxDomainType, &NvtxAttrType, NULL);
}
