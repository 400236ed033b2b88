/* Runs of trace events turned into rows in one pass, event by event (tbmem/_internal/snapshot/pickle_crun.py drives it;
 * tests/snapshot/test_pickle_scan_c.py compares the rows, frames, stacks and strings it gives with those of
 * pickle_stream.py's interpreter reading every event: change them together).
 *
 * From ``pos``, each event is parsed (_creader.h), its references resolved, its row and the memo
 * entries the interpreter would store written out; the run stops before the first event that is not
 * parsed, not linked to the previous one (back to back, or across a FRAME header and/or "APPENDS
 * MARK"), or whose references do not resolve to what torch writes (the
 * general interpreter then reads it). What a reference means comes from Python, once per memo object
 * (callbacks passed to each run, cached here by the object's slot in pickle_rows.Memo's table, which never changes):
 * action(slot) -> action code or -1, frames(slot) -> stack id or -3, meta(slot) -> string id, -1 (empty)
 * or -3; and once per distinct value: stack(reference bytes) -> stack id or -1 (only with references to
 * memo entries before the run), string(bytes) -> memo slot of the decoded string, meta_inline(bytes) ->
 * string id or -1, refslot(stack id) -> memo slot of its StackRef, pool_slot((a, b)) -> memo slot of the tuple an
 * inline pool_id stores, and pool_of(slot) -> index of the pool_id that memo object is, or -3 (cached by slot
 * like action, frames and meta). A reference to a memo entry stored
 * in this run is refused, except a frames list stored by an earlier event of the run.
 * Stacks of new frames lists are cached by the two 64-bit hashes of their reference bytes ; forget() drops them when the memo is overwritten.
 */
#include "_creader.h"

enum { CB_ACTION, CB_FRAMES, CB_META, CB_STACK, CB_STRING, CB_META_INLINE, CB_REFSLOT, CB_POOL_SLOT, CB_POOL_OF,
       N_CB };

typedef struct {
    uint64_t h1, h2;
    int64_t off; /* where the key's bytes are in the arena; -1: keyed by the hashes alone */
    uint32_t len;
    int32_t value;
} Entry;

typedef struct {
    Entry *e; /* open addressing; value INT32_MIN: empty */
    size_t cap, n;
    uint8_t *arena;
    size_t arena_len, arena_cap;
} Table;

typedef struct {
    int32_t *cache[4]; /* per memo object slot: action code, frames stack id, meta string id, pool index;
                        * INT32_MIN unknown */
    Py_ssize_t n_cache[4];
    int32_t *refslot;
    Py_ssize_t n_refslot;
    Table spans, strs, metas, pools;
    PyObject *cb[N_CB]; /* borrowed from run()'s arguments while it runs: the runner holds no Python object */
} Runner;

#define UNKNOWN INT32_MIN
#define TABLE_MAX (1u << 22) /* a cache: emptied beyond this many entries */

static void table_clear(Table *T) {
    PyMem_Free(T->e);
    PyMem_Free(T->arena);
    memset(T, 0, sizeof(*T));
}

static Entry *table_slot(Table *T, uint64_t h1, uint64_t h2, const uint8_t *key, uint32_t len) {
    size_t mask = T->cap - 1;
    for (size_t i = (size_t)(h1 ^ (h2 >> 7)) & mask;; i = (i + 1) & mask) {
        Entry *e = &T->e[i];
        if (e->value == UNKNOWN || (e->h1 == h1 && e->h2 == h2 && e->len == len &&
                                    (key == NULL || memcmp(T->arena + e->off, key, len) == 0))) {
            return e;
        }
    }
}

static int table_find(Table *T, uint64_t h1, uint64_t h2, const uint8_t *key, uint32_t len, int32_t *value) {
    if (T->cap == 0) {
        return 0;
    }
    Entry *e = table_slot(T, h1, h2, key, len);
    if (e->value == UNKNOWN) {
        return 0;
    }
    *value = e->value;
    return 1;
}

static int table_put(Table *T, uint64_t h1, uint64_t h2, const uint8_t *key, uint32_t len, int32_t value) {
    if (T->n >= TABLE_MAX) {
        table_clear(T);
    }
    if (2 * (T->n + 1) > T->cap) { /* grow: rehash every entry into twice the room */
        size_t cap = T->cap ? 2 * T->cap : 1024;
        Entry *old = T->e, *grown = PyMem_Malloc(cap * sizeof(Entry));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (size_t i = 0; i < cap; i++) {
            grown[i].value = UNKNOWN;
        }
        size_t old_cap = T->cap;
        T->e = grown;
        T->cap = cap;
        for (size_t i = 0; i < old_cap; i++) {
            if (old[i].value != UNKNOWN) {
                *table_slot(T, old[i].h1, old[i].h2, NULL, old[i].len) = old[i];
            }
        }
        PyMem_Free(old);
    }
    int64_t off = -1;
    if (key != NULL) {
        if (T->arena_len + len > T->arena_cap) {
            size_t cap = 2 * (T->arena_len + len) + 4096;
            uint8_t *grown = PyMem_Realloc(T->arena, cap);
            if (grown == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            T->arena = grown;
            T->arena_cap = cap;
        }
        memcpy(T->arena + T->arena_len, key, len);
        off = (int64_t)T->arena_len;
        T->arena_len += len;
    }
    Entry *e = table_slot(T, h1, h2, key, len);
    e->h1 = h1;
    e->h2 = h2;
    e->off = off;
    e->len = len;
    e->value = value;
    T->n++;
    return 0;
}

static void runner_free(PyObject *capsule) {
    Runner *R = PyCapsule_GetPointer(capsule, "tbmem.pickle_runner");
    if (R == NULL) {
        return;
    }
    for (int k = 0; k < 4; k++) {
        PyMem_Free(R->cache[k]);
    }
    PyMem_Free(R->refslot);
    table_clear(&R->spans);
    table_clear(&R->strs);
    table_clear(&R->metas);
    table_clear(&R->pools);
    PyMem_Free(R);
}

PyObject *tbmem_runner_new(PyObject *module, PyObject *unused) {
    Runner *R = PyMem_Calloc(1, sizeof(Runner));
    if (R == NULL) {
        return PyErr_NoMemory();
    }
    PyObject *capsule = PyCapsule_New(R, "tbmem.pickle_runner", runner_free);
    if (capsule == NULL) {
        PyMem_Free(R);
    }
    return capsule;
}

PyObject *tbmem_runner_forget(PyObject *module, PyObject *capsule) {
    Runner *R = PyCapsule_GetPointer(capsule, "tbmem.pickle_runner");
    if (R == NULL) {
        return NULL;
    }
    table_clear(&R->spans);
    Py_RETURN_NONE;
}

/* a callback's answer, an int in [lo, INT32_MAX] */
static int call(Runner *R, int which, PyObject *arg, int64_t lo, int32_t *out) {
    if (arg == NULL) {
        return -1;
    }
    PyObject *res = PyObject_CallOneArg(R->cb[which], arg);
    Py_DECREF(arg);
    if (res == NULL) {
        return -1;
    }
    long long v = PyLong_AsLongLong(res);
    Py_DECREF(res);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (v < lo || v > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "pickle runner callback %d answered %lld", which, v);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

static int grow(int32_t **a, Py_ssize_t *n, Py_ssize_t need) {
    if (need <= *n) {
        return 0;
    }
    Py_ssize_t cap = need > 2 * *n ? need + 1024 : 2 * *n;
    int32_t *grown = PyMem_Realloc(*a, (size_t)cap * sizeof(int32_t));
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = *n; i < cap; i++) {
        grown[i] = UNKNOWN;
    }
    *a = grown;
    *n = cap;
    return 0;
}

/* what the memo object at ``slot`` means as an action (0), a frames value (1), user metadata (2) or a pool (3) */
static int by_slot(Runner *R, int kind, int32_t slot, int32_t *out) {
    if (slot < 0) {
        PyErr_SetString(PyExc_ValueError, "negative memo slot");
        return -1;
    }
    if (grow(&R->cache[kind], &R->n_cache[kind], (Py_ssize_t)slot + 1) < 0) {
        return -1;
    }
    if (R->cache[kind][slot] == UNKNOWN) {
        static const int cb[4] = {CB_ACTION, CB_FRAMES, CB_META, CB_POOL_OF};
        if (call(R, cb[kind], PyLong_FromLong(slot), -3, &R->cache[kind][slot]) < 0) {
            return -1;
        }
    }
    *out = R->cache[kind][slot];
    return 0;
}

/* the value of a string's bytes, through a table keyed by them */
static int by_bytes(Runner *R, Table *T, int which, const Buf *B, int64_t pos, int64_t len, int32_t *out) {
    uint64_t h[2];
    hash_span(B, pos, len, h);
    const uint8_t *key = B->b + pos; /* parse_event checked that the string lies below hi */
    if (table_find(T, h[0], h[1], key, (uint32_t)len, out)) {
        return 0;
    }
    if (call(R, which, PyBytes_FromStringAndSize((const char *)key, len), -1, out) < 0) {
        return -1;
    }
    return table_put(T, h[0], h[1], key, (uint32_t)len, *out);
}

/* the stack of a new frames list (-1: a reference in it is not to a frame dict stored before the run) */
static int new_stack(Runner *R, const Buf *B, int64_t pos, int64_t len, const uint64_t *hash, int64_t base,
                     int32_t *out) {
    if (table_find(&R->spans, hash[0], hash[1], NULL, 0, out)) {
        return 0;
    }
    for (int64_t p = pos; p < pos + len;) {
        int64_t idx, l = ref_at(word(B, p), &idx);
        if (l == 0 || idx >= base) {
            *out = -1;
            return 0;
        }
        p += l;
    }
    if (call(R, CB_STACK, PyBytes_FromStringAndSize((const char *)B->b + pos, len), -1, out) < 0) {
        return -1;
    }
    return *out >= 0 ? table_put(&R->spans, hash[0], hash[1], NULL, 0, *out) : 0;
}

/* the memo slot of the tuple an inline pool_id (a, b) stores, through a table keyed by its two integers */
static int pool_slot(Runner *R, int64_t a, int64_t b, int32_t *out) {
    uint8_t key[16];
    memcpy(key, &a, 8);
    memcpy(key + 8, &b, 8);
    uint64_t h1 = (uint64_t)a * 0x9E3779B97F4A7C15ull ^ (uint64_t)b, h2 = (uint64_t)b * 0xC2B2AE3D27D4EB4Full ^ (uint64_t)a;
    if (table_find(&R->pools, h1, h2, key, 16, out)) {
        return 0;
    }
    if (call(R, CB_POOL_SLOT, Py_BuildValue("(LL)", (long long)a, (long long)b), 0, out) < 0) {
        return -1;
    }
    return table_put(&R->pools, h1, h2, key, 16, *out);
}

enum { R_ACTION, R_ADDR, R_SIZE, R_TIME, R_STACK, R_META, R_STREAM, R_POOL, R_ENTRIES, N_ROWOUT };
static const Py_ssize_t ROW_ITEM[N_ROWOUT] = {1, 8, 8, 8, 4, 4, 8, 4, 4};

PyObject *tbmem_runner_run(PyObject *module, PyObject *args) {
    PyObject *capsule, *callbacks, *obj, *spec, *memo_obj, *outs, *cuts = NULL, *result = NULL;
    Runner *R = NULL;
    long long pos, hi, base;
    Py_buffer view, mv, ov[N_ROWOUT];
    int n_ov = 0, n_layouts, n_generic, have_view = 0, have_mv = 0;
    Layout *L = PyMem_Calloc(MAX_LAYOUTS, sizeof(Layout));
    int32_t *esid = NULL;
    Buf B;
    if (L == NULL) {
        return PyErr_NoMemory();
    }
    if (!PyArg_ParseTuple(args, "OO!OLLSOLO!", &capsule, &PyTuple_Type, &callbacks, &obj, &pos, &hi, &spec, &memo_obj,
                          &base, &PyTuple_Type, &outs) || unpack_layouts(spec, L, &n_layouts, &n_generic) < 0) {
        goto done;
    }
    R = PyCapsule_GetPointer(capsule, "tbmem.pickle_runner");
    if (R == NULL) {
        goto done;
    }
    if (PyTuple_GET_SIZE(callbacks) != N_CB) {
        PyErr_SetString(PyExc_ValueError, "run() takes 9 callbacks");
        R = NULL;
        goto done;
    }
    for (int k = 0; k < N_CB; k++) {
        R->cb[k] = PyTuple_GET_ITEM(callbacks, k);
    }
    if (read_buf(obj, &view, pos, hi, &B) < 0) {
        goto done;
    }
    have_view = 1;
    if (PyObject_GetBuffer(memo_obj, &mv, PyBUF_SIMPLE) < 0) {
        goto done;
    }
    have_mv = 1;
    if (base < 0 || base > mv.len / 4 || PyTuple_GET_SIZE(outs) != N_ROWOUT) {
        PyErr_SetString(PyExc_ValueError, "memo base outside the memo, or wrong number of output arrays");
        goto done;
    }
    const int32_t *memo = mv.buf;
    void *ptr[N_ROWOUT];
    Py_ssize_t cap = 0, ecap = 0;
    for (int k = 0; k < N_ROWOUT; k++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(outs, k), &ov[n_ov], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
            goto done;
        }
        n_ov++;
        ptr[k] = ov[k].buf;
        if (k == 0) {
            cap = ov[0].len;
        } else if (k == R_ENTRIES) {
            ecap = ov[k].len / 4;
        } else if (ov[k].len != cap * ROW_ITEM[k]) {
            PyErr_SetString(PyExc_ValueError, "output arrays of different lengths");
            goto done;
        }
    }
    int8_t *o_action = ptr[R_ACTION];
    int64_t *o_addr = ptr[R_ADDR], *o_size = ptr[R_SIZE], *o_time = ptr[R_TIME], *o_stream = ptr[R_STREAM];
    int32_t *o_stack = ptr[R_STACK], *o_meta = ptr[R_META], *o_pool = ptr[R_POOL], *entries = ptr[R_ENTRIES];
    esid = PyMem_Malloc((size_t)(ecap ? ecap : 1) * sizeof(int32_t)); /* per entry: a new list's stack, else -1 */
    cuts = PyList_New(0);
    if (esid == NULL || cuts == NULL) {
        if (esid == NULL) {
            PyErr_NoMemory();
        }
        goto done;
    }
    Py_ssize_t n = 0, m = 0;
    int64_t last_end = pos, q = pos;
    int cut = 0;
    while (n < cap) {
        if (n > 0) { /* where the next event starts if it is linked to this one (Scan.finish) */
            uint64_t w = word(&B, last_end);
            cut = 0;
            if ((w & 0xFF) == 0x7D) {
                q = last_end;
            } else if ((w & 0xFF) == 0x95) {
                q = last_end + 9;
            } else if ((w & 0xFFFF) == 0x2865) { /* "e(" */
                q = last_end + (((w >> 16) & 0xFF) == 0x95 ? 11 : 2);
                cut = 1;
            } else {
                break;
            }
        }
        if (byte_at(&B, q) != 0x7D || byte_at(&B, q + 1) != 0x94 || byte_at(&B, q + 2) != 0x28) {
            break;
        }
        uint64_t w3 = word(&B, q + 3);
        int li = 0;
        while (li < n_layouts && (w3 & L[li].mask[0]) != L[li].ref[0]) {
            li++;
        }
        if (li == n_layouts) {
            break;
        }
        const Layout *lay = &L[li];
        int64_t start = q, end = 0, addr = 0, size = 0, time = 0, stream = 0, action_ref = -1, list_ref = -1,
                span_pos = 0, span_len = 0, inl = 0, inl_bf = 0, meta_ref = -1, chain = 0, pool_a = 0, pool_b = 0,
                pool_ref = -2; /* -2: no pool_id */
        int64_t spos[MAX_GENERIC], slen[MAX_GENERIC];
        uint64_t hash[2] = {0, 0};
        uint8_t ok = 0, has_time = 0, batch_end = 0;
        int8_t layout = 0;
        Out o; /* one candidate's outputs (only the pointers this layout's keys use are set) */
        o.start = &start; o.end = &end; o.addr = &addr; o.size = &size; o.time = &time; o.stream = &stream;
        o.action_ref = &action_ref; o.list_ref = &list_ref; o.span_pos = &span_pos; o.span_len = &span_len;
        o.inl = &inl; o.inl_bf = &inl_bf; o.meta_ref = &meta_ref; o.chain = &chain; o.span_hash = hash;
        o.pool_a = &pool_a; o.pool_b = &pool_b; o.pool_ref = &pool_ref;
        o.ok = &ok; o.has_time = &has_time; o.batch_end = &batch_end; o.layout = &layout;
        int has_frames = 0, has_meta = 0;
        for (int k = 0; k < lay->n_keys; k++) {
            if (lay->kind[k] >= K_OTHER) {
                o.str_pos[lay->gen[k]] = &spos[lay->gen[k]];
                o.str_len[lay->gen[k]] = &slen[lay->gen[k]];
                spos[lay->gen[k]] = -1;
            }
            has_frames |= lay->kind[k] == K_FRAMES;
            has_meta |= lay->kind[k] == K_META;
        }
        parse_event(&B, q, lay, &o, 0);
        if (!ok || !has_frames || m + 1 + lay->n_keys > ecap) {
            break;
        }
        int32_t code, sid, meta = -1;
        if (action_ref < 0 || action_ref >= base) {
            break;
        }
        if (by_slot(R, 0, memo[action_ref], &code) < 0) goto done;
        if (code < 0) {
            break;
        }
        if (list_ref >= base) { /* a list stored by an earlier event of this run */
            int64_t e = list_ref - base;
            if (e >= m || esid[e] < 0) {
                break;
            }
            sid = esid[e];
        } else if (list_ref >= 0) {
            if (by_slot(R, 1, memo[list_ref], &sid) < 0) goto done;
            if (sid < -1) {
                break;
            }
        } else {
            if (new_stack(R, &B, span_pos, span_len, hash, base, &sid) < 0) goto done;
            if (sid < 0) {
                break;
            }
        }
        if (has_meta) {
            int g = 0;
            for (int k = 0; k < lay->n_keys; k++) {
                g = lay->kind[k] == K_META ? lay->gen[k] : g;
            }
            if (spos[g] >= 0) {
                if (by_bytes(R, &R->metas, CB_META_INLINE, &B, spos[g], slen[g], &meta) < 0) goto done;
            } else if (meta_ref >= base) {
                break;
            } else if (meta_ref >= 0) {
                if (by_slot(R, 2, memo[meta_ref], &meta) < 0) goto done;
                if (meta < -1) {
                    break;
                }
            }
        }
        int32_t pool = -1, pslot = -1;
        if (pool_ref == -1) { /* an inline tuple: a memo entry of its own */
            if (pool_slot(R, pool_a, pool_b, &pslot) < 0) goto done;
            if (by_slot(R, 3, pslot, &pool) < 0) goto done;
        } else if (pool_ref >= base) {
            break;
        } else if (pool_ref >= 0) {
            if (by_slot(R, 3, memo[pool_ref], &pool) < 0) goto done;
        }
        if (pool < -1) {
            break; /* not a pair of integers the interpreter would keep: it reads the event */
        }
        /* the memo entries the interpreter stores: the event dict (slot 0), then per key in order its
         * inline string, new frames list or inline pool_id tuple */
        entries[m] = 0;
        esid[m++] = -1;
        for (int k = 0; k < lay->n_keys; k++) {
            int32_t slot;
            if (lay->kind[k] >= K_OTHER && spos[lay->gen[k]] >= 0) {
                if (by_bytes(R, &R->strs, CB_STRING, &B, spos[lay->gen[k]], slen[lay->gen[k]], &slot) < 0) goto done;
                entries[m] = slot;
                esid[m++] = -1;
            } else if (lay->kind[k] == K_FRAMES && list_ref < 0) {
                if (grow(&R->refslot, &R->n_refslot, (Py_ssize_t)sid + 1) < 0) goto done;
                if (R->refslot[sid] == UNKNOWN && call(R, CB_REFSLOT, PyLong_FromLong(sid), 0, &R->refslot[sid]) < 0) {
                    goto done;
                }
                entries[m] = R->refslot[sid];
                esid[m++] = sid;
            } else if (lay->kind[k] == K_POOL && pool_ref == -1) {
                entries[m] = pslot;
                esid[m++] = -1;
            }
        }
        o_action[n] = (int8_t)code;
        o_addr[n] = addr;
        o_size[n] = size;
        o_time[n] = has_time ? time : INT64_MIN;
        o_stack[n] = sid;
        o_meta[n] = meta;
        o_stream[n] = stream;
        o_pool[n] = pool;
        if (cut && n > 0) {
            PyObject *v = PyLong_FromSsize_t(n);
            if (v == NULL || PyList_Append(cuts, v) < 0) {
                Py_XDECREF(v);
                goto done;
            }
            Py_DECREF(v);
        }
        n++;
        last_end = end;
    }
    result = Py_BuildValue("nLOn", n, (long long)last_end, cuts, m);
done:
    if (R != NULL) {
        memset(R->cb, 0, sizeof(R->cb));
    }
    Py_XDECREF(cuts);
    PyMem_Free(esid);
    for (int k = 0; k < n_ov; k++) {
        PyBuffer_Release(&ov[k]);
    }
    if (have_mv) {
        PyBuffer_Release(&mv);
    }
    if (have_view) {
        PyBuffer_Release(&view);
    }
    PyMem_Free(L);
    return result;
}
