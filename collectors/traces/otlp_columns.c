/* Compiled OTLP protobuf decode: ExportTraceServiceRequest bytes straight into column buffers.

   This owns one question: is a body plain enough to map without the reference decoder, and if
   so, what are its request rows, column by column. "Plain" means every byte is a field of
   opentelemetry-proto's trace schema in the expected wire type, no singular field repeated, every
   string valid UTF-8, and every request span maps without a refusal: then the reference path
   (protobuf's parse, then the flat reader and RequestRows.add_request) would accept the body and
   produce exactly these rows. Anything else - unknown fields, a refused span, an unusual value
   kind for a mapped key - answers None, and the caller runs the reference path on the whole body,
   which so decides every refusal and names it. The module never refuses a body itself.

   decode(body, span_name, keys, fixed) -> None | tuple
     keys: the attribute keys the mapping reads, as bytes; the first `fixed` in the order of
     otlp_native.FIXED_KEYS, then the dimension keys (which must not repeat a fixed key).
   The tuple (see otlp_native.Columns for names): spans, rows, resources (per ResourceSpans: the
   encoded Resource or None), combos (per distinct resource and span-level dimension values: the
   ResourceSpans index and ((key index, str or None), ...)), then buffers: combo ids (uint32),
   trace id and span id hex (large_string offsets and data), request id and error type
   (validity, offsets, data), ok (bitmap), prompt, completion and max tokens (validity, int64),
   six latencies (validity, float64), start and end (int64 microseconds, truncated).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_KEYS 64
#define MAX_DEPTH 32
/* The fixed keys' positions (otlp_native.FIXED_KEYS). */
enum { K_REQUEST_ID, K_ERROR_TYPE, K_LAT0, K_PROMPT = K_LAT0 + 6, K_PROMPT2, K_COMPLETION,
       K_COMPLETION2, K_MAX_TOKENS, N_FIXED };
enum { V_ABSENT, V_NONE, V_STRING, V_BOOL, V_INT, V_DOUBLE, V_OTHER };
#define STATUS_ERROR 2
#define DEFER 1 /* not plain: the reference path decides */
#define FAIL -1 /* a Python exception is set */
#define ABSENT 0
#define PRESENT 2

typedef struct { uint8_t *data; size_t len, cap; } Buf;

static int buf_grow(Buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    uint8_t *data = PyMem_Realloc(b->data, cap);
    if (data == NULL) { PyErr_NoMemory(); return FAIL; }
    b->data = data; b->cap = cap;
    return 0;
}
static inline int buf_put(Buf *b, const void *p, size_t n) {
    if (buf_grow(b, n)) return FAIL;
    memcpy(b->data + b->len, p, n); b->len += n;
    return 0;
}
static inline int put_u64(Buf *b, uint64_t v) { return buf_put(b, &v, 8); }
/* A bitmap bit for row `row` (bitmaps grow a byte per eight rows, zeroed). */
static inline int put_bit(Buf *b, size_t row, int bit) {
    if (row % 8 == 0) { uint8_t z = 0; if (buf_put(b, &z, 1)) return FAIL; }
    if (bit) b->data[row / 8] |= (uint8_t)(1u << (row % 8));
    return 0;
}

typedef struct { const uint8_t *p; size_t n; } Slice;

static inline int varint(const uint8_t **pp, const uint8_t *end, uint64_t *out) {
    const uint8_t *p = *pp; uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (p >= end) return DEFER;
        uint8_t byte = *p++;
        if (shift == 63 && byte > 1) return DEFER; /* past 64 bits: let protobuf judge */
        v |= (uint64_t)(byte & 0x7F) << shift;
        if (byte < 0x80) { *pp = p; *out = v; return 0; }
    }
    return DEFER;
}

/* One field's header and, for length-delimited fields, its slice. */
typedef struct { uint32_t number; int wire; uint64_t value; Slice bytes; } Field;

static inline int next_field(const uint8_t **pp, const uint8_t *end, Field *f) {
    uint64_t tag;
    if (varint(pp, end, &tag) || tag > 0xFFFFFFFFu || (tag >> 3) == 0) return DEFER;
    f->number = (uint32_t)(tag >> 3); f->wire = (int)(tag & 7);
    switch (f->wire) {
    case 0: return varint(pp, end, &f->value);
    case 1:
        if (end - *pp < 8) return DEFER;
        memcpy(&f->value, *pp, 8); *pp += 8; return 0;
    case 2: {
        uint64_t n;
        if (varint(pp, end, &n) || n > (uint64_t)(end - *pp)) return DEFER;
        f->bytes.p = *pp; f->bytes.n = (size_t)n; *pp += n; return 0;
    }
    case 5: {
        uint32_t v;
        if (end - *pp < 4) return DEFER;
        memcpy(&v, *pp, 4); f->value = v; *pp += 4; return 0;
    }
    default: return DEFER; /* groups and invalid wire types */
    }
}

/* Strict UTF-8, as Python's str.decode and protobuf's check: no overlongs, no surrogates. */
static int utf8_ok(const uint8_t *p, size_t n) {
    const uint8_t *end = p + n;
    while (p < end) {
        if (end - p >= 8) {
            uint64_t w; memcpy(&w, p, 8);
            if (!(w & 0x8080808080808080ull)) { p += 8; continue; }
        }
        uint8_t c = *p;
        if (c < 0x80) { p++; continue; }
        if (c >= 0xC2 && c <= 0xDF) {
            if (end - p < 2 || (p[1] & 0xC0) != 0x80) return 0;
            p += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (end - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
            if (c == 0xE0 && p[1] < 0xA0) return 0;
            if (c == 0xED && p[1] > 0x9F) return 0;
            p += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (end - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 ||
                (p[3] & 0xC0) != 0x80) return 0;
            if (c == 0xF0 && p[1] < 0x90) return 0;
            if (c == 0xF4 && p[1] > 0x8F) return 0;
            p += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

#define SEEN(bit) do { if (seen & (1u << (bit))) return DEFER; seen |= 1u << (bit); } while (0)
#define STRING_FIELD(f) ((f).wire == 2 && utf8_ok((f).bytes.p, (f).bytes.n))

static int any_value(Slice s, int depth, int *kind, Field *value);

/* A KeyValue: key and value, each at most once; `kind` and `value` describe the value. */
static int key_value(Slice s, int depth, Slice *key, int *kind, Field *value) {
    const uint8_t *p = s.p, *end = s.p + s.n; uint32_t seen = 0; Field f;
    key->p = s.p; key->n = 0; *kind = V_ABSENT;
    while (p < end) {
        if (next_field(&p, end, &f)) return DEFER;
        if (f.number == 1 && STRING_FIELD(f)) { SEEN(1); *key = f.bytes; }
        else if (f.number == 2 && f.wire == 2) {
            SEEN(2);
            if (any_value(f.bytes, depth + 1, kind, value)) return DEFER;
        } else return DEFER;
    }
    return 0;
}

static int repeated_values(Slice s, int depth, int key_values) {
    const uint8_t *p = s.p, *end = s.p + s.n; Field f, v; Slice k; int kind;
    while (p < end) {
        if (next_field(&p, end, &f) || f.number != 1 || f.wire != 2) return DEFER;
        if (key_values ? key_value(f.bytes, depth, &k, &kind, &v)
                       : any_value(f.bytes, depth + 1, &kind, &v)) return DEFER;
    }
    return 0;
}

/* An AnyValue of at most one field (protobuf would merge or override several). */
static int any_value(Slice s, int depth, int *kind, Field *value) {
    const uint8_t *p = s.p, *end = s.p + s.n; Field f;
    if (depth > MAX_DEPTH) return DEFER;
    *kind = V_NONE;
    if (p == end) return 0;
    if (next_field(&p, end, &f) || p != end) return DEFER;
    *value = f;
    switch (f.number) {
    case 1: if (!STRING_FIELD(f)) return DEFER; *kind = V_STRING; return 0;
    case 2: if (f.wire != 0) return DEFER; *kind = V_BOOL; return 0;
    case 3: if (f.wire != 0) return DEFER; *kind = V_INT; return 0;
    case 4: if (f.wire != 1) return DEFER; *kind = V_DOUBLE; return 0;
    case 5: case 6:
        if (f.wire != 2) return DEFER;
        *kind = V_OTHER; return repeated_values(f.bytes, depth, f.number == 6);
    case 7: if (f.wire != 2) return DEFER; *kind = V_OTHER; return 0;
    default: return DEFER;
    }
}

static int plain_key_value(Slice s) {
    Slice k; int kind; Field v;
    return key_value(s, 0, &k, &kind, &v);
}

/* InstrumentationScope and Resource: validated only (resources are decoded by the caller). */
static int scope(Slice s) {
    const uint8_t *p = s.p, *end = s.p + s.n; uint32_t seen = 0; Field f;
    while (p < end) {
        if (next_field(&p, end, &f)) return DEFER;
        if ((f.number == 1 || f.number == 2) && STRING_FIELD(f)) SEEN(f.number);
        else if (f.number == 3 && f.wire == 2) { if (plain_key_value(f.bytes)) return DEFER; }
        else if (f.number == 4 && f.wire == 0) SEEN(4);
        else return DEFER;
    }
    return 0;
}

static int resource(Slice s) {
    const uint8_t *p = s.p, *end = s.p + s.n; uint32_t seen = 0; Field f;
    while (p < end) {
        if (next_field(&p, end, &f)) return DEFER;
        if (f.number == 1 && f.wire == 2) { if (plain_key_value(f.bytes)) return DEFER; }
        else if (f.number == 2 && f.wire == 0) SEEN(2);
        else return DEFER;
    }
    return 0;
}

static int span_event(Slice s) {
    const uint8_t *p = s.p, *end = s.p + s.n; uint32_t seen = 0; Field f;
    while (p < end) {
        if (next_field(&p, end, &f)) return DEFER;
        if (f.number == 1 && f.wire == 1) SEEN(1);
        else if (f.number == 2 && STRING_FIELD(f)) SEEN(2);
        else if (f.number == 3 && f.wire == 2) { if (plain_key_value(f.bytes)) return DEFER; }
        else if (f.number == 4 && f.wire == 0) SEEN(4);
        else return DEFER;
    }
    return 0;
}

static int span_link(Slice s) {
    const uint8_t *p = s.p, *end = s.p + s.n; uint32_t seen = 0; Field f;
    while (p < end) {
        if (next_field(&p, end, &f)) return DEFER;
        if ((f.number == 1 || f.number == 2) && f.wire == 2) SEEN(f.number);
        else if (f.number == 3 && STRING_FIELD(f)) SEEN(3);
        else if (f.number == 4 && f.wire == 2) { if (plain_key_value(f.bytes)) return DEFER; }
        else if (f.number == 5 && f.wire == 0) SEEN(5);
        else if (f.number == 6 && f.wire == 5) SEEN(6);
        else return DEFER;
    }
    return 0;
}

static int status_code(Slice s, int32_t *code) {
    const uint8_t *p = s.p, *end = s.p + s.n; uint32_t seen = 0; Field f;
    while (p < end) {
        if (next_field(&p, end, &f)) return DEFER;
        if (f.number == 2 && STRING_FIELD(f)) SEEN(2);
        else if (f.number == 3 && f.wire == 0) { SEEN(3); *code = (int32_t)(uint32_t)f.value; }
        else return DEFER;
    }
    return 0;
}

#define MAX_KEY_BYTES 255 /* longer keys are compared one by one */

typedef struct {
    Slice keys[MAX_KEYS];
    int n_keys;
    Slice span_name;
    /* Key indices by key length: by_length[first[n] .. first[n + 1]) have n bytes. Most of a
       span's attributes are then found, or known absent, by one or two comparisons. */
    uint8_t first[MAX_KEY_BYTES + 2];
    uint8_t by_length[MAX_KEYS];
} Mapping;

static void index_keys(Mapping *m) {
    int count[MAX_KEY_BYTES + 2] = {0};
    for (int i = 0; i < m->n_keys; i++) count[m->keys[i].n <= MAX_KEY_BYTES ? m->keys[i].n : MAX_KEY_BYTES + 1]++;
    int at = 0;
    for (int n = 0; n <= MAX_KEY_BYTES + 1; n++) { m->first[n] = (uint8_t)at; at += count[n]; }
    int next[MAX_KEY_BYTES + 2];
    for (int n = 0; n <= MAX_KEY_BYTES + 1; n++) next[n] = m->first[n];
    for (int i = 0; i < m->n_keys; i++) {
        size_t n = m->keys[i].n <= MAX_KEY_BYTES ? m->keys[i].n : MAX_KEY_BYTES + 1;
        m->by_length[next[n]++] = (uint8_t)i;
    }
}

typedef struct {
    size_t rows, spans;
    Buf combo_ids, trace_offsets, trace_data, span_offsets, span_data;
    Buf text_valid[2], text_offsets[2], text_data[2]; /* request id, error type */
    Buf ok_bits;
    Buf count_valid[3], count_data[3]; /* prompt, completion, max tokens */
    Buf latency_valid[6], latency_data[6];
    Buf start, end;
    Buf signature, last_signature;
    PyObject *combo_index; /* signature bytes -> combo number */
    PyObject *combos;      /* list of (resource index, ((key index, str | None), ...)) */
    uint32_t last_combo;
    int have_last;
} Out;

/* What one span's mapped attributes hold. */
typedef struct {
    int kind[MAX_KEYS];
    Field value[MAX_KEYS];
} Attrs;

static inline int lookup(const Mapping *m, Slice key) {
    if (key.n <= MAX_KEY_BYTES) {
        int stop = m->first[key.n + 1];
        for (int j = m->first[key.n]; j < stop; j++) {
            int i = m->by_length[j];
            if (key.n == m->keys[i].n && memcmp(m->keys[i].p, key.p, key.n) == 0) return i;
        }
        return -1;
    }
    for (int i = 0; i < m->n_keys; i++) {
        if (m->keys[i].n == key.n && memcmp(m->keys[i].p, key.p, key.n) == 0) return i;
    }
    return -1;
}

static const char HEX[] = "0123456789abcdef";

static int put_hex(Buf *offsets, Buf *data, Slice id, size_t row) {
    if (row == 0 && put_u64(offsets, 0)) return FAIL;
    if (buf_grow(data, id.n * 2)) return FAIL;
    uint8_t *o = data->data + data->len;
    for (size_t i = 0; i < id.n; i++) { o[2 * i] = HEX[id.p[i] >> 4]; o[2 * i + 1] = HEX[id.p[i] & 15]; }
    data->len += id.n * 2;
    return put_u64(offsets, data->len);
}

static int put_text(Out *o, int which, const Attrs *a, int key) {
    size_t row = o->rows;
    if (row == 0 && put_u64(&o->text_offsets[which], 0)) return FAIL;
    int present = a->kind[key] == V_STRING;
    if (present && buf_put(&o->text_data[which], a->value[key].bytes.p, a->value[key].bytes.n))
        return FAIL;
    if (put_bit(&o->text_valid[which], row, present)) return FAIL;
    return put_u64(&o->text_offsets[which], o->text_data[which].len);
}

/* A count attribute as the mapping reads it: the first key holding a value must hold a
   non-negative int64. PRESENT, ABSENT, or DEFER otherwise. */
static int count_of(const Attrs *a, int first, int second, int64_t *out) {
    int keys[2] = {first, second};
    for (int i = 0; i < (second < 0 ? 1 : 2); i++) {
        int k = keys[i], kind = a->kind[k];
        if (kind == V_ABSENT || kind == V_NONE) continue;
        if (kind != V_INT || (int64_t)a->value[k].value < 0) return DEFER;
        *out = (int64_t)a->value[k].value;
        return PRESENT;
    }
    return ABSENT;
}

static int put_count(Out *o, int which, int present, int64_t value) {
    if (put_bit(&o->count_valid[which], o->rows, present)) return FAIL;
    return put_u64(&o->count_data[which], present ? (uint64_t)value : 0);
}

/* The combo of this span's resource and span-level dimension values. */
static int combo_of(Out *o, const Mapping *m, const Attrs *a, uint32_t resource_index,
                    uint32_t *combo) {
    Buf *sig = &o->signature;
    sig->len = 0;
    if (buf_put(sig, &resource_index, 4)) return FAIL;
    for (int k = N_FIXED; k < m->n_keys; k++) {
        int kind = a->kind[k];
        if (kind == V_ABSENT) continue;
        if (kind != V_NONE && kind != V_STRING) return DEFER; /* str() of other kinds */
        uint32_t n = kind == V_STRING ? (uint32_t)a->value[k].bytes.n : 0;
        uint8_t head[6] = {(uint8_t)k, (uint8_t)kind, 0, 0, 0, 0};
        memcpy(head + 2, &n, 4);
        if (buf_put(sig, head, 6) || (n && buf_put(sig, a->value[k].bytes.p, n))) return FAIL;
    }
    if (o->have_last && sig->len == o->last_signature.len &&
        memcmp(sig->data, o->last_signature.data, sig->len) == 0) {
        *combo = o->last_combo;
        return 0;
    }
    PyObject *key = PyBytes_FromStringAndSize((const char *)sig->data, (Py_ssize_t)sig->len);
    if (key == NULL) return FAIL;
    PyObject *found = PyDict_GetItemWithError(o->combo_index, key);
    if (found != NULL) {
        *combo = (uint32_t)PyLong_AsUnsignedLong(found);
    } else if (PyErr_Occurred()) {
        Py_DECREF(key); return FAIL;
    } else {
        *combo = (uint32_t)PyList_GET_SIZE(o->combos);
        PyObject *values = PyList_New(0), *number = PyLong_FromUnsignedLong(*combo);
        int failed = values == NULL || number == NULL ||
                     PyDict_SetItem(o->combo_index, key, number) < 0;
        for (int k = N_FIXED; !failed && k < m->n_keys; k++) {
            int kind = a->kind[k];
            if (kind == V_ABSENT) continue;
            PyObject *pair = kind == V_STRING
                ? Py_BuildValue("(is#)", k, (const char *)a->value[k].bytes.p,
                                (Py_ssize_t)a->value[k].bytes.n)
                : Py_BuildValue("(iO)", k, Py_None);
            failed = pair == NULL || PyList_Append(values, pair) < 0;
            Py_XDECREF(pair);
        }
        PyObject *entry = NULL;
        if (!failed) {
            PyObject *frozen = PyList_AsTuple(values);
            entry = frozen ? Py_BuildValue("(IN)", resource_index, frozen) : NULL;
            failed = entry == NULL || PyList_Append(o->combos, entry) < 0;
        }
        Py_XDECREF(entry); Py_XDECREF(values); Py_XDECREF(number);
        if (failed) { Py_DECREF(key); return FAIL; }
    }
    Py_DECREF(key);
    o->last_signature.len = 0;
    if (buf_put(&o->last_signature, sig->data, sig->len)) return FAIL;
    o->last_combo = *combo; o->have_last = 1;
    return 0;
}

static int span(Out *o, const Mapping *m, Slice s, uint32_t resource_index) {
    const uint8_t *p = s.p, *end = s.p + s.n; uint32_t seen = 0; Field f;
    Slice trace_id = {s.p, 0}, span_id = {s.p, 0}, name = {s.p, 0};
    uint64_t start = 0, finish = 0; int32_t code = 0; int unmappable = 0;
    Attrs a;
    for (int k = 0; k < m->n_keys; k++) a.kind[k] = V_ABSENT;
    while (p < end) {
        if (next_field(&p, end, &f)) return DEFER;
        switch (f.number) {
        case 1: if (f.wire != 2) return DEFER; SEEN(1); trace_id = f.bytes; break;
        case 2: if (f.wire != 2) return DEFER; SEEN(2); span_id = f.bytes; break;
        case 3: if (!STRING_FIELD(f)) return DEFER; SEEN(3); break;
        case 4: if (f.wire != 2) return DEFER; SEEN(4); break;
        case 5: if (!STRING_FIELD(f)) return DEFER; SEEN(5); name = f.bytes; break;
        case 6: case 10: case 12: case 14: if (f.wire != 0) return DEFER; SEEN(f.number); break;
        case 7: if (f.wire != 1) return DEFER; SEEN(7); start = f.value; break;
        case 8: if (f.wire != 1) return DEFER; SEEN(8); finish = f.value; break;
        case 9: {
            Slice key; int kind; Field value;
            if (f.wire != 2 || key_value(f.bytes, 0, &key, &kind, &value)) return DEFER;
            int k = lookup(m, key);
            if (k >= 0) {
                /* a repeated mapped key: the last wins in a dict; rare, left to the reference */
                if (a.kind[k] != V_ABSENT) unmappable = 1;
                a.kind[k] = kind == V_ABSENT ? V_NONE : kind;
                a.value[k] = value;
            }
            break;
        }
        case 11: if (f.wire != 2 || span_event(f.bytes)) return DEFER; break;
        case 13: if (f.wire != 2 || span_link(f.bytes)) return DEFER; break;
        case 15: if (f.wire != 2 || status_code(f.bytes, &code)) return DEFER; SEEN(15); break;
        case 16: if (f.wire != 5) return DEFER; SEEN(16); break;
        default: return DEFER;
        }
    }
    o->spans++;
    if (trace_id.n != 16 || span_id.n != 8) return DEFER; /* the reference names the span */
    if (name.n != m->span_name.n || memcmp(name.p, m->span_name.p, name.n) != 0) return 0;
    if (unmappable) return DEFER;

    /* The refusals of RequestRows.add_request are the reference's to word: defer them. */
    double latency[6]; int has_latency[6];
    for (int i = 0; i < 6; i++) {
        int kind = a.kind[K_LAT0 + i];
        has_latency[i] = kind == V_DOUBLE;
        if (kind == V_ABSENT || kind == V_NONE) { latency[i] = 0.0; continue; }
        if (kind != V_DOUBLE) return DEFER;
        memcpy(&latency[i], &a.value[K_LAT0 + i].value, 8);
        if (!isfinite(latency[i]) || latency[i] < 0.0) return DEFER;
    }
    if (!has_latency[0] || !has_latency[1] || latency[0] > latency[1]) return DEFER;
    int64_t prompt = 0, completion = 0, max_tokens = 0;
    int has_prompt = count_of(&a, K_PROMPT, K_PROMPT2, &prompt);
    int has_completion = count_of(&a, K_COMPLETION, K_COMPLETION2, &completion);
    int has_max = count_of(&a, K_MAX_TOKENS, -1, &max_tokens);
    if (has_prompt == DEFER || has_completion != PRESENT || has_max == DEFER) return DEFER;
    if (start == 0 || finish < start || finish >= (1ull << 63)) return DEFER;
    int request_kind = a.kind[K_REQUEST_ID], error_kind = a.kind[K_ERROR_TYPE];
    if (request_kind != V_ABSENT && request_kind != V_NONE && request_kind != V_STRING)
        return DEFER;
    if (error_kind != V_ABSENT && error_kind != V_NONE && error_kind != V_STRING) return DEFER;
    uint32_t combo;
    int found = combo_of(o, m, &a, resource_index, &combo);
    if (found) return found;

    size_t row = o->rows;
    int has_error = error_kind == V_STRING;
    if (buf_put(&o->combo_ids, &combo, 4) || put_hex(&o->trace_offsets, &o->trace_data, trace_id, row) ||
        put_hex(&o->span_offsets, &o->span_data, span_id, row) || put_text(o, 0, &a, K_REQUEST_ID) ||
        put_text(o, 1, &a, K_ERROR_TYPE) ||
        put_bit(&o->ok_bits, row, code != STATUS_ERROR && !has_error) ||
        put_count(o, 0, has_prompt == PRESENT, prompt) ||
        put_count(o, 1, has_completion == PRESENT, completion) ||
        put_count(o, 2, has_max == PRESENT, max_tokens) || put_u64(&o->start, start / 1000) ||
        put_u64(&o->end, finish / 1000))
        return FAIL;
    for (int i = 0; i < 6; i++) {
        if (put_bit(&o->latency_valid[i], row, has_latency[i]) ||
            buf_put(&o->latency_data[i], &latency[i], 8))
            return FAIL;
    }
    o->rows++;
    return 0;
}

static int scope_spans(Out *o, const Mapping *m, Slice s, uint32_t resource_index) {
    const uint8_t *p = s.p, *end = s.p + s.n; uint32_t seen = 0; Field f; int r;
    while (p < end) {
        if (next_field(&p, end, &f)) return DEFER;
        if (f.number == 1 && f.wire == 2) { SEEN(1); if (scope(f.bytes)) return DEFER; }
        else if (f.number == 2 && f.wire == 2) { if ((r = span(o, m, f.bytes, resource_index))) return r; }
        else if (f.number == 3 && STRING_FIELD(f)) SEEN(3);
        else return DEFER;
    }
    return 0;
}

static int request(Out *o, const Mapping *m, Slice body, PyObject *resources) {
    const uint8_t *p = body.p, *end = body.p + body.n; Field f; int r;
    while (p < end) {
        if (next_field(&p, end, &f) || f.number != 1 || f.wire != 2) return DEFER;
        uint32_t index = (uint32_t)PyList_GET_SIZE(resources), seen = 0;
        const uint8_t *q = f.bytes.p, *stop = f.bytes.p + f.bytes.n; Field g;
        PyObject *encoded = Py_None;
        Py_INCREF(encoded);
        while (q < stop) {
            if (next_field(&q, stop, &g)) { r = DEFER; goto done; }
            if (g.number == 1 && g.wire == 2) {
                if ((seen & 2) || resource(g.bytes)) { r = DEFER; goto done; }
                seen |= 2;
                Py_DECREF(encoded);
                encoded = PyBytes_FromStringAndSize((const char *)g.bytes.p, (Py_ssize_t)g.bytes.n);
                if (encoded == NULL) return FAIL;
            } else if (g.number == 2 && g.wire == 2) {
                if ((r = scope_spans(o, m, g.bytes, index))) goto done;
            } else if (g.number == 3 && STRING_FIELD(g) && !(seen & 8)) {
                seen |= 8;
            } else { r = DEFER; goto done; }
        }
        r = PyList_Append(resources, encoded) < 0 ? FAIL : 0;
    done:
        Py_DECREF(encoded);
        if (r) return r;
    }
    return 0;
}

static void out_free(Out *o) {
    Buf *bufs[] = {&o->combo_ids, &o->trace_offsets, &o->trace_data, &o->span_offsets,
                   &o->span_data, &o->text_valid[0], &o->text_offsets[0], &o->text_data[0],
                   &o->text_valid[1], &o->text_offsets[1], &o->text_data[1], &o->ok_bits,
                   &o->count_valid[0], &o->count_data[0], &o->count_valid[1], &o->count_data[1],
                   &o->count_valid[2], &o->count_data[2], &o->start, &o->end, &o->signature,
                   &o->last_signature};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) PyMem_Free(bufs[i]->data);
    for (int i = 0; i < 6; i++) { PyMem_Free(o->latency_valid[i].data); PyMem_Free(o->latency_data[i].data); }
    Py_XDECREF(o->combo_index); Py_XDECREF(o->combos);
}

static PyObject *as_bytes(Buf *b) {
    return PyBytes_FromStringAndSize(b->data ? (const char *)b->data : "", (Py_ssize_t)b->len);
}

static PyObject *decode(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer body;
    const char *span_name; Py_ssize_t span_name_len;
    PyObject *keys; int fixed;
    if (!PyArg_ParseTuple(args, "y*y#O!i", &body, &span_name, &span_name_len, &PyTuple_Type,
                          &keys, &fixed))
        return NULL;
    Mapping m;
    m.n_keys = (int)PyTuple_GET_SIZE(keys);
    m.span_name.p = (const uint8_t *)span_name; m.span_name.n = (size_t)span_name_len;
    if (fixed != N_FIXED || m.n_keys > MAX_KEYS || m.n_keys < N_FIXED) {
        PyBuffer_Release(&body);
        PyErr_Format(PyExc_ValueError, "keys: %d fixed and at most %d in all expected, got %d of %zd",
                     N_FIXED, MAX_KEYS, fixed, PyTuple_GET_SIZE(keys));
        return NULL;
    }
    for (int i = 0; i < m.n_keys; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        if (!PyBytes_Check(key)) {
            PyBuffer_Release(&body);
            PyErr_Format(PyExc_TypeError, "keys[%d] must be bytes, got %.80s", i, Py_TYPE(key)->tp_name);
            return NULL;
        }
        m.keys[i].p = (const uint8_t *)PyBytes_AS_STRING(key);
        m.keys[i].n = (size_t)PyBytes_GET_SIZE(key);
    }
    index_keys(&m);
    Out o;
    memset(&o, 0, sizeof o);
    PyObject *resources = PyList_New(0), *result = NULL;
    o.combo_index = PyDict_New(); o.combos = PyList_New(0);
    if (resources == NULL || o.combo_index == NULL || o.combos == NULL) goto end;
    Slice whole = {(const uint8_t *)body.buf, (size_t)body.len};
    int r = request(&o, &m, whole, resources);
    if (r == FAIL) goto end;
    if (r == DEFER) { result = Py_None; Py_INCREF(result); goto end; }
    if (o.rows == 0) {
        /* offsets start with a zero even for no rows */
        if (put_u64(&o.trace_offsets, 0) || put_u64(&o.span_offsets, 0) ||
            put_u64(&o.text_offsets[0], 0) || put_u64(&o.text_offsets[1], 0))
            goto end;
    }
    result = Py_BuildValue(
        "(nnOON(NN)(NN)(NNN)(NNN)N((NN)(NN)(NN))(NNNNNN)(NNNNNN)NN)",
        (Py_ssize_t)o.spans, (Py_ssize_t)o.rows, resources, o.combos, as_bytes(&o.combo_ids),
        as_bytes(&o.trace_offsets), as_bytes(&o.trace_data), as_bytes(&o.span_offsets),
        as_bytes(&o.span_data), as_bytes(&o.text_valid[0]), as_bytes(&o.text_offsets[0]),
        as_bytes(&o.text_data[0]), as_bytes(&o.text_valid[1]), as_bytes(&o.text_offsets[1]),
        as_bytes(&o.text_data[1]), as_bytes(&o.ok_bits), as_bytes(&o.count_valid[0]),
        as_bytes(&o.count_data[0]), as_bytes(&o.count_valid[1]), as_bytes(&o.count_data[1]),
        as_bytes(&o.count_valid[2]), as_bytes(&o.count_data[2]), as_bytes(&o.latency_valid[0]),
        as_bytes(&o.latency_valid[1]), as_bytes(&o.latency_valid[2]),
        as_bytes(&o.latency_valid[3]), as_bytes(&o.latency_valid[4]),
        as_bytes(&o.latency_valid[5]), as_bytes(&o.latency_data[0]),
        as_bytes(&o.latency_data[1]), as_bytes(&o.latency_data[2]), as_bytes(&o.latency_data[3]),
        as_bytes(&o.latency_data[4]), as_bytes(&o.latency_data[5]), as_bytes(&o.start),
        as_bytes(&o.end));
end:
    Py_XDECREF(resources);
    out_free(&o);
    PyBuffer_Release(&body);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS,
     "decode(body, span_name, keys, fixed): a plain body's request rows as column buffers, "
     "else None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_otlp_columns", NULL, -1, methods};

PyMODINIT_FUNC PyInit__otlp_columns(void) { return PyModule_Create(&module); }
