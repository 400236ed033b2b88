/* Allocator events paired by address in one pass (tbmem/_internal/snapshot/cuda_replay.py: pair_allocations, whose
 * numpy version sorts the events by address and compares neighbours; tests/snapshot/test_pair_c.py checks
 * that both give the same pairs: change them together).
 *
 * Per address (an open-addressing table, grown as addresses appear): the allocation still open, the
 * first free_requested after it (what its free requested), and the free requests no allocation
 * claimed since the address's last alloc or free_completed (a chain through ``link``). An alloc ends
 * the open one ("reused": no free in the trace) and makes the unclaimed requests before it lone ones;
 * a free_completed ends the open allocation, or is a lone free (allocated before the trace) that
 * claims the last unclaimed request. The arrays come from Python, sized by the counts of each action,
 * and are checked; every index written is one of the events read.
 */
#include "_creader.h"

#define A_ALLOC 1
#define A_FREE_REQ 2
#define A_FREE_DONE 3

typedef struct {
    int64_t addr;
    int64_t open, open_req, head; /* the open allocation (its rank among allocs), its request, unclaimed requests */
    int used;
} Slot;

typedef struct {
    Slot *s;
    size_t cap, n;
} Map;

static Slot *find(Map *M, int64_t addr) {
    uint64_t h = (uint64_t)addr * 0x9E3779B97F4A7C15ull;
    size_t mask = M->cap - 1;
    for (size_t i = (size_t)(h >> 17) & mask;; i = (i + 1) & mask) {
        if (!M->s[i].used || M->s[i].addr == addr) {
            return &M->s[i];
        }
    }
}

static Slot *slot_of(Map *M, int64_t addr) {
    if (2 * (M->n + 1) > M->cap) {
        size_t old_cap = M->cap, cap = old_cap ? 2 * old_cap : 4096;
        Slot *old = M->s;
        M->s = PyMem_Calloc(cap, sizeof(Slot));
        if (M->s == NULL) {
            M->s = old;
            return NULL;
        }
        M->cap = cap;
        for (size_t i = 0; i < old_cap; i++) {
            if (old[i].used) {
                *find(M, old[i].addr) = old[i];
            }
        }
        PyMem_Free(old);
    }
    Slot *s = find(M, addr);
    if (!s->used) {
        s->used = 1;
        s->addr = addr;
        s->open = s->open_req = s->head = -1;
        M->n++;
    }
    return s;
}

enum { P_ENDS, P_FREEREQ, P_PENDING, P_LONE_DONE, P_LONE_DONE_REQ, P_LONE_REQ, N_POUT };

PyObject *tbmem_pair(PyObject *module, PyObject *args) {
    PyObject *act_obj, *addr_obj, *outs;
    Py_buffer va, vd, vo[N_POUT];
    int n_vo = 0, have_a = 0, have_d = 0;
    PyObject *result = NULL;
    Map M = {NULL, 0, 0};
    int64_t *link = NULL, *req_event = NULL; /* per request (by rank): the unclaimed one before it; its event */
    if (!PyArg_ParseTuple(args, "OOO!", &act_obj, &addr_obj, &PyTuple_Type, &outs)) {
        return NULL;
    }
    if (PyObject_GetBuffer(act_obj, &va, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_a = 1;
    if (PyObject_GetBuffer(addr_obj, &vd, PyBUF_C_CONTIGUOUS) < 0) goto done;
    have_d = 1;
    Py_ssize_t n = va.len, na = 0, nd = 0, nr = 0;
    if (vd.len != 8 * n || PyTuple_GET_SIZE(outs) != N_POUT) {
        PyErr_SetString(PyExc_ValueError, "act (int8) and addr (int64) must be as long, with 6 output arrays");
        goto done;
    }
    const int8_t *act = va.buf;
    const int64_t *addr = vd.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        na += act[i] == A_ALLOC;
        nr += act[i] == A_FREE_REQ;
        nd += act[i] == A_FREE_DONE;
    }
    /* ends, freereq per alloc; pending per alloc (bytes); lone_done and its request per free_completed;
     * lone_req per free_requested (each a bound: the counts used come back) */
    const Py_ssize_t want[N_POUT] = {8 * na, 8 * na, na, 8 * nd, 8 * nd, 8 * nr};
    void *p[N_POUT];
    for (int k = 0; k < N_POUT; k++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(outs, k), &vo[n_vo], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto done;
        n_vo++;
        if (vo[k].len != want[k]) {
            PyErr_Format(PyExc_ValueError, "output array %d holds %zd bytes, not %zd", k, vo[k].len, want[k]);
            goto done;
        }
        p[k] = vo[k].buf;
    }
    int64_t *ends = p[P_ENDS], *freereq = p[P_FREEREQ], *lone_done = p[P_LONE_DONE], *lone_done_req = p[P_LONE_DONE_REQ];
    int64_t *lone_req = p[P_LONE_REQ];
    uint8_t *pending = p[P_PENDING];
    link = PyMem_Malloc((size_t)(nr ? nr : 1) * sizeof(int64_t));
    req_event = PyMem_Malloc((size_t)(nr ? nr : 1) * sizeof(int64_t));
    if (link == NULL || req_event == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t k_alloc = 0, k_req = 0, n_done = 0, n_lone_req = 0, reused = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int a = act[i];
        if (a != A_ALLOC && a != A_FREE_REQ && a != A_FREE_DONE) {
            continue;
        }
        Slot *s = slot_of(&M, addr[i]);
        if (s == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        if (a == A_ALLOC) {
            if (s->open >= 0) { /* a later alloc of the address ends a block whose free the trace did not show */
                ends[s->open] = i;
                freereq[s->open] = s->open_req;
                pending[s->open] = 0;
                reused++;
            }
            for (int64_t r = s->head; r >= 0; r = link[r]) { /* requests never completed: still alive */
                lone_req[n_lone_req++] = req_event[r];
            }
            s->head = -1;
            s->open = k_alloc;
            s->open_req = -1;
            ends[k_alloc] = -1;
            freereq[k_alloc] = -1;
            pending[k_alloc++] = 0;
        } else if (a == A_FREE_REQ) {
            if (s->open >= 0 && s->open_req < 0) {
                s->open_req = i;
            } else {
                link[k_req] = s->head;
                s->head = k_req;
            }
            req_event[k_req++] = i;
        } else {
            if (s->open >= 0) {
                ends[s->open] = i;
                freereq[s->open] = s->open_req;
                s->open = s->open_req = -1;
            } else { /* memory allocated before the trace: its request is the last unclaimed one */
                lone_done[n_done] = i;
                lone_done_req[n_done++] = s->head >= 0 ? req_event[s->head] : -1;
            }
            s->head = -1;
        }
    }
    for (size_t j = 0; j < M.cap; j++) { /* at the end, what no free completed is still alive */
        Slot *s = &M.s[j];
        if (!s->used) {
            continue;
        }
        if (s->open >= 0) { /* requested but not completed: pending */
            freereq[s->open] = s->open_req;
            pending[s->open] = s->open_req >= 0;
        }
        for (int64_t r = s->head; r >= 0; r = link[r]) {
            lone_req[n_lone_req++] = req_event[r];
        }
    }
    result = Py_BuildValue("nnn", n_done, n_lone_req, reused);
done:
    PyMem_Free(M.s);
    PyMem_Free(link);
    PyMem_Free(req_event);
    for (int k = 0; k < n_vo; k++) {
        PyBuffer_Release(&vo[k]);
    }
    if (have_d) PyBuffer_Release(&vd);
    if (have_a) PyBuffer_Release(&va);
    return result;
}
