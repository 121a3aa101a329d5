/*
 * util.c -- what the other C files share: slots of Python classes, our own errors.
 */

#include "native.h"

int slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *out)
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

int add_type(PyObject *module, PyTypeObject *type, const char *name)
{
    if (PyType_Ready(type) < 0)
        return -1;
    Py_INCREF(type);
    if (PyModule_AddObject(module, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}
