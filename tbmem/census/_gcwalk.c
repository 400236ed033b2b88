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

static PyMethodDef methods[] = {
    {"select_tracked", select_tracked, METH_O,
     "select_tracked(types) -> list\n\nEvery gc-tracked object whose exact type is one of ``types``, in the\n"
     "order of gc.get_objects(); objects frozen by gc.freeze() are not seen, as there."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gcwalk", "The census's heap pass in C.", -1, methods};

PyMODINIT_FUNC PyInit__gcwalk(void) {
    PyObject *m = PyModule_Create(&module);
    PyObject *all = m ? Py_BuildValue("[s]", "select_tracked") : NULL;
    if (all == NULL || PyModule_AddObject(m, "__all__", all) < 0) { /* the project's rule: every module has __all__ */
        Py_XDECREF(all);
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
