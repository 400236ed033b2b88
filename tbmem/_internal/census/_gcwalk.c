/* The census's full heap pass in one walk of the collector's lists, without listing every object.
 *
 * gc.get_objects() builds a list of every gc-tracked object (350k in a trainer process), taking
 * a reference to each; tbmem/_internal/census/layout.py then reads every object's type pointer again and
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
#include <stddef.h>

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

static void free_selection(Selection *s) {
    if (s != NULL) {
        PyMem_RawFree(s->chosen);
        PyMem_RawFree(s->wanted);
        PyMem_RawFree(s);
    }
}

/* The selection of the types in ``seq`` (from PySequence_Fast); NULL with an exception set when one
 * is not a type or memory is short. Freed by free_selection. */
static Selection *new_selection(PyObject *seq) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Selection *s = PyMem_RawCalloc(1, sizeof(Selection));
    uintptr_t *addresses = s ? PyMem_RawMalloc((size_t)(n ? n : 1) * sizeof(uintptr_t)) : NULL;
    if (addresses == NULL) {
        PyMem_RawFree(s);
        PyErr_NoMemory();
        return NULL;
    }
    s->wanted = addresses;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *type = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyType_Check(type)) {
            PyErr_Format(PyExc_TypeError, "types must hold types, got %.100s", Py_TYPE(type)->tp_name);
            free_selection(s);
            return NULL;
        }
        addresses[i] = (uintptr_t)type;
        s->table[slot((uintptr_t)type)] = 1;
    }
    qsort(addresses, (size_t)n, sizeof(uintptr_t), compare_addresses);
    s->n_wanted = n;
    return s;
}

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
    Selection *s = new_selection(seq);
    if (s == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
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
    free_selection(s);
    Py_DECREF(seq);
    return result;
}

/* ---- select_tracked_from: the same pass, along several stretches of the oldest generation at once --
 *
 * The walk of a generation list is a chain of dependent loads: each object's address is read from the
 * one before, so the walk waits for memory at every object (about 70 ns each, 25 ms for 350k objects
 * on a machine where two loads in flight cost hardly more than one). Started from several objects of
 * the oldest list at once ("anchors": objects a previous walk picked along it, which the caller keeps
 * weak references to and holds while this runs), the stretches between them are walked side by side,
 * one object of each in turn, so that their loads overlap. Each stretch ends where the next anchor or
 * the list's head is; chained from the head, the stretches give the list in its order, so the result
 * is select_tracked's, object for object. Anything unexpected (an anchor no longer tracked, a stretch
 * that ends at another generation's head because gc.freeze() moved it, a chain that misses an anchor)
 * means a plain walk from the head instead. CPython 3.10 and 3.11 only (their internal headers give
 * the lists); later versions walk with PyUnstable_GC_VisitObjects, whatever the anchors.
 *
 * With ``own`` true the anchors are the caller's own empty lists, and after the walk this function
 * moves them to evenly spaced places of the oldest list as it is now (about every length/(n+1)
 * objects), for the next walk. Anchors picked among the heap's objects must be weakly referenceable,
 * and a heap region without such objects (lists, dicts, tuples: the usual bulk of a heap) became one
 * long stretch: the walk of a 370k-object heap took 14-16 ms with 40% of the list in its last stretch,
 * about the plain walk's time, against 5-6 ms with the stretches even.
 *
 * Returns (objects, candidates, walked): the selected objects; objects picked about every ``spacing``
 * objects of the oldest list that can be weakly referenced (the caller's next anchors; none with
 * ``own``); and the length of the oldest list.
 */
#define MAX_STRETCHES 32
#define MARK_BITS 12

#if PY_VERSION_HEX < 0x030C0000
typedef struct {
    PyObject **items;
    Py_ssize_t n, capacity;
} Picks;

static int pick(Picks *p, PyObject *op) {
    if (p->n == p->capacity) {
        Py_ssize_t capacity = p->capacity ? 2 * p->capacity : 256;
        PyObject **grown = PyMem_RawRealloc(p->items, (size_t)capacity * sizeof(PyObject *));
        if (grown == NULL) {
            return 0;
        }
        p->items = grown;
        p->capacity = capacity;
    }
    p->items[p->n++] = op;
    return 1;
}

typedef struct {
    PyGC_Head *at, *start;
    int done, next; /* ended at the oldest head (next == -1) or at anchor ``next`` */
    Py_ssize_t walked, until; /* objects walked; when the next candidate anchor is due */
    Picks chosen, candidates;
} Stretch;

static inline Py_ssize_t mark(const void *p) { return (Py_ssize_t)(((uintptr_t)p >> 4) & ((1 << MARK_BITS) - 1)); }

/* 1: walked (the stretches in *order, how many in *n_order); 0: fall back to one plain walk; -1: no memory */
static int walk_stretches(Selection *s, PyGC_Head *head, PyGC_Head *const *others, int n_others,
                          PyGC_Head **anchors, int n_anchors, Py_ssize_t spacing, int own, Stretch *stretches,
                          int *order, int *n_order) {
    unsigned char marks[1 << MARK_BITS] = {0};
    int n = n_anchors + 1;
    for (int i = 0; i < n_others; i++) {
        marks[mark(others[i])] = 1;
    }
    for (int i = 0; i < n_anchors; i++) {
        marks[mark(anchors[i])] = 1;
    }
    stretches[0].at = (PyGC_Head *)head->_gc_next;
    for (int i = 0; i < n_anchors; i++) {
        stretches[i + 1].at = stretches[i + 1].start = anchors[i];
    }
    int live[MAX_STRETCHES], active = n; /* the stretches not done, in turn */
    for (int c = 0; c < n; c++) {
        live[c] = c;
        stretches[c].until = spacing > 0 ? 0 : PY_SSIZE_T_MAX;
    }
    while (active) {
        for (int k = 0; k < active; k++) {
            Stretch *st = &stretches[live[k]];
            PyGC_Head *g = st->at;
            int end = g == head, next = -1;
            if (!end && marks[mark(g)] && g != st->start) {
                for (int i = 0; i < n_others; i++) {
                    if (g == others[i]) {
                        return 0; /* an anchor is in another list now (gc.freeze(), untracked and tracked again) */
                    }
                }
                for (int i = 0; next < 0 && i < n_anchors; i++) {
                    next = g == anchors[i] ? i : -1;
                }
                end = next >= 0;
            }
            if (end) {
                st->done = 1, st->next = next;
                live[k--] = live[--active];
                continue;
            }
            PyObject *op = (PyObject *)(g + 1);
            if (wanted(s, (uintptr_t)Py_TYPE(op)) && !pick(&st->chosen, op)) {
                return -1;
            }
            if (st->walked == st->until) {
                /* a position for the next walk's anchors: any object but an anchor where the caller places
                 * its own anchors there, else one the caller can hold through a weak reference */
                if ((own ? g != st->start : Py_TYPE(op)->tp_weaklistoffset > 0) && !pick(&st->candidates, op)) {
                    return -1;
                }
                st->until += spacing;
            }
            st->walked++;
            st->at = (PyGC_Head *)g->_gc_next;
            /* its next object is read when this stretch's turn comes again: ask for it now, so that the
             * loads of all stretches are under way together */
            __builtin_prefetch(st->at);
            __builtin_prefetch((const char *)st->at + sizeof(PyGC_Head) + offsetof(PyObject, ob_type));
        }
    }
    /* chain the stretches from the head; each anchor's must come exactly once */
    *n_order = 0;
    for (int c = 0;;) {
        if (*n_order == n) {
            return 0; /* a cycle among anchors that misses the head: not this list */
        }
        order[(*n_order)++] = c;
        if (stretches[c].next < 0) {
            break;
        }
        c = stretches[c].next + 1;
    }
    return *n_order == n;
}
#endif

#if PY_VERSION_HEX < 0x030C0000
static PyObject *picks_to_list(Picks *parts, int n_parts) {
    /* References first: creating the list can start a collection (see select_tracked). */
    Py_ssize_t total = 0;
    for (int i = 0; i < n_parts; i++) {
        for (Py_ssize_t j = 0; j < parts[i].n; j++) {
            Py_INCREF(parts[i].items[j]);
        }
        total += parts[i].n;
    }
    PyObject *result = PyList_New(total);
    Py_ssize_t k = 0;
    for (int i = 0; i < n_parts; i++) {
        for (Py_ssize_t j = 0; j < parts[i].n; j++, k++) {
            if (result != NULL) {
                PyList_SET_ITEM(result, k, parts[i].items[j]);
            } else {
                Py_DECREF(parts[i].items[j]);
            }
        }
    }
    return result;
}
#endif

#if PY_VERSION_HEX < 0x030C0000 && !defined(Py_GIL_DISABLED)
/* Moves tracked ``node`` from wherever it is (the oldest list or a young one) to just after ``at`` in
 * the oldest list. Only the caller's own anchors are moved (empty lists it holds, no other object), with
 * the GIL held and outside a collection; the flag bits of _gc_prev are kept by _PyGCHead_SET_PREV. */
static void move_after(PyGC_Head *at, PyGC_Head *node) {
    PyGC_Head *prev = _PyGCHead_PREV(node), *next = _PyGCHead_NEXT(node);
    _PyGCHead_SET_NEXT(prev, next);
    _PyGCHead_SET_PREV(next, prev);
    next = _PyGCHead_NEXT(at);
    _PyGCHead_SET_NEXT(node, next);
    _PyGCHead_SET_PREV(node, at);
    _PyGCHead_SET_PREV(next, node);
    _PyGCHead_SET_NEXT(at, node);
}
#endif

/* The anchors of select_tracked_from(..., own=True): empty lists with one reference held here for the
 * process's life. That reference makes each a root for the collector (a reference from no tracked
 * object), and a collection moves only objects it first takes for unreachable: anchors held by a
 * Python list alone were all moved next to each other by every full collection (one long stretch). */
static PyObject *pinned_anchors[MAX_STRETCHES];

static PyObject *own_anchors(PyObject *module, PyObject *unused) {
    PyObject *result = PyList_New(MAX_STRETCHES - 1);
    for (int i = 0; result != NULL && i < MAX_STRETCHES - 1; i++) {
        if (pinned_anchors[i] == NULL && (pinned_anchors[i] = PyList_New(0)) == NULL) {
            Py_CLEAR(result);
            break;
        }
        Py_INCREF(pinned_anchors[i]);
        PyList_SET_ITEM(result, i, pinned_anchors[i]);
    }
    return result;
}

static PyObject *select_tracked_from(PyObject *module, PyObject *args) {
    PyObject *types, *anchor_objects;
    Py_ssize_t spacing;
    int own = 0;
    if (!PyArg_ParseTuple(args, "OO!n|p:select_tracked_from", &types, &PyList_Type, &anchor_objects, &spacing,
                          &own)) {
        return NULL;
    }
#if PY_VERSION_HEX >= 0x030C0000 || defined(Py_GIL_DISABLED)
    PyObject *all = select_tracked(module, types);
    return all ? Py_BuildValue("(N[]n)", all, (Py_ssize_t)0) : NULL;
#else
    PyObject *seq = PySequence_Fast(types, "types must be a sequence of types");
    if (seq == NULL) {
        return NULL;
    }
    Selection *s = new_selection(seq);
    Stretch *stretches = s ? PyMem_RawCalloc(MAX_STRETCHES, sizeof(Stretch)) : NULL;
    Picks young = {0}, candidates = {0};
    PyObject *result = NULL;
    if (stretches == NULL) {
        if (s != NULL) {
            PyErr_NoMemory();
        }
        goto done;
    }

    struct _gc_runtime_state *gcstate = &PyInterpreterState_Get()->gc;
    PyGC_Head *oldest = &gcstate->generations[NUM_GENERATIONS - 1].head;
    PyGC_Head *others[NUM_GENERATIONS + 1];
    int n_others = 0;
    for (int g = 0; g < NUM_GENERATIONS - 1; g++) {
        others[n_others++] = &gcstate->generations[g].head;
    }
    others[n_others++] = &gcstate->permanent_generation.head;
    for (int g = 0; g < NUM_GENERATIONS - 1; g++) { /* the young generations: a few thousand objects */
        PyGC_Head *head = &gcstate->generations[g].head;
        for (PyGC_Head *gc = (PyGC_Head *)head->_gc_next; gc != head; gc = (PyGC_Head *)gc->_gc_next) {
            PyObject *op = (PyObject *)(gc + 1);
            if (wanted(s, (uintptr_t)Py_TYPE(op)) && !pick(&young, op)) {
                PyErr_NoMemory();
                goto done;
            }
        }
    }
    PyGC_Head *anchors[MAX_STRETCHES - 1];
    int n_anchors = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(anchor_objects) && n_anchors < MAX_STRETCHES - 1; i++) {
        PyObject *op = PyList_GET_ITEM(anchor_objects, i); /* the caller holds them */
        if (!PyObject_IS_GC(op) || !PyObject_GC_IsTracked(op)) {
            continue;
        }
        PyGC_Head *g = (PyGC_Head *)op - 1;
        int twice = 0;
        for (int j = 0; j < n_anchors; j++) {
            twice |= anchors[j] == g;
        }
        if (!twice) {
            anchors[n_anchors++] = g;
        }
    }
    int order[MAX_STRETCHES], n_order = 0;
    int walked = walk_stretches(s, oldest, others, n_others, anchors, n_anchors, spacing, own, stretches, order,
                                &n_order);
    if (walked == 0 && n_anchors > 0) { /* one plain walk from the head */
        for (int i = 0; i < MAX_STRETCHES; i++) {
            PyMem_RawFree(stretches[i].chosen.items);
            PyMem_RawFree(stretches[i].candidates.items);
        }
        memset(stretches, 0, MAX_STRETCHES * sizeof(Stretch));
        walked = walk_stretches(s, oldest, others, n_others, anchors, 0, spacing, own, stretches, order, &n_order);
    }
    if (walked <= 0) {
        if (walked < 0) {
            PyErr_NoMemory();
        } else {
            PyErr_SetString(PyExc_RuntimeError, "the oldest generation's list does not end at its head");
        }
        goto done;
    }
    Picks parts[MAX_STRETCHES + 1];
    Py_ssize_t length = 0;
    parts[0] = young;
    for (int i = 0; i < n_order; i++) {
        parts[i + 1] = stretches[order[i]].chosen;
        length += stretches[order[i]].walked;
        Picks *c = &stretches[order[i]].candidates;
        for (Py_ssize_t j = 0; j < c->n; j++) {
            if (!pick(&candidates, c->items[j])) {
                PyErr_NoMemory();
                goto done;
            }
        }
    }
    if (own) {
        /* The caller's anchors go evenly along the list as it is now, for the next walk: before any
         * Python object is made here (an allocation can collect and free what the positions point to). */
        Py_ssize_t n_own = PyList_GET_SIZE(anchor_objects);
        for (Py_ssize_t i = 0; i < n_own && candidates.n > 0; i++) {
            PyObject *node = PyList_GET_ITEM(anchor_objects, i);
            if (!PyList_CheckExact(node) || PyList_GET_SIZE(node) != 0 || !PyObject_GC_IsTracked(node)) {
                continue; /* only empty lists are moved: never an object anything else may depend on */
            }
            PyObject *at = candidates.items[(i + 1) * candidates.n / (n_own + 1)];
            int anchor = 0; /* a plain walk (the fallback) passes the anchors as any object: never after one */
            for (Py_ssize_t j = 0; j < n_own; j++) {
                anchor |= PyList_GET_ITEM(anchor_objects, j) == at;
            }
            if (!anchor) {
                move_after((PyGC_Head *)at - 1, (PyGC_Head *)node - 1);
            }
        }
        candidates.n = 0; /* nothing for the caller to hold */
    }
    PyObject *objects = picks_to_list(parts, n_order + 1);
    PyObject *picked = objects ? picks_to_list(&candidates, 1) : NULL;
    result = picked ? Py_BuildValue("(NNn)", objects, picked, length) : NULL;
    if (result == NULL) {
        Py_XDECREF(objects);
        Py_XDECREF(picked);
    }
done:
    if (stretches != NULL) {
        for (int i = 0; i < MAX_STRETCHES; i++) {
            PyMem_RawFree(stretches[i].chosen.items);
            PyMem_RawFree(stretches[i].candidates.items);
        }
    }
    PyMem_RawFree(stretches);
    PyMem_RawFree(young.items);
    PyMem_RawFree(candidates.items);
    free_selection(s);
    Py_DECREF(seq);
    return result;
#endif
}

/* ---- select_frozen: the objects gc.freeze() moved out of the collector's sight ----------------------
 *
 * gc.freeze() (recommended before forking DataLoader workers) moves every tracked object to a permanent
 * generation that gc.get_objects() does not list: a census through it sees none of their tensors. On
 * 3.10 and 3.11 that generation is one more list of the interpreter's collector state, walked here as
 * select_tracked walks the others; later versions raise NotImplementedError (the census then finds the
 * frozen tensors only through what it was handed, and says so).
 */
static PyObject *select_frozen(PyObject *module, PyObject *types) {
#if PY_VERSION_HEX >= 0x030C0000 || defined(Py_GIL_DISABLED)
    PyErr_SetString(PyExc_NotImplementedError, "the permanent generation is read on CPython 3.10 and 3.11 only");
    return NULL;
#else
    PyObject *seq = PySequence_Fast(types, "types must be a sequence of types");
    if (seq == NULL) {
        return NULL;
    }
    Selection *s = new_selection(seq);
    PyObject *result = NULL;
    Picks chosen = {0};
    if (s == NULL) {
        goto done;
    }
    PyGC_Head *head = &PyInterpreterState_Get()->gc.permanent_generation.head;
    for (PyGC_Head *gc = (PyGC_Head *)head->_gc_next; gc != head; gc = (PyGC_Head *)gc->_gc_next) {
        PyObject *op = (PyObject *)(gc + 1);
        if (wanted(s, (uintptr_t)Py_TYPE(op)) && !pick(&chosen, op)) {
            PyErr_NoMemory();
            goto done;
        }
    }
    result = picks_to_list(&chosen, 1);
done:
    PyMem_RawFree(chosen.items);
    free_selection(s);
    Py_DECREF(seq);
    return result;
#endif
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
 * tbmem/_internal/census/walk.py's _instances_below, eagerly and in one call: the frame walk looks below some
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

/* ``type(o) in types``, with types None meaning "never". */
static int type_in(PyObject *types, PyObject *o) {
    return types == Py_None ? 0 : PySequence_Contains(types, (PyObject *)Py_TYPE(o));
}

/* ``items(obj, room)``: a list, or NULL with *none set when it gave None (or NULL with an error). */
static PyObject *call_items(PyObject *items, PyObject *obj, Py_ssize_t room, int *none) {
    *none = 0;
    PyObject *result = PyObject_CallFunction(items, "On", obj, room);
    if (result == Py_None) {
        Py_DECREF(result);
        *none = 1;
        return NULL;
    }
    if (result != NULL && !PyList_Check(result)) {
        Py_DECREF(result);
        PyErr_SetString(PyExc_TypeError, "items() must return a list or None");
        return NULL;
    }
    return result;
}

/* At most ``limit`` referents of ``level`` (gc.get_referents's order), without listing all items of
 * a huge container: those containers' items (a dict's values) come after, then the items of the
 * level's instances of ``atypes`` that ``items`` lists (numpy arrays of objects), up to the limit. */
static PyObject *bounded_referents(PyObject *level, Py_ssize_t limit, PyObject *atypes, PyObject *items) {
    PyObject *refs = PyList_New(0), *big = PyList_New(0), *expandable = PyList_New(0);
    if (refs == NULL || big == NULL || expandable == NULL) {
        goto fail;
    }
    Py_ssize_t n = PyList_GET_SIZE(level);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyList_GET_ITEM(level, i);
        int expand = items == Py_None ? 0 : PySequence_Contains(atypes, (PyObject *)Py_TYPE(o));
        if (expand < 0 || (expand && PyList_Append(expandable, o) < 0)) {
            goto fail;
        }
        if (!expand && is_container(o) && PyObject_Length(o) > limit) {
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
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(expandable); j++) {
            skip |= PyList_GET_ITEM(expandable, j) == o;
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
        PyObject *values = PyDict_CheckExact(container) ? PyObject_CallMethod(container, "values", NULL)
                                                        : (Py_INCREF(container), container);
        PyObject *it = values ? PyObject_GetIter(values) : NULL;
        Py_XDECREF(values);
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
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(expandable); j++) {
        Py_ssize_t room = limit - PyList_GET_SIZE(refs);
        int none;
        PyObject *listed = call_items(items, PyList_GET_ITEM(expandable, j), room > 0 ? room : 0, &none);
        if (listed == NULL && !none) {
            goto fail;
        }
        if (listed != NULL) {
            int failed = PyList_SetSlice(refs, PyList_GET_SIZE(refs), PyList_GET_SIZE(refs), listed) < 0;
            Py_DECREF(listed);
            if (failed) {
                goto fail;
            }
        }
    }
    if (PyList_GET_SIZE(refs) > limit && PyList_SetSlice(refs, limit, PyList_GET_SIZE(refs), NULL) < 0) {
        goto fail;
    }
    Py_DECREF(big);
    Py_DECREF(expandable);
    return refs;
fail:
    Py_XDECREF(refs);
    Py_XDECREF(big);
    Py_XDECREF(expandable);
    return NULL;
}

/* Whether ``items`` lists anything for ``obj`` (``items(obj, 1) is not None``): -1 on error. */
static int expands(PyObject *items, PyObject *obj) {
    if (items == Py_None) {
        return 0;
    }
    int none;
    PyObject *listed = call_items(items, obj, 1, &none);
    if (listed == NULL) {
        return none ? 0 : -1;
    }
    Py_DECREF(listed);
    return 1;
}

static PyObject *instances_below(PyObject *module, PyObject *args) {
    PyObject *obj, *atypes, *budget, *stop = Py_None, *items = Py_None;
    int depth;
    if (!PyArg_ParseTuple(args, "OOiO!|OO:instances_below", &obj, &atypes, &depth, &PyList_Type, &budget, &stop,
                          &items)) {
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
        if (PyList_Append(found, obj) < 0) {
            goto fail;
        }
        Py_ssize_t left = PyLong_AsSsize_t(PyList_GET_ITEM(budget, 0));
        if (left == -1 && PyErr_Occurred()) {
            goto fail;
        }
        int expand = items == Py_None || depth <= 0 || left <= 0 ? 0 : expands(items, obj);
        if (expand < 0 || (expand && PyList_Append(level, obj) < 0)) {
            goto fail;
        }
        if (!expand) {
            Py_DECREF(level);
            return found;
        }
    } else {
        int stopped = type_in(stop, obj);
        if (stopped < 0 || (descends(Py_TYPE(obj)) && !stopped && PyList_Append(level, obj) < 0)) {
            goto fail;
        }
    }
    for (int d = 0; d < depth; d++) {
        Py_ssize_t left = PyLong_AsSsize_t(PyList_GET_ITEM(budget, 0));
        if (left == -1 && PyErr_Occurred()) {
            goto fail;
        }
        if (left <= 0 || PyList_GET_SIZE(level) == 0) {
            break;
        }
        PyObject *refs = bounded_referents(level, left, atypes, items);
        if (refs == NULL) {
            goto fail;
        }
        PyObject *spent = PyLong_FromSsize_t(left - PyList_GET_SIZE(refs));
        if (spent == NULL || PyList_SetItem(budget, 0, spent) < 0) { /* SetItem steals spent */
            Py_DECREF(refs);
            goto fail;
        }
        PyObject *next = PyList_New(0), *here = PyList_New(0);
        if (next == NULL || here == NULL) {
            Py_XDECREF(next);
            Py_XDECREF(here);
            Py_DECREF(refs);
            goto fail;
        }
        int failed = 0;
        for (Py_ssize_t i = 0; !failed && i < PyList_GET_SIZE(refs); i++) {
            PyObject *r = PyList_GET_ITEM(refs, i);
            int wanted = PySequence_Contains(atypes, (PyObject *)Py_TYPE(r));
            int stopped = wanted < 0 ? 0 : type_in(stop, r);
            failed = wanted < 0 || stopped < 0 || (wanted && (PyList_Append(found, r) < 0 || PyList_Append(here, r) < 0)) ||
                     (descends(Py_TYPE(r)) && !stopped && PyList_Append(next, r) < 0);
        }
        for (Py_ssize_t i = 0; !failed && i < PyList_GET_SIZE(here); i++) {
            int expand = expands(items, PyList_GET_ITEM(here, i));
            failed = expand < 0 || (expand && PyList_Append(next, PyList_GET_ITEM(here, i)) < 0);
        }
        Py_DECREF(here);
        Py_DECREF(refs);
        if (failed) {
            Py_DECREF(next);
            goto fail;
        }
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
 * tbmem/_internal/census/heap.py's _subclasses in one call: the census looks for instances of about a thousand
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

/* ---- walk_graph: the autograd graph walk of tbmem/_internal/census/scan.py ---------------------------------
 *
 * scan.walk_autograd's loop, eagerly: a census after backward walks every node of the step's graph
 * (a few hundred) only to find its saved tensors released; in Python that costs more than reading
 * the attributes themselves. What is read is named by the caller (tbmem._internal._torch_private): the
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

/* tbmem._internal._torch_private.read_saved_tensors: (tensor, label) of each saved value of ``node``. */
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

/* ---- weak_refs: the incremental scan's index, without adding to the collector's work ----------------
 *
 * tbmem/_internal/census/heap.py keeps a weak reference to each instance a scan found. A plain weakref.ref is
 * gc-tracked: each one would lengthen every later collection of the user's program. A weak reference
 * without a callback refers to nothing the collector follows (its traversal visits only the callback),
 * so it can never be part of a reference cycle: these are untracked once made. Same referents, same
 * order, as heap.py's Python twin (list(map(weakref.ref, ...)) of the objects whose type is not skipped).
 */
static PyObject *weak_refs(PyObject *module, PyObject *args) {
    PyObject *objs, *skip;
    if (!PyArg_ParseTuple(args, "O!O:weak_refs", &PyList_Type, &objs, &skip)) {
        return NULL;
    }
    if (!PyAnySet_Check(skip)) {
        return PyErr_Format(PyExc_TypeError, "skip must be a set or frozenset, got %.100s", Py_TYPE(skip)->tp_name);
    }
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; out != NULL && i < PyList_GET_SIZE(objs); i++) {
        PyObject *obj = PyList_GET_ITEM(objs, i);
        Py_INCREF(obj);
        int skipped = PySet_Contains(skip, (PyObject *)Py_TYPE(obj));
        PyObject *ref = skipped == 0 ? PyWeakref_NewRef(obj, NULL) : NULL;
        Py_DECREF(obj);
        if (skipped < 0 || (skipped == 0 && ref == NULL)) {
            Py_CLEAR(out);
            break;
        }
        if (ref == NULL) {
            continue;
        }
        if (PyObject_GC_IsTracked(ref) && Py_IS_TYPE(ref, &_PyWeakref_RefType)) {
            PyObject_GC_UnTrack(ref); /* a plain reference without a callback: nothing for the collector */
        }
        int failed = PyList_Append(out, ref) < 0;
        Py_DECREF(ref);
        if (failed) {
            Py_CLEAR(out);
        }
    }
    return out;
}

/* ---- tensor_facts, storage_facts: a storage's facts, read from torch's C++ objects -----------------
 *
 * Measuring a tensor through untyped_storage() makes a Python object for its storage, which torch
 * keeps as long as the storage (one more gc-tracked object per storage, for good). These read the
 * same facts where torch keeps them, at the byte offsets tbmem._internal._torch_private_census.storage_layout() found
 * and checked on tensors made for the purpose: TensorImpl -> StorageImpl, and the StorageImpl's data
 * pointer, its context, size, device and resizable flag. One row of four int64 per item:
 * (StorageImpl address or 0, data address, nbytes, flags), flags = device type | device index << 8 |
 * resizable << 16 | (context == data) << 17 (a torch allocator made the memory). scan.py's
 * _facts_py reads the same words with ctypes (the Python twin).
 */
typedef struct {
    Py_ssize_t storage, data, context, nbytes, device, resizable, sizes, inline_sizes, autograd;
    void *dense; /* the vtable of a plain dense TensorImpl */
} Layout;

#define LAYOUT_OFFSETS 9

static int parse_layout(PyObject *layout, Layout *l) {
    Py_ssize_t *fields[] = {&l->storage, &l->data,  &l->context,      &l->nbytes,  &l->device,
                            &l->resizable, &l->sizes, &l->inline_sizes, &l->autograd};
    if (!PyTuple_Check(layout) || PyTuple_GET_SIZE(layout) != LAYOUT_OFFSETS + 1) {
        PyErr_SetString(PyExc_TypeError, "layout must be a tuple of nine offsets and a vtable address");
        return -1;
    }
    for (Py_ssize_t i = 0; i < LAYOUT_OFFSETS; i++) {
        *fields[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(layout, i));
        if (*fields[i] == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (*fields[i] < 0 || *fields[i] > 4096) {
            PyErr_SetString(PyExc_ValueError, "layout offsets must lie in 0..4096");
            return -1;
        }
    }
    l->dense = PyLong_AsVoidPtr(PyTuple_GET_ITEM(layout, LAYOUT_OFFSETS));
    return PyErr_Occurred() ? -1 : 0;
}

static void read_storage(const Layout *l, const char *storage, int64_t *row) {
    row[0] = (int64_t)(uintptr_t)storage;
    if (storage == NULL) {
        row[1] = row[2] = row[3] = 0;
        return;
    }
    void *data = *(void *const *)(storage + l->data), *context = *(void *const *)(storage + l->context);
    int64_t type = *(const uint8_t *)(storage + l->device), index = *(const uint8_t *)(storage + l->device + 1);
    int64_t resizable = *(const uint8_t *)(storage + l->resizable) & 1;
    row[1] = (int64_t)(uintptr_t)data;
    row[2] = *(const int64_t *)(storage + l->nbytes);
    row[3] = type | index << 8 | resizable << 16 | (int64_t)(context == data) << 17;
}

/* descriptor.__get__(t): a data descriptor's own getter, called directly (no bound method made) */
static PyObject *get(PyObject *descriptor, PyObject *t) {
    descrgetfunc getter = Py_TYPE(descriptor)->tp_descr_get;
    if (getter == NULL) {
        return PyObject_CallOneArg(descriptor, t); /* a plain callable */
    }
    return getter(descriptor, t, (PyObject *)Py_TYPE(t));
}

/* get(getter, t), or NULL with the error cleared when it raised (a nested tensor's shape) and *failed set */
static PyObject *get_or_clear(PyObject *getter, PyObject *t, int *failed) {
    PyObject *value = get(getter, t);
    if (value == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            return NULL;
        }
        PyErr_Clear();
        *failed = 1;
    }
    return value;
}

/* index of ``value`` in ``seen`` (a dict value -> index), adding it (``as_tuple``: as a tuple) to ``listed``
 * when new; -2 on error */
static Py_ssize_t intern_value(PyObject *seen, PyObject *listed, PyObject *value, int as_tuple) {
    PyObject *known = PyDict_GetItemWithError(seen, value);
    if (known != NULL) {
        return PyLong_AsSsize_t(known);
    }
    if (PyErr_Occurred()) {
        return -2;
    }
    Py_ssize_t index = PyList_GET_SIZE(listed);
    PyObject *number = PyLong_FromSsize_t(index);
    PyObject *entry = as_tuple ? PySequence_Tuple(value) : (Py_INCREF(value), value);
    int failed = number == NULL || entry == NULL || PyDict_SetItem(seen, value, number) < 0 ||
                 PyList_Append(listed, entry) < 0;
    Py_XDECREF(number);
    Py_XDECREF(entry);
    return failed ? -2 : index;
}

#define TENSOR_ROW 7

/* Rows of (StorageImpl address or 0, data address, nbytes, flags, dtype index, shape index, id): flags as
 * read_storage's, | nested << 18 | requires_grad << 19 | (grad_fn is not None) << 20 | (type is exactly
 * ``plain``) << 21. ``getters`` are torch's own (impl_of, is_nested, requires_grad, grad_fn, dtype, shape)
 * and the plain tensor type: no subclass override runs. A plain dense TensorImpl (its vtable is
 * layout.dense) is not nested; one without autograd metadata neither requires grad nor has a grad_fn:
 * those getters are not called for it. */
static PyObject *tensor_facts(PyObject *module, PyObject *args) {
    PyObject *tensors, *getters, *layout;
    Layout l;
    if (!PyArg_ParseTuple(args, "O!O!O:tensor_facts", &PyList_Type, &tensors, &PyTuple_Type, &getters, &layout) ||
        parse_layout(layout, &l) < 0) {
        return NULL;
    }
    if (PyTuple_GET_SIZE(getters) != 7) {
        return PyErr_Format(PyExc_TypeError,
                            "getters must be (impl_of, is_nested, requires_grad, grad_fn, dtype, shape, plain type)");
    }
    PyObject *impl_of = PyTuple_GET_ITEM(getters, 0), *nested_of = PyTuple_GET_ITEM(getters, 1),
             *requires_of = PyTuple_GET_ITEM(getters, 2), *grad_fn_of = PyTuple_GET_ITEM(getters, 3),
             *dtype_of = PyTuple_GET_ITEM(getters, 4), *shape_of = PyTuple_GET_ITEM(getters, 5),
             *plain = PyTuple_GET_ITEM(getters, 6);
    Py_ssize_t n = PyList_GET_SIZE(tensors);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * TENSOR_ROW * (Py_ssize_t)sizeof(int64_t));
    PyObject *dtypes = PyList_New(0), *shapes = PyList_New(0), *dtype_seen = PyDict_New(), *shape_seen = PyDict_New();
    if (out == NULL || dtypes == NULL || shapes == NULL || dtype_seen == NULL || shape_seen == NULL) {
        goto fail;
    }
    int64_t *rows = (int64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i >= PyList_GET_SIZE(tensors)) {
            PyErr_SetString(PyExc_RuntimeError, "the list of tensors changed while it was read");
            goto fail;
        }
        PyObject *t = PyList_GET_ITEM(tensors, i);
        Py_INCREF(t);
        int64_t *row = rows + TENSOR_ROW * i;
        int odd = 0;
        PyObject *address = get(impl_of, t); /* TensorImpl* */
        const char *impl = address ? (const char *)PyLong_AsVoidPtr(address) : NULL;
        Py_XDECREF(address);
        int dense = impl != NULL && *(void *const *)impl == l.dense;
        int bare = dense && *(void *const *)(impl + l.autograd) == NULL;
        PyObject *nested = PyErr_Occurred() ? NULL : dense ? (Py_INCREF(Py_False), Py_False) : get(nested_of, t);
        PyObject *requires = nested == NULL ? NULL : bare ? (Py_INCREF(Py_False), Py_False) : get(requires_of, t);
        PyObject *grad_fn = requires == NULL ? NULL : bare ? (Py_INCREF(Py_None), Py_None) : get(grad_fn_of, t);
        PyObject *dtype = grad_fn ? get(dtype_of, t) : NULL;
        /* the sizes where the TensorImpl keeps them (torch.Size is slow to make: 1.4 us a tensor);
         * through the getter for a tensor whose count of dimensions is not plausible */
        PyObject *shape = NULL;
        if (dtype != NULL && impl != NULL) {
            const char *at = impl + l.sizes;
            int64_t dims = *(const int64_t *)at;
            const int64_t *sizes = dims <= l.inline_sizes ? (const int64_t *)(at + 8) : *(const int64_t *const *)(at + 8);
            if (dims >= 0 && dims <= 64 && sizes != NULL) {
                shape = PyTuple_New((Py_ssize_t)dims);
                for (int64_t d = 0; shape != NULL && d < dims; d++) {
                    PyObject *size = PyLong_FromLongLong(sizes[d]);
                    if (size == NULL) {
                        Py_CLEAR(shape);
                    } else {
                        PyTuple_SET_ITEM(shape, d, size);
                    }
                }
            }
        }
        if (dtype != NULL && shape == NULL && !PyErr_Occurred()) {
            shape = get_or_clear(shape_of, t, &odd);
        }
        int exact = (PyObject *)Py_TYPE(t) == plain;
        row[6] = (int64_t)(uintptr_t)t;
        Py_DECREF(t);
        if (dtype == NULL || (shape == NULL && !odd)) {
            Py_XDECREF(nested);
            Py_XDECREF(requires);
            Py_XDECREF(grad_fn);
            Py_XDECREF(dtype);
            goto fail;
        }
        read_storage(&l, impl ? *(const char *const *)(impl + l.storage) : NULL, row);
        row[3] |= (int64_t)(nested == Py_True) << 18 | (int64_t)(requires == Py_True) << 19 |
                  (int64_t)(grad_fn != Py_None) << 20 | (int64_t)exact << 21;
        row[4] = intern_value(dtype_seen, dtypes, dtype, 0);
        row[5] = shape == NULL ? -1 : intern_value(shape_seen, shapes, shape, 1);
        Py_DECREF(nested);
        Py_DECREF(requires);
        Py_DECREF(grad_fn);
        Py_DECREF(dtype);
        Py_XDECREF(shape);
        if (row[4] == -2 || row[5] == -2) {
            goto fail;
        }
    }
    Py_DECREF(dtype_seen);
    Py_DECREF(shape_seen);
    return Py_BuildValue("(NNN)", out, dtypes, shapes);
fail:
    Py_XDECREF(out);
    Py_XDECREF(dtypes);
    Py_XDECREF(shapes);
    Py_XDECREF(dtype_seen);
    Py_XDECREF(shape_seen);
    return NULL;
}

static PyObject *storage_facts(PyObject *module, PyObject *args) {
    PyObject *addresses, *layout;
    Layout l;
    if (!PyArg_ParseTuple(args, "O!O:storage_facts", &PyList_Type, &addresses, &layout) || parse_layout(layout, &l) < 0) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(addresses);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 4 * (Py_ssize_t)sizeof(int64_t));
    if (out == NULL) {
        return NULL;
    }
    int64_t *rows = (int64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        void *storage = PyLong_AsVoidPtr(PyList_GET_ITEM(addresses, i)); /* no Python code runs: the list stays */
        if (storage == NULL && PyErr_Occurred()) {
            Py_DECREF(out);
            return NULL;
        }
        read_storage(&l, storage, rows + 4 * i);
    }
    return out;
}

/* ---- collection_hook: the census's gc callback, without losing a Ctrl-C --------------------------------
 *
 * The collector prints whatever a gc.callbacks callback raises as "Exception ignored" and goes on. A
 * SIGINT that arrives during a collection is handled at the first Python instruction run after it, and
 * a Python callback's is that one: the KeyboardInterrupt would be raised in the callback, printed and
 * lost, and the training the user meant to stop would go on. heap.py installs
 * functools.partial(collection_hook, fn) (C calling C): collections of generation 0 never enter Python;
 * a KeyboardInterrupt that fn raises (its handler ran inside fn) is held until the collection's "stop"
 * call, then raised again in this thread at its next check for pending work (the code the collection
 * interrupted, or, should one come first, another Python gc callback). fn must leave its own state
 * consistent when interrupted anywhere. Other exceptions go to the collector as before.
 */
static PyObject *held_interrupt = NULL; /* the type of the KeyboardInterrupt held until "stop" */

static PyObject *collection_hook(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        return PyErr_Format(PyExc_TypeError, "collection_hook(fn, phase, info) takes 3 arguments, got %zd", nargs);
    }
    PyObject *phase = args[1], *info = args[2];
    PyObject *generation = PyDict_Check(info) ? PyDict_GetItemString(info, "generation") : NULL; /* borrowed */
    if (generation == NULL || !PyLong_Check(generation) || PyLong_AsLong(generation) != 0) {
        PyObject *result = PyObject_Vectorcall(args[0], args + 1, 2, NULL);
        if (result != NULL) {
            Py_DECREF(result);
        } else if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
#if PY_VERSION_HEX >= 0x030C0000
            PyObject *raised = PyErr_GetRaisedException();
            Py_XSETREF(held_interrupt, Py_NewRef((PyObject *)Py_TYPE(raised)));
            Py_DECREF(raised);
#else
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            Py_XDECREF(value);
            Py_XDECREF(traceback);
            Py_XSETREF(held_interrupt, type);
#endif
        } else {
            return NULL;
        }
    }
    if (held_interrupt != NULL && PyUnicode_Check(phase) && PyUnicode_CompareWithASCIIString(phase, "stop") == 0) {
        PyObject *type = held_interrupt;
        held_interrupt = NULL;
        PyThreadState_SetAsyncExc(PyThread_get_thread_ident(), type);
        Py_DECREF(type);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"select_tracked", select_tracked, METH_O,
     "select_tracked(types) -> list\n\nEvery gc-tracked object whose exact type is one of ``types``, in the\n"
     "order of gc.get_objects(); objects frozen by gc.freeze() are not seen, as there."},
    {"select_tracked_from", select_tracked_from, METH_VARARGS,
     "select_tracked_from(types, anchors, spacing, own=False) -> (list, list, int)\n\nselect_tracked(types), the oldest\n"
     "generation walked in stretches side by side from the objects ``anchors`` (held by the caller); also objects\n"
     "about every ``spacing`` objects of that list that can be weakly referenced (the next anchors), and its length.\n"
     "With ``own``, ``anchors`` are own_anchors(), moved evenly along the list for the next walk (none returned)."},
    {"own_anchors", own_anchors, METH_NOARGS,
     "own_anchors() -> list\n\nThe anchors for select_tracked_from(types, anchors, spacing, True): empty lists this\n"
     "module holds for the process's life (the same ones at every call)."},
    {"select_frozen", select_frozen, METH_O,
     "select_frozen(types) -> list\n\nThe objects gc.freeze() moved to the permanent generation whose exact type is one of\n"
     "``types``, in that list's order (CPython 3.10 and 3.11; NotImplementedError elsewhere)."},
    {"select_listed", select_listed, METH_VARARGS,
     "select_listed(objs, types, marker) -> (list, bool)\n\nThe items of the list ``objs`` whose exact type is in the set\n"
     "``types``, in order, and whether the object ``marker`` is among ``objs``."},
    {"subclasses", subclasses, METH_O,
     "subclasses(root) -> set\n\n``root`` and every subclass of it, recursively (tbmem._internal.census.heap._subclasses)."},
    {"walk_graph", walk_graph, METH_VARARGS,
     "walk_graph(stack, visited, keep, errors, fields_of, value_name, edges_name) -> list\n\n"
     "tbmem._internal.census.scan.walk_autograd's loop, eagerly: [(saved tensor, \"NodeType.label\"), ...] of the graphs\n"
     "below the nodes in ``stack``; ``fields_of(node_type)`` gives (attribute, label) pairs."},
    {"instances_below", instances_below, METH_VARARGS,
     "instances_below(obj, atypes, depth, budget, stop=None, items=None) -> list\n\ntbmem.census.walk._instances_below,\n"
     "eagerly: the instances of ``atypes`` reachable from ``obj`` through at most ``depth`` hops of gc referents,\n"
     "not looking inside instances of ``stop``; ``items(instance, room)`` lists a found instance's referents\n"
     "the collector does not know of; ``budget[0]`` referents may be examined and is decreased by those that were."},
    {"weak_refs", weak_refs, METH_VARARGS,
     "weak_refs(objs, skip) -> list\n\nUntracked weak references to the objects of ``objs`` whose type is not in the set ``skip``,\n"
     "in order (a weak reference without a callback can be in no reference cycle)."},
    {"tensor_facts", tensor_facts, METH_VARARGS,
     "tensor_facts(tensors, getters, layout) -> (bytes, dtypes, shapes)\n\nSeven int64 per tensor: (StorageImpl address\n"
     "or 0, data address, nbytes, flags, dtype index, shape index, id), the storage read at the offsets ``layout``\n"
     "(tbmem._internal._torch_private_census.storage_layout()); ``getters``: torch's own descriptors (or callables) of _cdata,\n"
     "is_nested, requires_grad, grad_fn, dtype, shape, and the plain tensor type. The dtypes and the shapes (tuples)\n"
     "each once, in order of first appearance."},
    {"storage_facts", storage_facts, METH_VARARGS,
     "storage_facts(addresses, layout) -> bytes\n\n:func:`tensor_facts`'s rows for StorageImpl addresses."},
    {"collection_hook", (PyCFunction)(void (*)(void))collection_hook, METH_FASTCALL,
     "collection_hook(fn, phase, info) -> None\n\nfn(phase, info) for collections of generations 1 and 2; a KeyboardInterrupt\n"
     "raised in it is raised again in the interrupted code after the collection (gc.callbacks would print and lose it)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gcwalk", "The census's heap pass in C.", -1, methods};

PyMODINIT_FUNC PyInit__gcwalk(void) {
    PyObject *m = PyModule_Create(&module);
    PyObject *all = m ? Py_BuildValue("[sssssssssss]", "select_tracked", "select_tracked_from", "select_frozen", "select_listed", "subclasses", "walk_graph",
                                       "instances_below", "weak_refs", "tensor_facts", "storage_facts", "collection_hook") : NULL;
    if (all == NULL || PyModule_AddObject(m, "__all__", all) < 0) { /* the project's rule: every module has __all__ */
        Py_XDECREF(all);
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
