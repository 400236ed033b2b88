/* The snapshot pickle reader's vectorised scan (tbmem/snapshot/pickle_fast.py: scan_numpy) in one pass of C.
 *
 * A 10M-event trace is scanned by numpy about 27 eight-byte gathers per event, each a pass over
 * arrays of ten million; here each candidate event is parsed once, left to right, with the same
 * rules, into the same arrays (tests/snapshot/test_pickle_scan_c.py compares the two on real,
 * synthetic and mutated pickles: change them together). Nothing here interprets the pickle: a
 * candidate is only bytes that look like an event, and the Python reader decides what to do with
 * the result (pickle_commit.py), so a wrong guess here could cost speed, never a wrong row.
 *
 * The input is hostile: every read goes through byte_at()/word(), which read zeros past ``hi``
 * (as the numpy version's zero-padded copy does), and every position is a 64-bit integer that
 * grows by at most a few hundred bytes per step, bounded by the number of steps. Output arrays
 * are checked for their length before anything is written. The GIL is released while scanning:
 * only the caller's buffers (held by it) are touched.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_FRAMES 512 /* pickle_fast.MAX_FRAMES */
#define MAX_LAYOUTS 64
#define MAX_KEYS 64
#define MAX_GENERIC 64

enum { K_FRAMES, K_ADDR, K_SIZE, K_TIME, K_STREAM, K_ACTION, K_OTHER, K_META };

typedef struct {
    const uint8_t *b;
    int64_t hi;
} Buf;

typedef struct {
    int n_keys;
    uint8_t kind[MAX_KEYS], gen[MAX_KEYS], ref_len[MAX_KEYS];
    uint64_t ref[MAX_KEYS], mask[MAX_KEYS];
} Layout;

/* the output columns, in the order Python passes them */
enum { O_START, O_END, O_OK, O_LAYOUT, O_ADDR, O_SIZE, O_TIME, O_STREAM, O_HAS_TIME, O_ACTION_REF, O_LIST_REF,
       O_SPAN_POS, O_SPAN_LEN, O_SPAN_HASH, O_INLINE, O_INLINE_BF, O_META_REF, O_CHAIN, O_BATCH_END, N_OUT };
static const Py_ssize_t OUT_ITEM[N_OUT] = {8, 8, 1, 1, 8, 8, 8, 8, 1, 8, 8, 8, 8, 16, 8, 8, 8, 8, 1};

typedef struct {
    int64_t *start, *end, *addr, *size, *time, *stream, *action_ref, *list_ref, *span_pos, *span_len, *inl,
        *inl_bf, *meta_ref, *chain;
    uint64_t *span_hash;
    uint8_t *ok, *has_time, *batch_end;
    int8_t *layout;
    int64_t *str_pos[MAX_GENERIC], *str_len[MAX_GENERIC];
} Out;

static inline uint8_t byte_at(const Buf *B, int64_t p) { return (p >= 0 && p < B->hi) ? B->b[p] : 0; }

/* the 8 bytes from p, little-endian, zeros past hi */
static inline uint64_t word(const Buf *B, int64_t p) {
    uint64_t w = 0;
    if (p >= 0 && p <= B->hi - 8) {
        const uint8_t *s = B->b + p;
        for (int k = 0; k < 8; k++) {
            w |= (uint64_t)s[k] << (8 * k); /* compilers turn this into one load on little-endian machines */
        }
        return w;
    }
    for (int k = 0; k < 8; k++) {
        w |= (uint64_t)byte_at(B, p + k) << (8 * k);
    }
    return w;
}

/* K, M, J and LONG1 (1-8 bytes) at p: the encoding's length (0: not an integer) and its value */
static inline int64_t int_at(const Buf *B, int64_t p, uint64_t w, int64_t *val) {
    int op = (int)(w & 0xFF), nb, off, sgn;
    switch (op) {
    case 0x4B: nb = 1; off = 1; sgn = 0; break;
    case 0x4D: nb = 2; off = 1; sgn = 0; break;
    case 0x4A: nb = 4; off = 1; sgn = 1; break;
    case 0x8A: {
        int n1 = (int)((w >> 8) & 0xFF);
        nb = (n1 >= 1 && n1 <= 8) ? n1 : 0;
        off = 2;
        sgn = 1;
        break;
    }
    default: nb = 0; off = 0; sgn = 0;
    }
    if (nb == 0) {
        *val = 0;
        return 0;
    }
    uint64_t raw = word(B, p + off);
    if (nb < 8) {
        raw &= ((uint64_t)1 << (8 * nb)) - 1;
        if (sgn && ((raw >> (8 * nb - 1)) & 1)) {
            raw -= (uint64_t)1 << (8 * nb); /* two's complement of the short encoding, in 64 bits */
        }
    }
    *val = (int64_t)raw;
    return off + nb;
}

/* BINGET/LONG_BINGET: the reference's length (0: not one) and memo index (-1 when not one) */
static inline int64_t ref_at(uint64_t w, int64_t *idx) {
    int op = (int)(w & 0xFF);
    if (op == 0x68) {
        *idx = (int64_t)((w >> 8) & 0xFF);
        return 2;
    }
    if (op == 0x6A) {
        *idx = (int64_t)((w >> 8) & 0xFFFFFFFFu);
        return 5;
    }
    *idx = -1;
    return 0;
}

#define P1 0x9E3779B97F4A7C15ull
#define P2 0xC2B2AE3D27D4EB4Full

static void hash_span(const Buf *B, int64_t pos, int64_t len, uint64_t *out) {
    uint64_t h1 = (uint64_t)len * P2, h2 = (uint64_t)len ^ P1;
    for (int64_t k = 0; len > 0; k++) {
        int64_t left = len - 8 * k;
        uint64_t w = word(B, pos + 8 * k);
        if (left < 8) {
            w &= ((uint64_t)1 << (8 * left)) - 1;
        }
        h1 = (h1 ^ w) * P1;
        h2 = ((h2 + w) * P2) ^ (h2 >> 29);
        if (left <= 8) {
            break;
        }
    }
    out[0] = h1;
    out[1] = h2;
}

/* the frames value at p of candidate i: a reference to a list, or a new list of references */
static int64_t parse_frames(const Buf *B, int64_t p, uint64_t w, int *ok, Out *o, Py_ssize_t i) {
    int64_t idx, rlen = ref_at(w, &idx), end = p + rlen, q = p + 2, span_pos, span_len = 0;
    int op = (int)(w & 0xFF), c = (int)((w >> 16) & 0xFF);
    int is_new = op == 0x5D;
    o->list_ref[i] = idx;
    if (!(rlen > 0 || (is_new && ((w >> 8) & 0xFF) == 0x94))) {
        *ok = 0;
    }
    int multi = is_new && c == 0x28, single = is_new && (c == 0x68 || c == 0x6A);
    if (is_new && !multi && !single) {
        end = q;
    }
    span_pos = multi ? q + 1 : q;
    if (single) {
        int64_t r, l = ref_at(word(B, q), &r), after = q + l;
        if (byte_at(B, after) != 0x61) {
            *ok = 0;
        }
        span_len = l;
        end = after + 1;
    }
    if (multi) {
        int64_t pos = q + 1;
        int done = 0;
        for (int depth = 0; depth <= MAX_FRAMES; depth++) {
            uint64_t wa = word(B, pos);
            int64_t r, l = ref_at(wa, &r);
            if ((wa & 0xFF) == 0x65) { /* APPENDS: the list ends */
                end = pos + 1;
                span_len = pos - span_pos;
                done = 1;
                break;
            }
            if (l == 0) { /* neither a reference nor the end: left to the interpreter */
                *ok = 0;
                done = 1;
                break;
            }
            pos += l;
        }
        if (!done) {
            *ok = 0; /* longer than MAX_FRAMES */
        }
    }
    o->span_pos[i] = is_new ? span_pos : 0;
    o->span_len[i] = is_new ? span_len : 0;
    hash_span(B, o->span_pos[i], o->span_len[i], o->span_hash + 2 * i);
    o->inl_bf[i] = o->inl[i];
    return end;
}

static void parse_event(const Buf *B, int64_t c, const Layout *L, Out *o, Py_ssize_t i) {
    int64_t p = c + 3;
    int ok = 1, time_seen = 0;
    for (int k = 0; k < L->n_keys; k++) {
        if ((word(B, p) & L->mask[k]) != L->ref[k]) {
            ok = 0;
        }
        p += L->ref_len[k];
        uint64_t w = word(B, p);
        int kind = L->kind[k];
        if (kind == K_FRAMES) {
            p = parse_frames(B, p, w, &ok, o, i);
            continue;
        }
        if (kind <= K_STREAM) {
            int64_t v, len = int_at(B, p, w, &v);
            if (len == 0) {
                ok = 0;
            }
            if (kind == K_ADDR) o->addr[i] = v;
            else if (kind == K_SIZE) o->size[i] = v;
            else if (kind == K_TIME) { o->time[i] = v; time_seen = 1; }
            else o->stream[i] = v;
            p += len;
            continue;
        }
        /* any other value: a memo reference, an inline short string, None/True/False or an integer */
        int op = (int)(w & 0xFF);
        int64_t idx, rlen = ref_at(w, &idx), slen = (int64_t)((w >> 8) & 0xFF) + 3, ival;
        int is_str = op == 0x8C, single = op == 0x4E || op == 0x88 || op == 0x89;
        int64_t ilen = int_at(B, p, w, &ival);
        if (is_str && byte_at(B, p + slen - 1) != 0x94) {
            ok = 0;
        }
        int64_t len = rlen > 0 ? rlen : is_str ? slen : single ? 1 : ilen;
        if (len <= 0) {
            ok = 0;
        }
        if (kind == K_ACTION) {
            if (rlen == 0) {
                ok = 0; /* the action string itself must be a reference (inline: first occurrence) */
            }
            o->action_ref[i] = idx;
        } else {
            o->inl[i] += is_str;
            o->str_pos[L->gen[k]][i] = is_str ? p + 2 : -1;
            o->str_len[L->gen[k]][i] = is_str ? slen - 3 : 0;
            if (kind == K_META) {
                o->meta_ref[i] = rlen > 0 ? idx : -1;
            }
        }
        p += len;
    }
    if (byte_at(B, p) != 0x75) { /* SETITEMS */
        ok = 0;
    }
    int64_t end = p + 1;
    o->ok[i] = ok && end <= B->hi;
    o->end[i] = end;
    o->has_time[i] = (uint8_t)time_seen;
    if (!time_seen) {
        o->time[i] = 0;
    }
}

/* events back to back, or separated only by a FRAME header and/or "APPENDS MARK" (Scan.finish) */
static void finish(const Buf *B, Out *o, Py_ssize_t n) {
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        int link = 0, appends = 0;
        if (i + 1 < n && o->ok[i] && o->ok[i + 1]) {
            int64_t gap = o->start[i + 1] - o->end[i];
            uint64_t w = word(B, o->end[i]);
            appends = (w & 0xFFFF) == 0x2865; /* "e(" */
            link = gap == 0 || (gap == 9 && (w & 0xFF) == 0x95) || (gap == 2 && appends) ||
                   (gap == 11 && appends && ((w >> 16) & 0xFF) == 0x95);
        }
        o->batch_end[i] = link && appends && (o->start[i + 1] - o->end[i] == 2 || o->start[i + 1] - o->end[i] == 11);
        o->chain[i] = !o->ok[i] ? 0 : link ? o->chain[i + 1] + 1 : 1;
    }
}

static Py_ssize_t count_candidates(const Buf *B, int64_t lo, int64_t *pos) {
    Py_ssize_t n = 0;
    const uint8_t *s = B->b;
    for (int64_t c = lo; c < B->hi;) {
        const uint8_t *hit = memchr(s + c, 0x7D, (size_t)(B->hi - c));
        if (hit == NULL) {
            break;
        }
        c = hit - s;
        if (byte_at(B, c + 1) == 0x94 && byte_at(B, c + 2) == 0x28) {
            if (pos != NULL) {
                pos[n] = c;
            }
            n++;
        }
        c++;
    }
    return n;
}

static int read_buf(PyObject *obj, Py_buffer *view, int64_t lo, int64_t hi, Buf *B) {
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0) {
        return -1;
    }
    if (lo < 0 || hi < 0 || hi > view->len) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "lo and hi must lie within the buffer");
        return -1;
    }
    B->b = view->buf;
    B->hi = hi;
    return 0;
}

static PyObject *count(PyObject *module, PyObject *args) {
    PyObject *obj;
    long long lo, hi;
    Py_buffer view;
    Buf B;
    if (!PyArg_ParseTuple(args, "OLL", &obj, &lo, &hi) || read_buf(obj, &view, lo, hi, &B) < 0) {
        return NULL;
    }
    Py_ssize_t n;
    Py_BEGIN_ALLOW_THREADS
    n = count_candidates(&B, lo, NULL);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(n);
}

/* layouts packed by pickle_fast._pack: per layout its number of keys, then per key kind, generic
 * index, reference length and 8 reference bytes */
static int unpack_layouts(PyObject *spec, Layout *L, int *n_layouts, int *n_generic) {
    char *s;
    Py_ssize_t len, at = 1;
    if (PyBytes_AsStringAndSize(spec, &s, &len) < 0) {
        return -1;
    }
    const uint8_t *u = (const uint8_t *)s;
    if (len < 1 || u[0] > MAX_LAYOUTS) {
        goto bad;
    }
    *n_layouts = u[0];
    *n_generic = 0;
    for (int li = 0; li < *n_layouts; li++) {
        if (at >= len || u[at] < 1 || u[at] > MAX_KEYS) {
            goto bad;
        }
        L[li].n_keys = u[at++];
        for (int k = 0; k < L[li].n_keys; k++) {
            if (at + 11 > len || u[at] > K_META || u[at + 2] > 8) {
                goto bad;
            }
            L[li].kind[k] = u[at];
            L[li].gen[k] = u[at + 1];
            L[li].ref_len[k] = u[at + 2];
            uint64_t ref = 0;
            for (int b = 0; b < 8; b++) {
                ref |= (uint64_t)u[at + 3 + b] << (8 * b);
            }
            L[li].mask[k] = u[at + 2] == 8 ? ~0ull : ((uint64_t)1 << (8 * u[at + 2])) - 1;
            L[li].ref[k] = ref & L[li].mask[k];
            if (L[li].kind[k] >= K_OTHER) {
                if (L[li].gen[k] >= MAX_GENERIC) {
                    goto bad;
                }
                if (L[li].gen[k] + 1 > *n_generic) {
                    *n_generic = L[li].gen[k] + 1;
                }
            }
            at += 11;
        }
    }
    if (at != len) {
        goto bad;
    }
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "malformed layout spec");
    return -1;
}

static PyObject *scan(PyObject *module, PyObject *args) {
    PyObject *obj, *spec, *outs, *str_pos, *str_len;
    long long lo, hi;
    Py_buffer view, views[N_OUT + 2 * MAX_GENERIC];
    int n_views = 0, n_layouts, n_generic;
    Buf B;
    Layout *L = PyMem_Calloc(MAX_LAYOUTS, sizeof(Layout));
    Out o;
    PyObject *result = NULL;
    if (L == NULL) {
        return PyErr_NoMemory();
    }
    if (!PyArg_ParseTuple(args, "OLLSO!O!O!", &obj, &lo, &hi, &spec, &PyTuple_Type, &outs, &PyTuple_Type, &str_pos,
                          &PyTuple_Type, &str_len) || unpack_layouts(spec, L, &n_layouts, &n_generic) < 0) {
        PyMem_Free(L);
        return NULL;
    }
    if (read_buf(obj, &view, lo, hi, &B) < 0) {
        PyMem_Free(L);
        return NULL;
    }
    Py_ssize_t n = count_candidates(&B, lo, NULL);
    if (PyTuple_GET_SIZE(outs) != N_OUT || PyTuple_GET_SIZE(str_pos) != n_generic ||
        PyTuple_GET_SIZE(str_len) != n_generic) {
        PyErr_SetString(PyExc_ValueError, "wrong number of output arrays");
        goto done;
    }
    void *ptr[N_OUT + 2 * MAX_GENERIC];
    for (int k = 0; k < N_OUT + 2 * n_generic; k++) {
        PyObject *a = k < N_OUT ? PyTuple_GET_ITEM(outs, k) : k < N_OUT + n_generic ?
            PyTuple_GET_ITEM(str_pos, k - N_OUT) : PyTuple_GET_ITEM(str_len, k - N_OUT - n_generic);
        Py_ssize_t item = k < N_OUT ? OUT_ITEM[k] : 8;
        if (PyObject_GetBuffer(a, &views[n_views], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
            goto done;
        }
        n_views++;
        if (views[n_views - 1].len != n * item) {
            PyErr_Format(PyExc_ValueError, "output array %d holds %zd bytes, not %zd", k, views[n_views - 1].len, n * item);
            goto done;
        }
        ptr[k] = views[n_views - 1].buf;
    }
    o.start = ptr[O_START]; o.end = ptr[O_END]; o.ok = ptr[O_OK]; o.layout = ptr[O_LAYOUT]; o.addr = ptr[O_ADDR];
    o.size = ptr[O_SIZE]; o.time = ptr[O_TIME]; o.stream = ptr[O_STREAM]; o.has_time = ptr[O_HAS_TIME];
    o.action_ref = ptr[O_ACTION_REF]; o.list_ref = ptr[O_LIST_REF]; o.span_pos = ptr[O_SPAN_POS];
    o.span_len = ptr[O_SPAN_LEN]; o.span_hash = ptr[O_SPAN_HASH]; o.inl = ptr[O_INLINE]; o.inl_bf = ptr[O_INLINE_BF];
    o.meta_ref = ptr[O_META_REF]; o.chain = ptr[O_CHAIN]; o.batch_end = ptr[O_BATCH_END];
    for (int g = 0; g < n_generic; g++) {
        o.str_pos[g] = ptr[N_OUT + g];
        o.str_len[g] = ptr[N_OUT + n_generic + g];
    }
    Py_ssize_t used[MAX_LAYOUTS] = {0};
    Py_BEGIN_ALLOW_THREADS
    count_candidates(&B, lo, o.start);
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t c = o.start[i];
        uint64_t w = word(&B, c + 3);
        o.ok[i] = 0;
        o.layout[i] = 0;
        for (int li = 0; li < n_layouts; li++) { /* the first layout whose first key is there */
            if ((w & L[li].mask[0]) == L[li].ref[0]) {
                o.layout[i] = (int8_t)li;
                used[li]++;
                parse_event(&B, c, &L[li], &o, i);
                break;
            }
        }
    }
    finish(&B, &o, n);
    Py_END_ALLOW_THREADS
    result = PyTuple_New(n_layouts);
    for (int li = 0; result != NULL && li < n_layouts; li++) {
        PyObject *v = PyLong_FromSsize_t(used[li]);
        if (v == NULL) {
            Py_CLEAR(result);
        } else {
            PyTuple_SET_ITEM(result, li, v);
        }
    }
done:
    for (int k = 0; k < n_views; k++) {
        PyBuffer_Release(&views[k]);
    }
    PyBuffer_Release(&view);
    PyMem_Free(L);
    return result;
}

static PyMethodDef methods[] = {
    {"count", count, METH_VARARGS,
     "count(buf, lo, hi) -> int\n\nHow many candidate events (the bytes ``}\\x94(``) start in ``buf[lo:hi]``."},
    {"scan", scan, METH_VARARGS,
     "scan(buf, lo, hi, spec, outs, str_pos, str_len) -> tuple\n\npickle_fast.scan_numpy into the given arrays "
     "(pickle_fast._scan_c passes them); returns how many candidates each layout took."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pickle_scan",
                                    "The snapshot pickle reader's scan in C.", -1, methods};

PyMODINIT_FUNC PyInit__pickle_scan(void) {
    PyObject *m = PyModule_Create(&module);
    PyObject *all = m ? Py_BuildValue("[ss]", "count", "scan") : NULL;
    if (all == NULL || PyModule_AddObject(m, "__all__", all) < 0) { /* the project's rule: every module has __all__ */
        Py_XDECREF(all);
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
