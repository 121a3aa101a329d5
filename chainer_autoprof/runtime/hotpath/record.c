/*
 * record.c -- the recorder's rows (twin of record.py): RecordBuffer, a thread's
 * (index, t0, t1, depth) int64 rows, and RecorderHook, the recorder sink the core runs:
 * one row appended per range that ends, the iteration's range handed to Python (its
 * row carries the iteration's number), a full buffer flushed by Python.
 */

#include "native.h"

typedef struct {
    PyObject_HEAD
    int64_t *data;
    Py_ssize_t n;         /* rows */
    Py_ssize_t capacity;  /* rows */
} RecordBuffer;

static PyTypeObject RecordBufferType;
static PyObject *str_record, *str_index, *str_stack;

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

static PyObject *record_buffer_new(PyTypeObject *Py_UNUSED(type), PyObject *args, PyObject *kw)
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
    int64_t v[4];
    PyObject *seq = PySequence_Fast(row, "append() takes (index, t0, t1, depth)");
    if (seq == NULL)
        return NULL;
    if (PySequence_Fast_GET_SIZE(seq) != 4) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "append() takes (index, t0, t1, depth)");
        return NULL;
    }
    for (int i = 0; i < 4; i++) {
        if (int64_from(PySequence_Fast_GET_ITEM(seq, i), &v[i]) < 0) {
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
static PyObject *record_buffer_copy(RecordBuffer *self, PyObject *Py_UNUSED(unused))
{
    return PyByteArray_FromStringAndSize((const char *)self->data,
                                         self->n * 4 * (Py_ssize_t)sizeof(int64_t));
}

static PyObject *record_buffer_take(RecordBuffer *self, PyObject *Py_UNUSED(unused))
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
    NATIVE_TYPE_HEAD("RecordBuffer", RecordBuffer, record_buffer_new, record_buffer_dealloc),
    .tp_doc = "RecordBuffer(capacity): a thread's recorded ranges, int64 rows of 4.",
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

/* What a RecorderHook holds (VISIT_FIELD, CLEAR_FIELD). */
#define RECORDER_HOOK_OBJECTS(F) F(iter_info) F(iteration_ended) F(flush)

static int recorder_hook_traverse(RecorderHook *self, visitproc visit, void *arg)
{
    RECORDER_HOOK_OBJECTS(VISIT_FIELD)
    return 0;
}

static int recorder_hook_clear(RecorderHook *self)
{
    RECORDER_HOOK_OBJECTS(CLEAR_FIELD)
    return 0;
}

static void recorder_hook_dealloc(RecorderHook *self)
{
    PyObject_GC_UnTrack(self);
    recorder_hook_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The recorder's append for a range that ended (ts.stack already popped), into the
 * thread's RecordBuffer `buf` (borrowed); `depth` is the range's. */
static int record_row(RecorderHook *rec, PyObject *buf, PyObject *ts, PyObject *info,
                      int64_t index, int64_t t0, int64_t t1, Py_ssize_t depth,
                      PyObject *t0obj)
{
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
    if (record_buffer_append((RecordBuffer *)buf, index, t0, t1, depth) < 0)
        return -1;
    if (((RecordBuffer *)buf)->n >= rec->capacity) {
        PyObject *r = call1(rec->flush, ts);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* The sink's end, as the core runs it: ts and info read at their slots. */
static int record_sink_end(Core *core, PyObject *part, PyObject *info, int64_t t0, int64_t t1,
                           PyObject *t0obj, PyObject *ts)
{
    RecorderHook *rec = (RecorderHook *)part;
    PyObject *buf = SLOT(ts, core->off_record);
    PyObject *index_obj, *stack;
    int64_t index = 0;

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
    if (info != rec->iter_info) {
        index_obj = SLOT(info, core->off_index);
        if (index_obj == NULL) {
            PyErr_SetString(PyExc_AttributeError, "index");
            return -1;
        }
        if (int64_from(index_obj, &index) < 0)
            return -1;
    }
    stack = SLOT(ts, core->off_stack);
    return record_row(rec, buf, ts, info, index, t0, t1,
                      stack != NULL ? PyList_GET_SIZE(stack) : 0, t0obj);
}

const native_sink_kind record_sink_kind = {
    .type = &RecorderHookType,
    .begin = NULL,
    .end = record_sink_end,
};

/* end(info, t0, t1, ts): the same append, called from Python (where no core runs the hook). */
static PyObject *recorder_hook_end(RecorderHook *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *info, *ts, *buf, *stack;
    int64_t index = 0, t0, t1;
    Py_ssize_t depth;
    int rc;

    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "end(info, t0, t1, ts)");
        return NULL;
    }
    info = args[0];
    ts = args[3];
    if (int64_from(args[1], &t0) < 0 || int64_from(args[2], &t1) < 0)
        return NULL;
    buf = PyObject_GetAttr(ts, str_record);
    if (buf == NULL)
        return NULL;
    if (!Py_IS_TYPE(buf, &RecordBufferType)) {
        Py_DECREF(buf);
        buf = (PyObject *)record_buffer_make(self->capacity);
        if (buf == NULL || PyObject_SetAttr(ts, str_record, buf) < 0) {
            Py_XDECREF(buf);
            return NULL;
        }
    }
    if (info != self->iter_info) {
        PyObject *index_obj = PyObject_GetAttr(info, str_index);
        if (index_obj == NULL)
            goto error;
        rc = int64_from(index_obj, &index);
        Py_DECREF(index_obj);
        if (rc < 0)
            goto error;
    }
    stack = PyObject_GetAttr(ts, str_stack);
    if (stack == NULL)
        goto error;
    depth = PyObject_Length(stack);
    Py_DECREF(stack);
    if (depth < 0)
        goto error;
    rc = record_row(self, buf, ts, info, index, t0, t1, depth, args[1]);
    Py_DECREF(buf);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
error:
    Py_DECREF(buf);
    return NULL;
}

/* The rows ts.record holds as int64 bytes; take: the buffer emptied in the same step. */
static PyObject *recorder_hook_rows(PyObject *ts, int take)
{
    PyObject *buf = PyObject_GetAttr(ts, str_record);
    if (buf == NULL)
        return NULL;
    PyObject *out;
    if (Py_IS_TYPE(buf, &RecordBufferType))
        out = take ? record_buffer_take((RecordBuffer *)buf, NULL)
                   : record_buffer_copy((RecordBuffer *)buf, NULL);
    else if (buf == Py_None)
        out = PyByteArray_FromStringAndSize(NULL, 0);
    else
        out = PyErr_Format(PyExc_TypeError, "ts.record is a %.100s, not a RecordBuffer",
                           Py_TYPE(buf)->tp_name);
    Py_DECREF(buf);
    return out;
}

static PyObject *recorder_hook_take(PyObject *Py_UNUSED(self), PyObject *ts)
{
    return recorder_hook_rows(ts, 1);
}

static PyObject *recorder_hook_copy(PyObject *Py_UNUSED(self), PyObject *ts)
{
    return recorder_hook_rows(ts, 0);
}

static PyMethodDef recorder_hook_methods[] = {
    {"end", (PyCFunction)(void (*)(void))recorder_hook_end, METH_FASTCALL,
     "end(info, t0, t1, ts): append the range's row to ts.record (the recorder sink's end)."},
    {"take", (PyCFunction)recorder_hook_take, METH_O,
     "take(ts): the rows ts buffered as int64 bytes, its buffer emptied."},
    {"copy", (PyCFunction)recorder_hook_copy, METH_O,
     "copy(ts): the rows ts buffered as int64 bytes (a copy)."},
    {NULL}
};

static PyTypeObject RecorderHookType = {
    NATIVE_GC_TYPE_HEAD("RecorderHook", RecorderHook, recorder_hook_new, recorder_hook_dealloc,
                        recorder_hook_traverse, recorder_hook_clear, 0),
    .tp_doc = "RecorderHook(capacity, iter_info, iteration_ended, flush): the recorder, "
              "run by the core.",
    .tp_methods = recorder_hook_methods,
};

int record_ready(PyObject *module)
{
    if (intern_strings(&str_record, "record", &str_index, "index", &str_stack, "stack",
                       NULL) < 0)
        return -1;
    return add_types(module, &RecordBufferType, &RecorderHookType, NULL);
}
