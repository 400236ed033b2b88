/* tbmem._internal.snapshot._creader, the snapshot reader's compiled parts (setup.py builds them, into the wheels too;
 * tests compare each with its Python twin): _pickle_run.c (the reader's runs of trace events, against the
 * interpreter of pickle_stream.py reading every event), _pair.c (allocator events paired by address, against
 * cuda_replay's numpy pairing); _creader.c, the module. This header holds the event parser of the runs.
 *
 * The input is hostile: every read goes through byte_at()/word(), which read zeros past ``hi``,
 * and every position is a 64-bit integer that
 * grows by at most a few hundred bytes per step, bounded by the number of steps.
 */
#ifndef TBMEM_CREADER_H
#define TBMEM_CREADER_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_FRAMES 512 /* pickle_fast.MAX_FRAMES */
#define MAX_LAYOUTS 64
#define MAX_KEYS 64
#define MAX_GENERIC 64

enum { K_FRAMES, K_ADDR, K_SIZE, K_TIME, K_STREAM, K_ACTION, K_OTHER, K_META, K_POOL };

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
    int64_t *pool_a, *pool_b, *pool_ref; /* pool_id: an inline (a, b) (pool_ref -1) or a memo reference */
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
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        memcpy(&w, B->b + p, 8); /* one unaligned load */
#else
        for (int k = 0; k < 8; k++) {
            w |= (uint64_t)B->b[p + k] << (8 * k);
        }
#endif
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

static inline void hash_span(const Buf *B, int64_t pos, int64_t len, uint64_t *out) {
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
static inline int64_t parse_frames(const Buf *B, int64_t p, uint64_t w, int *ok, Out *o, Py_ssize_t i) {
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

static inline void parse_event(const Buf *B, int64_t c, const Layout *L, Out *o, Py_ssize_t i) {
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
        if (kind == K_POOL) { /* pool_id (torch >= 2.11): INT INT TUPLE2 MEMOIZE, or a memo reference */
            int64_t idx, rlen = ref_at(w, &idx), a = 0, b = 0, la = int_at(B, p, w, &a), lb = 0;
            if (rlen > 0) {
                o->pool_ref[i] = idx;
                p += rlen;
                continue;
            }
            if (la > 0) {
                lb = int_at(B, p + la, word(B, p + la), &b);
            }
            if (la == 0 || lb == 0 || byte_at(B, p + la + lb) != 0x86 || byte_at(B, p + la + lb + 1) != 0x94) {
                ok = 0;
                p += 1;
                continue;
            }
            o->pool_a[i] = a;
            o->pool_b[i] = b;
            o->pool_ref[i] = -1;
            p += la + lb + 2;
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

static inline int read_buf(PyObject *obj, Py_buffer *view, int64_t lo, int64_t hi, Buf *B) {
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

/* layouts packed by pickle_fast._pack: per layout its number of keys, then per key kind, generic
 * index, reference length and 8 reference bytes */
static inline int unpack_layouts(PyObject *spec, Layout *L, int *n_layouts, int *n_generic) {
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
            if (at + 11 > len || u[at] > K_POOL || u[at + 2] > 8) {
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

/* the module's functions (_creader.c lists them) */
PyObject *tbmem_pair(PyObject *module, PyObject *args);
PyObject *tbmem_runner_new(PyObject *module, PyObject *unused);
PyObject *tbmem_runner_forget(PyObject *module, PyObject *capsule);
PyObject *tbmem_runner_run(PyObject *module, PyObject *args);

#endif
