/* The census's full heap pass in one walk of the collector's lists, without listing every object.
 *
 * gc.get_objects() builds a list of every gc-tracked object (350k in a trainer process), taking
 * a reference to each; tbmem/census/layout.py then reads every object's type pointer again and
 * the list is released, touching every object a third time. Here the collector's lists are
 * walked once and only the objects whose exact type is wanted are kept: the type pointer sits in
 * the cache line the walk has just read.
 *
 * CPython 3.12 and later: PyUnstable_GC_VisitObjects. 3.10 and 3.11 have no such API: the
 * interpreter's generation lists are read through CPython's internal headers (installed with
 * every CPython; the same layout in 3.10 and 3.11). The free-threaded build is refused (the
 * Python caller falls back to gc.get_objects()).
 *
 * Nothing runs Python code, allocates a tracked object or changes a reference count during the
 * walk (the chosen objects are collected as raw pointers, with the GIL held, so none can go away);
 * their references are taken before the result list is created, as that allocation can collect.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX < 0x030C0000
#undef _PyGC_FINALIZED /* cpython/objimpl.h and internal/pycore_gc.h both define it */
#define Py_BUILD_CORE 1
#include "internal/pycore_interp.h"
#undef Py_BUILD_CORE
#endif

#define TABLE_BITS 16

typedef struct {
    uintptr_t *wanted; /* sorted addresses of the wanted types */
    Py_ssize_t n_wanted;
    unsigned char table[1 << TABLE_BITS]; /* a cheap first test on the type address */
    PyObject **chosen;
    Py_ssize_t n_chosen, capacity;
    int out_of_memory;
} Selection;

static inline Py_ssize_t slot(uintptr_t type) { return (Py_ssize_t)((type >> 4) & ((1 << TABLE_BITS) - 1)); }

static inline int wanted(const Selection *s, uintptr_t type) {
    if (!s->table[slot(type)]) {
        return 0;
    }
    Py_ssize_t lo = 0, hi = s->n_wanted;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (s->wanted[mid] < type) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo < s->n_wanted && s->wanted[lo] == type;
}

static int consider(Selection *s, PyObject *op) {
    if (!wanted(s, (uintptr_t)Py_TYPE(op))) {
        return 1;
    }
    if (s->n_chosen == s->capacity) {
        Py_ssize_t capacity = s->capacity ? 2 * s->capacity : 1024;
        PyObject **grown = PyMem_RawRealloc(s->chosen, (size_t)capacity * sizeof(PyObject *));
        if (grown == NULL) {
            s->out_of_memory = 1;
            return 0;
        }
        s->chosen = grown;
        s->capacity = capacity;
    }
    s->chosen[s->n_chosen++] = op;
    return 1;
}

static int compare_addresses(const void *a, const void *b) {
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return (x > y) - (x < y);
}

#if PY_VERSION_HEX >= 0x030C0000
static int visit(PyObject *op, void *arg) { return consider((Selection *)arg, op); }
#endif

static void walk(Selection *s) {
#if PY_VERSION_HEX >= 0x030C0000
    PyUnstable_GC_VisitObjects(visit, s);
#else
    struct _gc_runtime_state *gcstate = &PyInterpreterState_Get()->gc;
    for (int g = 0; g < NUM_GENERATIONS; g++) {
        PyGC_Head *head = &gcstate->generations[g].head;
        for (PyGC_Head *gc = (PyGC_Head *)head->_gc_next; gc != head; gc = (PyGC_Head *)gc->_gc_next) {
            if (!consider(s, (PyObject *)(gc + 1))) {
                return;
            }
        }
    }
#endif
}

static PyObject *select_tracked(PyObject *module, PyObject *types) {
#ifdef Py_GIL_DISABLED
    PyErr_SetString(PyExc_NotImplementedError, "the free-threaded build has no generation lists to walk");
    return NULL;
#endif
    PyObject *seq = PySequence_Fast(types, "types must be a sequence of types");
    if (seq == NULL) {
        return NULL;
    }
    Selection *s = PyMem_RawCalloc(1, sizeof(Selection));
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    uintptr_t *addresses = s ? PyMem_RawMalloc((size_t)(n ? n : 1) * sizeof(uintptr_t)) : NULL;
    if (addresses == NULL) {
        PyMem_RawFree(s);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *type = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyType_Check(type)) {
            PyMem_RawFree(addresses);
            PyMem_RawFree(s);
            Py_DECREF(seq);
            return PyErr_Format(PyExc_TypeError, "types must hold types, got %.100s", Py_TYPE(type)->tp_name);
        }
        addresses[i] = (uintptr_t)type;
        s->table[slot((uintptr_t)type)] = 1;
    }
    qsort(addresses, (size_t)n, sizeof(uintptr_t), compare_addresses);
    s->wanted = addresses;
    s->n_wanted = n;
    walk(s); /* seq holds the types: none can be collected meanwhile */
    /* References first: creating the list can start a collection, which may free an object of an
     * unreachable cycle that only a raw pointer here would still name. */
    for (Py_ssize_t i = 0; i < s->n_chosen; i++) {
        Py_INCREF(s->chosen[i]);
    }
    PyObject *result = s->out_of_memory ? PyErr_NoMemory() : PyList_New(s->n_chosen);
    for (Py_ssize_t i = 0; i < s->n_chosen; i++) {
        if (result != NULL) {
            PyList_SET_ITEM(result, i, s->chosen[i]); /* the list takes the reference */
        } else {
            Py_DECREF(s->chosen[i]);
        }
    }
    PyMem_RawFree(s->chosen);
    PyMem_RawFree(addresses);
    PyMem_RawFree(s);
    Py_DECREF(seq);
    return result;
}

/* ---- select_listed: the items of a list whose exact type is in a set ----------------------
 *
 * The incremental scan selects, out of the young generations (a few thousand objects), those of
 * about a thousand types: in Python, one type() and one set lookup per object at interpreter speed.
 */
static PyObject *select_listed(PyObject *module, PyObject *args) {
    PyObject *objs, *types, *marker;
    if (!PyArg_ParseTuple(args, "O!OO:select_listed", &PyList_Type, &objs, &types, &marker)) {
        return NULL;
    }
    if (!PyAnySet_Check(types)) {
        return PyErr_Format(PyExc_TypeError, "types must be a set or frozenset, got %.100s", Py_TYPE(types)->tp_name);
    }
    PyObject *chosen = PyList_New(0);
    int marked = 0;
    /* the list may change while we look (a set lookup can run a metaclass's __eq__): index each time */
    for (Py_ssize_t i = 0; chosen != NULL && i < PyList_GET_SIZE(objs); i++) {
        PyObject *item = PyList_GET_ITEM(objs, i);
        marked |= item == marker;
        Py_INCREF(item);
        int hit = PySet_Contains(types, (PyObject *)Py_TYPE(item));
        if (hit < 0 || (hit && PyList_Append(chosen, item) < 0)) {
            Py_CLEAR(chosen);
        }
        Py_DECREF(item);
    }
    if (chosen == NULL) {
        return NULL;
    }
    return Py_BuildValue("(NO)", chosen, marked ? Py_True : Py_False);
}

/* ---- instances_below: instances of given types reachable through gc referents ------------------
 *
 * tbmem/census/walk.py's _instances_below, eagerly and in one call: the frame walk looks below some
 * hundred local variables per census, each costing a few microseconds of list and set building in
 * Python for typically a dozen referents. The same objects are visited in the same order, the
 * same budget is spent, the same instances come back in the same order.
 */
static int descends(PyTypeObject *kind) {
    /* objects that can hold references, but not modules, types or functions (which lead everywhere) */
    return PyType_HasFeature(kind, Py_TPFLAGS_HAVE_GC) && !PyType_IsSubtype(kind, &PyType_Type) &&
           !PyType_IsSubtype(kind, &PyModule_Type) && !PyType_IsSubtype(kind, &PyCFunction_Type) &&
           !PyType_IsSubtype(kind, &PyFunction_Type);
}

static int append_referent(PyObject *obj, void *list) { return PyList_Append((PyObject *)list, obj) < 0; }

static int is_container(PyObject *o) {
    return PyList_CheckExact(o) || PyTuple_CheckExact(o) || PyDict_CheckExact(o) || PySet_CheckExact(o) ||
           PyFrozenSet_CheckExact(o);
}

/* At most ``limit`` referents of ``level`` (gc.get_referents's order), without listing all items of
 * a huge container: those containers' items (a dict's values) come last, up to the limit. */
static PyObject *bounded_referents(PyObject *level, Py_ssize_t limit) {
    PyObject *refs = PyList_New(0), *big = PyList_New(0);
    if (refs == NULL || big == NULL) {
        goto fail;
    }
    Py_ssize_t n = PyList_GET_SIZE(level);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyList_GET_ITEM(level, i);
        if (is_container(o) && PyObject_Length(o) > limit) {
            if (PyList_Append(big, o) < 0) {
                goto fail;
            }
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyList_GET_ITEM(level, i);
        int skip = 0;
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(big); j++) {
            skip |= PyList_GET_ITEM(big, j) == o;
        }
        if (skip || !PyObject_IS_GC(o) || Py_TYPE(o)->tp_traverse == NULL) {
            continue;
        }
        if (Py_TYPE(o)->tp_traverse(o, append_referent, refs)) {
            goto fail;
        }
    }
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(big); j++) {
        PyObject *container = PyList_GET_ITEM(big, j);
        Py_ssize_t room = limit - PyList_GET_SIZE(refs);
        if (room <= 0) {
            continue;
        }
        PyObject *items = PyDict_CheckExact(container) ? PyObject_CallMethod(container, "values", NULL)
                                                       : (Py_INCREF(container), container);
        PyObject *it = items ? PyObject_GetIter(items) : NULL;
        Py_XDECREF(items);
        if (it == NULL) {
            goto fail;
        }
        PyObject *item;
        while (room-- > 0 && (item = PyIter_Next(it)) != NULL) {
            int failed = PyList_Append(refs, item) < 0;
            Py_DECREF(item);
            if (failed) {
                Py_DECREF(it);
                goto fail;
            }
        }
        Py_DECREF(it);
        if (PyErr_Occurred()) {
            goto fail;
        }
    }
    if (PyList_GET_SIZE(refs) > limit && PyList_SetSlice(refs, limit, PyList_GET_SIZE(refs), NULL) < 0) {
        goto fail;
    }
    Py_DECREF(big);
    return refs;
fail:
    Py_XDECREF(refs);
    Py_XDECREF(big);
    return NULL;
}

static PyObject *instances_below(PyObject *module, PyObject *args) {
    PyObject *obj, *atypes, *budget;
    int depth;
    if (!PyArg_ParseTuple(args, "OOiO!:instances_below", &obj, &atypes, &depth, &PyList_Type, &budget)) {
        return NULL;
    }
    if (PyList_GET_SIZE(budget) != 1) {
        return PyErr_Format(PyExc_ValueError, "budget must be a list of one int");
    }
    PyObject *found = PyList_New(0), *level = PyList_New(0);
    if (found == NULL || level == NULL) {
        goto fail;
    }
    int hit = PySequence_Contains(atypes, (PyObject *)Py_TYPE(obj));
    if (hit < 0) {
        goto fail;
    }
    if (hit) {
        Py_DECREF(level);
        if (PyList_Append(found, obj) < 0) {
            Py_DECREF(found);
            return NULL;
        }
        return found;
    }
    if (descends(Py_TYPE(obj)) && PyList_Append(level, obj) < 0) {
        goto fail;
    }
    for (int d = 0; d < depth; d++) {
        Py_ssize_t left = PyLong_AsSsize_t(PyList_GET_ITEM(budget, 0));
        if (left == -1 && PyErr_Occurred()) {
            goto fail;
        }
        if (left <= 0 || PyList_GET_SIZE(level) == 0) {
            break;
        }
        PyObject *refs = bounded_referents(level, left);
        if (refs == NULL) {
            goto fail;
        }
        PyObject *spent = PyLong_FromSsize_t(left - PyList_GET_SIZE(refs));
        if (spent == NULL || PyList_SetItem(budget, 0, spent) < 0) { /* SetItem steals spent */
            Py_DECREF(refs);
            goto fail;
        }
        PyObject *next = PyList_New(0);
        if (next == NULL) {
            Py_DECREF(refs);
            goto fail;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(refs); i++) {
            PyObject *r = PyList_GET_ITEM(refs, i);
            int wanted = PySequence_Contains(atypes, (PyObject *)Py_TYPE(r));
            if (wanted < 0 || (wanted && PyList_Append(found, r) < 0) ||
                (descends(Py_TYPE(r)) && PyList_Append(next, r) < 0)) {
                Py_DECREF(next);
                Py_DECREF(refs);
                goto fail;
            }
        }
        Py_DECREF(refs);
        Py_SETREF(level, next);
    }
    Py_DECREF(level);
    return found;
fail:
    Py_XDECREF(found);
    Py_XDECREF(level);
    return NULL;
}

/* ---- subclasses: a type and all its subclasses, recursively ------------------------------------
 *
 * tbmem/census/heap.py's _subclasses in one call: the census looks for instances of about a thousand
 * types (every autograd Function's node class), whose subclass lists it reads afresh each time (a
 * class may have been defined since). type.__subclasses__ is called as Python calls it, unbound (a
 * metaclass cannot override it).
 */
/* Most of those types have no subclass: a heap type keeps its subclasses in a dict of weak
 * references (tp_subclasses; NULL before the first), which __subclasses__ would turn into an
 * empty list. Static types (3.12 moved the builtin ones' elsewhere) always ask __subclasses__. */
static int has_no_subclasses(PyTypeObject *kind) {
    if (!PyType_HasFeature(kind, Py_TPFLAGS_HEAPTYPE)) {
        return 0;
    }
    PyObject *subs = (PyObject *)kind->tp_subclasses;
    return subs == NULL || (PyDict_CheckExact(subs) && PyDict_GET_SIZE(subs) == 0);
}

static PyObject *subclasses(PyObject *module, PyObject *root) {
    if (!PyType_Check(root)) {
        return PyErr_Format(PyExc_TypeError, "root must be a type, got %.100s", Py_TYPE(root)->tp_name);
    }
    PyObject *method = PyObject_GetAttrString((PyObject *)&PyType_Type, "__subclasses__");
    PyObject *out = method ? PySet_New(NULL) : NULL;
    PyObject *stack = out ? PyList_New(0) : NULL;
    if (stack == NULL || PySet_Add(out, root) < 0 || PyList_Append(stack, root) < 0) {
        goto fail;
    }
    while (PyList_GET_SIZE(stack)) {
        Py_ssize_t last = PyList_GET_SIZE(stack) - 1;
        PyObject *kind = PyList_GET_ITEM(stack, last);
        Py_INCREF(kind);
        if (PyList_SetSlice(stack, last, last + 1, NULL) < 0) {
            Py_DECREF(kind);
            goto fail;
        }
        if (has_no_subclasses((PyTypeObject *)kind)) {
            Py_DECREF(kind);
            continue;
        }
        PyObject *subs = PyObject_CallOneArg(method, kind);
        Py_DECREF(kind);
        if (subs == NULL) {
            goto fail;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(subs); i++) {
            PyObject *sub = PyList_GET_ITEM(subs, i);
            int known = PySet_Contains(out, sub);
            if (known < 0 || (!known && (PySet_Add(out, sub) < 0 || PyList_Append(stack, sub) < 0))) {
                Py_DECREF(subs);
                goto fail;
            }
        }
        Py_DECREF(subs);
    }
    Py_DECREF(stack);
    Py_DECREF(method);
    return out;
fail:
    Py_XDECREF(stack);
    Py_XDECREF(out);
    Py_XDECREF(method);
    return NULL;
}

/* ---- walk_graph: the autograd graph walk of tbmem/census/scan.py ---------------------------------
 *
 * scan.walk_autograd's loop, eagerly: a census after backward walks every node of the step's graph
 * (a few hundred) only to find its saved tensors released; in Python that costs more than reading
 * the attributes themselves. What is read is named by the caller (tbmem._torch_private): the
 * fields of each node type, the attribute of a saved value that gives its tensor without running
 * unpack hooks, and the attribute listing a node's successors.
 */
static int getattr_or_none(PyObject *obj, PyObject *name, PyObject **out) {
    /* getattr(obj, name, None): only AttributeError means "none" */
    *out = PyObject_GetAttr(obj, name);
    if (*out == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear();
    }
    return 0;
}

static int add_saved(PyObject *saved, PyObject *value_name, PyObject *label, PyObject *found) {
    PyObject *data;
    if (getattr_or_none(saved, value_name, &data) < 0) {
        return -1;
    }
    if (data == NULL || data == Py_None) {
        Py_XDECREF(data);
        return 0;
    }
    PyObject *pair = PyTuple_Pack(2, data, label);
    Py_DECREF(data);
    int failed = pair == NULL || PyList_Append(found, pair) < 0;
    Py_XDECREF(pair);
    return failed ? -1 : 0;
}

/* tbmem._torch_private.read_saved_tensors: (tensor, label) of each saved value of ``node``. */
static int read_fields(PyObject *node, PyObject *fields, PyObject *value_name, PyObject *found) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(fields); i++) {
        PyObject *field = PyTuple_GET_ITEM(fields, i);
        PyObject *attr = PyTuple_GET_ITEM(field, 0), *label = PyTuple_GET_ITEM(field, 1);
        PyObject *value = PyObject_GetAttr(node, attr);
        if (value == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_RuntimeError)) { /* released or never saved: skipped */
                return -1;
            }
            PyErr_Clear();
            continue;
        }
        int failed = 0;
        if (PyTuple_CheckExact(value) || PyList_CheckExact(value)) {
            PyObject *items = PySequence_Fast(value, "");
            for (Py_ssize_t j = 0; items != NULL && !failed && j < PySequence_Fast_GET_SIZE(items); j++) {
                failed = add_saved(PySequence_Fast_GET_ITEM(items, j), value_name, label, found) < 0;
            }
            failed |= items == NULL;
            Py_XDECREF(items);
        } else {
            failed = add_saved(value, value_name, label, found) < 0;
        }
        Py_DECREF(value);
        if (failed) {
            return -1;
        }
    }
    return 0;
}

/* ``[n for n, _ in node.<edges_name> if n is not None]`` appended to ``nexts``. */
static int read_edges(PyObject *node, PyObject *edges_name, PyObject *nexts) {
    PyObject *edges = PyObject_GetAttr(node, edges_name);
    PyObject *it = edges ? PyObject_GetIter(edges) : NULL;
    Py_XDECREF(edges);
    if (it == NULL) {
        return -1;
    }
    PyObject *edge;
    while ((edge = PyIter_Next(it)) != NULL) {
        PyObject *first = NULL;
        if (PyTuple_CheckExact(edge) && PyTuple_GET_SIZE(edge) == 2) {
            first = PyTuple_GET_ITEM(edge, 0);
            Py_INCREF(first);
        } else { /* ``n, _ = edge`` for anything else: exactly two items, or ValueError as Python says */
            PyObject *parts = PySequence_Tuple(edge);
            if (parts != NULL && PyTuple_GET_SIZE(parts) == 2) {
                first = PyTuple_GET_ITEM(parts, 0);
                Py_INCREF(first);
            } else if (parts != NULL) {
                PyErr_Format(PyExc_ValueError, PyTuple_GET_SIZE(parts) < 2
                             ? "not enough values to unpack (expected 2, got %zd)"
                             : "too many values to unpack (expected 2)", PyTuple_GET_SIZE(parts));
            }
            Py_XDECREF(parts);
        }
        Py_DECREF(edge);
        if (first == NULL || (first != Py_None && PyList_Append(nexts, first) < 0)) {
            Py_XDECREF(first);
            Py_DECREF(it);
            return -1;
        }
        Py_DECREF(first);
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -1 : 0;
}

static PyObject *walk_graph(PyObject *module, PyObject *args) {
    PyObject *stack, *visited, *keep, *errors, *fields_of, *value_name, *edges_name;
    if (!PyArg_ParseTuple(args, "O!O!O!O!OUU:walk_graph", &PyList_Type, &stack, &PySet_Type, &visited, &PyList_Type,
                          &keep, &PyList_Type, &errors, &fields_of, &value_name, &edges_name)) {
        return NULL;
    }
    PyObject *found = PyList_New(0), *cache = PyDict_New(), *node = NULL, *node_saved = NULL, *nexts = NULL;
    if (found == NULL || cache == NULL) {
        goto fail;
    }
    while (PyList_GET_SIZE(stack)) {
        Py_ssize_t last = PyList_GET_SIZE(stack) - 1;
        node = PyList_GET_ITEM(stack, last);
        Py_INCREF(node);
        if (PyList_SetSlice(stack, last, last + 1, NULL) < 0) {
            goto fail;
        }
        PyObject *key = PyLong_FromVoidPtr(node); /* id(node) */
        int seen = key ? PySet_Contains(visited, key) : -1;
        if (seen != 0 || PySet_Add(visited, key) < 0 || PyList_Append(keep, node) < 0) {
            Py_XDECREF(key);
            if (seen == 1) {
                Py_CLEAR(node);
                continue;
            }
            goto fail;
        }
        Py_DECREF(key);
        PyObject *kind = (PyObject *)Py_TYPE(node);
        PyObject *fields = PyDict_GetItemWithError(cache, kind); /* borrowed */
        if (fields == NULL) {
            if (PyErr_Occurred()) {
                goto fail;
            }
            PyObject *listed = PyObject_CallOneArg(fields_of, kind);
            if (listed == NULL) {
                goto fail;
            }
            int bad = !PyTuple_CheckExact(listed);
            for (Py_ssize_t i = 0; !bad && i < PyTuple_GET_SIZE(listed); i++) {
                PyObject *f = PyTuple_GET_ITEM(listed, i);
                bad = !PyTuple_CheckExact(f) || PyTuple_GET_SIZE(f) != 2;
            }
            if (bad || PyDict_SetItem(cache, kind, listed) < 0) {
                if (bad) {
                    PyErr_SetString(PyExc_TypeError, "fields_of must return a tuple of (attribute, label) pairs");
                }
                Py_DECREF(listed);
                goto fail;
            }
            Py_DECREF(listed);
            fields = PyDict_GetItemWithError(cache, kind);
        }
        node_saved = PyList_New(0);
        nexts = PyList_New(0);
        if (node_saved == NULL || nexts == NULL) {
            goto fail;
        }
        if ((PyTuple_GET_SIZE(fields) && read_fields(node, fields, value_name, node_saved) < 0) ||
            read_edges(node, edges_name, nexts) < 0) {
            /* one odd node (a custom Function's) must not stop the walk; it is reported */
            if (!PyErr_ExceptionMatches(PyExc_Exception)) {
                goto fail;
            }
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            PyErr_NormalizeException(&type, &value, &traceback);
            if (traceback != NULL && value != NULL) {
                PyException_SetTraceback(value, traceback);
            }
            int failed = value == NULL || PyList_Append(errors, value) < 0;
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(traceback);
            if (failed) {
                goto fail;
            }
            Py_CLEAR(node_saved);
            Py_CLEAR(nexts);
            Py_CLEAR(node);
            continue;
        }
        if (PyList_GET_SIZE(node_saved)) {
            PyObject *name = PyObject_GetAttrString(kind, "__name__");
            if (name == NULL) {
                goto fail;
            }
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(node_saved); i++) {
                PyObject *pair = PyList_GET_ITEM(node_saved, i);
                PyObject *label = PyUnicode_FromFormat("%S.%S", name, PyTuple_GET_ITEM(pair, 1));
                PyObject *named = label ? PyTuple_Pack(2, PyTuple_GET_ITEM(pair, 0), label) : NULL;
                Py_XDECREF(label);
                if (named == NULL || PyList_Append(found, named) < 0) {
                    Py_XDECREF(named);
                    Py_DECREF(name);
                    goto fail;
                }
                Py_DECREF(named);
            }
            Py_DECREF(name);
        }
        if (PyList_SetSlice(stack, PyList_GET_SIZE(stack), PyList_GET_SIZE(stack), nexts) < 0) { /* extend */
            goto fail;
        }
        Py_CLEAR(node_saved);
        Py_CLEAR(nexts);
        Py_CLEAR(node);
    }
    Py_DECREF(cache);
    return found;
fail:
    Py_XDECREF(node);
    Py_XDECREF(node_saved);
    Py_XDECREF(nexts);
    Py_XDECREF(found);
    Py_XDECREF(cache);
    return NULL;
}

static PyMethodDef methods[] = {
    {"select_tracked", select_tracked, METH_O,
     "select_tracked(types) -> list\n\nEvery gc-tracked object whose exact type is one of ``types``, in the\n"
     "order of gc.get_objects(); objects frozen by gc.freeze() are not seen, as there."},
    {"select_listed", select_listed, METH_VARARGS,
     "select_listed(objs, types, marker) -> (list, bool)\n\nThe items of the list ``objs`` whose exact type is in the set\n"
     "``types``, in order, and whether the object ``marker`` is among ``objs``."},
    {"subclasses", subclasses, METH_O,
     "subclasses(root) -> set\n\n``root`` and every subclass of it, recursively (tbmem.census.heap._subclasses)."},
    {"walk_graph", walk_graph, METH_VARARGS,
     "walk_graph(stack, visited, keep, errors, fields_of, value_name, edges_name) -> list\n\n"
     "tbmem.census.scan.walk_autograd's loop, eagerly: [(saved tensor, \"NodeType.label\"), ...] of the graphs\n"
     "below the nodes in ``stack``; ``fields_of(node_type)`` gives (attribute, label) pairs."},
    {"instances_below", instances_below, METH_VARARGS,
     "instances_below(obj, atypes, depth, budget) -> list\n\ntbmem.census.walk._instances_below, eagerly: the\n"
     "instances of ``atypes`` reachable from ``obj`` through at most ``depth`` hops of gc referents;\n"
     "``budget[0]`` referents may be examined and is decreased by those that were."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gcwalk", "The census's heap pass in C.", -1, methods};

PyMODINIT_FUNC PyInit__gcwalk(void) {
    PyObject *m = PyModule_Create(&module);
    PyObject *all = m ? Py_BuildValue("[sssss]", "select_tracked", "select_listed", "subclasses", "walk_graph", "instances_below") : NULL;
    if (all == NULL || PyModule_AddObject(m, "__all__", all) < 0) { /* the project's rule: every module has __all__ */
        Py_XDECREF(all);
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
