/* The snapshot pickle reader's vectorised scan (tbmem/snapshot/pickle_fast.py: scan) in one pass of C.
 *
 * The module's parser (_creader.h) is what the reader runs on trace events (_pickle_run.c);
 * scan() exposes it candidate by candidate, into the arrays pickle_fast.scan fills with numpy
 * (about 27 eight-byte gathers per event), so that tests/snapshot/test_pickle_scan_c.py compares
 * the two on real, synthetic and damaged pickles: change them together. Nothing here interprets
 * the pickle: a candidate is only bytes that look like an event.
 *
 * Output arrays are checked for their length before anything is written. The GIL is released
 * while scanning: only the caller's buffers (held by it) are touched.
 */
#include "_creader.h"

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

PyObject *tbmem_count(PyObject *module, PyObject *args) {
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

PyObject *tbmem_scan(PyObject *module, PyObject *args) {
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
