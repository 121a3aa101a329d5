/*
 * wrappers.c -- what replaces a patched function (twin of wrappers.py).
 *
 *   Switch   a patch's on/off state and hit count.
 *   Wrapper  a function-like callable with vectorcall that is a method descriptor (an
 *            instance's call reaches it unbound, and its __get__ returns a plain bound
 *            method, so bound methods pickle and deepcopy as usual), attribute reads
 *            forwarded to the original, pickled as the original's global name.  Kinds:
 *            "around" (Python enter/exit hooks called before and after the original,
 *            from C: no Python frame of ours is on the stack while the user's code runs),
 *            "link", "apply" and "backprop" (the hot targets, entirely in C, calling
 *            Python only for rare events; their ranges go through the core).
 */

#include "native.h"

/* ================================================================================= */
/* Switch: a patch's on/off state and hit count                                      */
/* ================================================================================= */

typedef struct {
    PyObject_HEAD
    int on;
    long long hits;
} Switch;

static PyTypeObject SwitchType;

static PyObject *switch_new(PyTypeObject *type, PyObject *Py_UNUSED(args), PyObject *Py_UNUSED(kw))
{
    Switch *self = (Switch *)type->tp_alloc(type, 0);
    if (self != NULL)
        self->on = 1;
    return (PyObject *)self;
}

static PyObject *switch_get_on(Switch *self, void *Py_UNUSED(c))
{
    return PyBool_FromLong(self->on);
}

static int switch_set_on(Switch *self, PyObject *v, void *Py_UNUSED(c))
{
    int on = v == NULL ? 0 : PyObject_IsTrue(v);
    if (on < 0)
        return -1;
    self->on = on;
    return 0;
}

static PyObject *switch_get_hits(Switch *self, void *Py_UNUSED(c))
{
    return PyLong_FromLongLong(self->hits);
}

static int switch_set_hits(Switch *self, PyObject *v, void *Py_UNUSED(c))
{
    int64_t hits;
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete hits");
        return -1;
    }
    if (int64_from(v, &hits) < 0)
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
    NATIVE_TYPE_HEAD("Switch", Switch, switch_new, NULL),
    .tp_doc = "A patch's state: on (the hook runs) and hits (calls seen).",
    .tp_getset = switch_getset,
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

/* Our error before anything of ours began: contained, and the original called as if it were
 * not patched; else (KeyboardInterrupt) raised. */
static PyObject *call_after_own_error(Wrapper *w, PyObject *const *args, size_t nargsf,
                                      PyObject *kwnames)
{
    if (contain(w->fail) < 0)
        return NULL;
    return call_original(w, args, nargsf, kwnames);
}

/* Begin `info` on `ts`: 0 with `*tok` the token to end after the call (NULL: nothing was
 * emitted, nothing to end), or -1 with an error. */
static ALWAYS_INLINE int begin_range(Core *core, PyObject *info, PyObject *ts,
                                     PyObject **tok)
{
    PyObject *token = core_begin(core, info, ts);
    if (token == NULL)
        return -1;
    if (token == Py_None) {
        Py_DECREF(token);
        token = NULL;
    }
    *tok = token;
    return 0;
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

/* Whether `entry` (a link entry) is `link`'s: its weak reference still points at it. */
static ALWAYS_INLINE int entry_of(Wrapper *w, PyObject *entry, PyObject *link)
{
    PyObject *ref = SLOT(entry, w->off_ref);
    return ref != NULL && PyWeakref_Check(ref) && PyWeakref_GET_OBJECT(ref) == link;
}

static NOINLINE PyObject *link_call(Wrapper *w, PyObject *const *args, size_t nargsf,
                                    PyObject *kwnames)
{
    Core *core = w->core;
    PyObject *instance, *ts, *links, *parent = NULL, *table, *key = NULL, *entry = NULL;
    PyObject *mode = NULL, *tok = NULL, *out, *info;
    entry_slot *slot = NULL;
    Py_ssize_t n;
    int pushed = 0;

    if (PyVectorcall_NARGS(nargsf) < 1)
        return call_original(w, args, nargsf, kwnames);
    instance = args[0];
    ts = core_state(core);
    if (ts == NULL)
        return call_after_own_error(w, args, nargsf, kwnames);
    links = SLOT(ts, core->off_links);
    if (links == NULL || !PyList_Check(links)) {
        PyErr_SetString(PyExc_TypeError, "ThreadState.links is not a list");
        return call_after_own_error(w, args, nargsf, kwnames);
    }
    n = PyList_GET_SIZE(links);
    if (n > 0) {
        parent = PyList_GET_ITEM(links, n - 1);
        if (!w->inner_links_matter)
            return call_original(w, args, nargsf, kwnames);  /* inner links: nothing to do */
        if (Py_IS_TYPE(parent, w->entry_type) && entry_of(w, parent, instance))
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
        if (slot->link == instance && slot->parent == parent_key && slot->entry != NULL
            && entry_of(w, slot->entry, instance))
            entry = Py_NewRef(slot->entry);
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
        if (Py_IS_TYPE(entry, w->entry_type) && entry_of(w, entry, instance))
            Py_INCREF(entry);
        else
            entry = NULL;
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
    if (info != NULL && info != Py_None && begin_range(core, info, ts, &tok) < 0)
        goto enter_failed;
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
static ALWAYS_INLINE PyObject *call_in_range(Wrapper *w, PyObject *const *args,
                                             size_t nargsf, PyObject *kwnames, PyObject *tok,
                                             PyObject *ts)
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

/* Our error on the way in, before a range of ours began: contained, and the original called
 * (`ts` let go after it); else (KeyboardInterrupt) raised. */
static PyObject *call_after_enter_error(Wrapper *w, PyObject *const *args, size_t nargsf,
                                        PyObject *kwnames, PyObject *ts)
{
    if (contain(w->fail) < 0) {
        Py_DECREF(ts);
        return NULL;
    }
    return call_in_range(w, args, nargsf, kwnames, NULL, ts);
}

/* The original call inside a range of `info` begun on `ts` (both ours; `info` let go once
 * the range began): our error in beginning it is contained, and the call goes on. */
static ALWAYS_INLINE PyObject *call_in_new_range(Wrapper *w, PyObject *const *args,
                                                 size_t nargsf, PyObject *kwnames,
                                                 PyObject *info, PyObject *ts)
{
    PyObject *tok;
    int rc = begin_range(w->core, info, ts, &tok);
    Py_DECREF(info);
    if (rc < 0)
        return call_after_enter_error(w, args, nargsf, kwnames, ts);
    return call_in_range(w, args, nargsf, kwnames, tok, ts);
}

/* -- FunctionNode.apply ------------------------------------------------------------------ */

static NOINLINE PyObject *apply_call(Wrapper *w, PyObject *const *args, size_t nargsf,
                                     PyObject *kwnames)
{
    Core *core = w->core;
    PyObject *ts = core_state(core), *node, *info = NULL, *links;

    if (ts == NULL)
        return call_after_own_error(w, args, nargsf, kwnames);
    if (PyVectorcall_NARGS(nargsf) < 1)
        return call_original(w, args, nargsf, kwnames);
    node = args[0];
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
    return call_in_new_range(w, args, nargsf, kwnames, info, ts);
failed:
    Py_XDECREF(info);
    return call_after_enter_error(w, args, nargsf, kwnames, ts);
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

/* End the range of the backward's link open on `ts` (its bwd_link_tok), if one is: 0, or -1. */
static ALWAYS_INLINE int end_backward_link(Core *core, PyObject *ts)
{
    PyObject *open = SLOT(ts, core->off_bwd_link_tok);
    int rc;
    if (open == NULL || open == Py_None)
        return 0;
    Py_INCREF(open);
    rc = core_end(core, open, ts);
    Py_DECREF(open);
    return rc;
}

static NOINLINE PyObject *backprop_call(Wrapper *w, PyObject *const *args, size_t nargsf,
                                        PyObject *kwnames)
{
    Core *core = w->core;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *ts, *phase, *func = NULL, *owner = NULL, *info;

    ts = core_state(core);
    if (ts == NULL)
        return call_after_own_error(w, args, nargsf, kwnames);
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
            PyObject *entry, *bwd_info, *started;
            if (end_backward_link(core, ts) < 0)
                goto failed;
            slot_set(ts, core->off_bwd_link, owner);
            entry = PyDict_GetItemWithError(w->entries, owner);
            if (entry == NULL && PyErr_Occurred())
                goto failed;
            bwd_info = entry != NULL && Py_IS_TYPE(entry, w->entry_type)
                       ? SLOT(entry, w->off_bwd_info) : NULL;
            if (bwd_info != NULL && bwd_info != Py_None) {
                Py_INCREF(bwd_info);
                started = core_begin(core, bwd_info, ts);
                Py_DECREF(bwd_info);
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
            if (end_backward_link(core, ts) < 0)
                goto failed;
            slot_set(ts, core->off_bwd_link, Py_None);
            slot_set(ts, core->off_bwd_link_tok, Py_None);
        }
    }
    Py_CLEAR(owner);
    if (!w->function_ranges)
        return call_in_range(w, args, nargsf, kwnames, NULL, ts);
    info = function_info(w, func);
    if (info == NULL)
        goto failed;
    return call_in_new_range(w, args, nargsf, kwnames, info, ts);
failed:
    Py_XDECREF(owner);
    return call_after_enter_error(w, args, nargsf, kwnames, ts);
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

/* What a Wrapper holds, beside its cache of link entries (VISIT_FIELD, CLEAR_FIELD). */
#define WRAPPER_OBJECTS(F)                                                                   \
    F(original) F(sw) F(fail) F(enter) F(exit) F(core) F(roots) F(make_entry) F(outer_enter) \
    F(outer_exit) F(entry_type) F(variable_type) F(infos_by_type) F(infos_by_label)          \
    F(new_info) F(default_label) F(entries) F(backward)

static int wrapper_traverse(Wrapper *self, visitproc visit, void *arg)
{
    WRAPPER_OBJECTS(VISIT_FIELD)
    if (self->entry_cache != NULL) {
        for (int i = 0; i < ENTRY_CACHE_SIZE; i++) {
            Py_VISIT(self->entry_cache[i].parent);
            Py_VISIT(self->entry_cache[i].entry);
        }
    }
    return 0;
}

static int wrapper_clear(Wrapper *self)
{
    WRAPPER_OBJECTS(CLEAR_FIELD)
    if (self->entry_cache != NULL) {
        for (int i = 0; i < ENTRY_CACHE_SIZE; i++) {
            self->entry_cache[i].link = NULL;
            Py_CLEAR(self->entry_cache[i].parent);
            Py_CLEAR(self->entry_cache[i].entry);
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
static PyObject *wrapper_descr_get(PyObject *self, PyObject *obj, PyObject *Py_UNUSED(type))
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

static PyObject *wrapper_get_wrapped(Wrapper *w, void *Py_UNUSED(c))
{
    return Py_NewRef(w->original);
}

static PyObject *wrapper_get_switch(Wrapper *w, void *Py_UNUSED(c))
{
    return Py_NewRef((PyObject *)w->sw);
}

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
static PyObject *wrapper_reduce(Wrapper *w, PyObject *Py_UNUSED(unused))
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
    NATIVE_GC_TYPE_HEAD("Wrapper", Wrapper, NULL, wrapper_dealloc, wrapper_traverse,
                        wrapper_clear, Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR),
    .tp_doc = "A patched function: calls its hooks around the original, from C.",
    .tp_vectorcall_offset = offsetof(Wrapper, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = wrapper_descr_get,
    .tp_getattro = wrapper_getattro,
    .tp_setattro = wrapper_setattro,
    .tp_repr = (reprfunc)wrapper_repr,
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

static PyObject *mod_around(PyObject *Py_UNUSED(mod), PyObject *args, PyObject *kw)
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

static PyObject *mod_link_wrapper(PyObject *Py_UNUSED(mod), PyObject *args, PyObject *kw)
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
    if (slot_offsets(w->entry_type, "children", &w->off_children, "ref", &w->off_ref,
                     "info", &w->off_info, "index", &w->off_index, NULL) < 0) {
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
        || slot_offsets(w->entry_type, "index", &w->off_index, "bwd_info", &w->off_bwd_info,
                        NULL) < 0) {
        Py_DECREF(w);
        return NULL;
    }
    return (PyObject *)w;
}

static PyObject *mod_apply_wrapper(PyObject *Py_UNUSED(mod), PyObject *args, PyObject *kw)
{
    return make_function_wrapper(KIND_APPLY, args, kw);
}

static PyObject *mod_backprop_wrapper(PyObject *Py_UNUSED(mod), PyObject *args, PyObject *kw)
{
    return make_function_wrapper(KIND_BACKPROP, args, kw);
}

static PyObject *mod_switch_of(PyObject *Py_UNUSED(mod), PyObject *obj)
{
    if (Py_IS_TYPE(obj, &WrapperType))
        return Py_NewRef((PyObject *)((Wrapper *)obj)->sw);
    Py_RETURN_NONE;
}

static PyObject *mod_is_wrapper(PyObject *Py_UNUSED(mod), PyObject *obj)
{
    return PyBool_FromLong(Py_IS_TYPE(obj, &WrapperType));
}


static PyMethodDef wrapper_functions[] = {
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

int wrappers_ready(PyObject *module)
{
    if (intern_strings(&str_label, "label", &str_node, "_node",
                       &str_creator_node, "_creator_node",
                       &str_link_attr, "_chainer_autoprof_link",
                       &str_qualname, "__qualname__", NULL) < 0
        || add_types(module, &SwitchType, &WrapperType, NULL) < 0)
        return -1;
    return PyModule_AddFunctions(module, wrapper_functions);
}
