/*
 * util.c -- what the other C files share: slots of Python classes, our own errors, the
 * module's parts added to it.
 */

#include "native.h"

#include <stdarg.h>
#include <string.h>

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

int slot_offsets(PyTypeObject *type, ...)
{
    va_list pairs;
    const char *name;
    int rc = 0;

    va_start(pairs, type);
    while (rc == 0 && (name = va_arg(pairs, const char *)) != NULL)
        rc = slot_offset(type, name, va_arg(pairs, Py_ssize_t *));
    va_end(pairs);
    return rc;
}

int intern_strings(PyObject **out, const char *text, ...)
{
    va_list pairs;
    int rc = 0;

    va_start(pairs, text);
    for (;;) {
        *out = PyUnicode_InternFromString(text);
        if (*out == NULL) {
            rc = -1;
            break;
        }
        out = va_arg(pairs, PyObject **);
        if (out == NULL)
            break;
        text = va_arg(pairs, const char *);
    }
    va_end(pairs);
    return rc;
}

PyObject *fetch_exception(void)
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

int contain(PyObject *fail)
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

void restore_error(saved_error *s)
{
    if (s->type == NULL)
        return;
    if (PyErr_Occurred())  /* cannot happen: what we did in between was contained */
        PyErr_WriteUnraisable(NULL);
    PyErr_Restore(s->type, s->value, s->tb);
    s->type = s->value = s->tb = NULL;
}

void after_call_error(PyObject *fail, saved_error *ours)
{
    if (contain(fail) == 0)
        return;
    if (ours->type == NULL)
        save_error(ours);
    else
        PyErr_Clear();
}

int add_types(PyObject *module, ...)
{
    va_list types;
    PyTypeObject *type;
    int rc = 0;

    va_start(types, module);
    while (rc == 0 && (type = va_arg(types, PyTypeObject *)) != NULL) {
        if (PyType_Ready(type) < 0) {
            rc = -1;
            break;
        }
        Py_INCREF(type);
        rc = PyModule_AddObject(module, strrchr(type->tp_name, '.') + 1, (PyObject *)type);
        if (rc < 0)
            Py_DECREF(type);
    }
    va_end(types);
    return rc;
}
