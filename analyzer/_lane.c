/* The native lane: the decoder's usual packets, decoded in C (see analyzer/native.py).
 *
 * It walks a block of capture records (pcapng Enhanced Packet Blocks, pcap records) and takes
 * the packets of "armed" connections that need nothing unusual: untagged Ethernet + IPv4 without
 * options + TCP, no SYN/FIN/RST, the next bytes in order (or a pure ACK), an ACK that acknowledges
 * nothing unseen, and AMQP frames that are ack/nack/reject, content methods, content headers and
 * bodies. For those it does what the Python path does (connection.py, reassembly.py, framing.py),
 * appending the same row tuples to the same RowSink lists and using the connection's own decode
 * memo. A connection inside TLS is taken once its handshake is done: the lane cuts its stream into
 * records and hands each to the connection's TLS layer in Python to open (`cryptography`), then
 * frames the plaintext the same way. Everything else goes back to Python at a clean boundary:
 *   - before a packet it does not take, untouched (native.py disarms that connection first);
 *   - or, inside a packet, at the first frame it does not take: the connection is disarmed with
 *     its state as of that frame boundary, and Python feeds the rest of the stream bytes (TLS: the
 *     rest of the record's plaintext, then the stream bytes after the record; or the stream
 *     bytes from a record it does not take, from its first byte).
 * It never decides anything the Python path would decide differently: when in doubt, it stops.
 * Every read is bounds-checked against the record and the frame; bad input only ever makes it
 * stop early. It holds the GIL throughout (rows are Python tuples).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define FRAME_METHOD 1
#define FRAME_HEADER 2
#define FRAME_BODY 3
#define FRAME_HEARTBEAT 8
#define FRAME_END 0xCE
#define EPB 6
#define MAX_RECORD (1u << 18)
#define INT64_MAX_U ((uint64_t)INT64_MAX)
#define MAX_PENDING 64             /* contents open at once per connection; more goes to Python */
#define MAX_PENDING_BODY (256u << 10)  /* body bytes held per open content; a longer body goes to Python */
#define MAX_MEMO_BODY 4096         /* the last body per direction kept to skip hashing it again */

#define TLS_HEADER 5
#define TLS_APPLICATION_DATA 23
#define TLS_MAX_RECORD ((1u << 14) + 2048)  /* tls/records.MAX_RECORD */

#define ID_ACK ((60u << 16) | 80u)
#define ID_NACK ((60u << 16) | 120u)
#define ID_REJECT ((60u << 16) | 90u)
#define ID_DELIVER ((60u << 16) | 60u)
#define ID_PUBLISH ((60u << 16) | 40u)
#define ID_GET_OK ((60u << 16) | 71u)
#define ID_RETURN ((60u << 16) | 50u)

static inline uint16_t be16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t be64(const uint8_t *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }
static inline uint32_t le32(const uint8_t *p) {
    return ((uint32_t)p[3] << 24) | ((uint32_t)p[2] << 16) | ((uint32_t)p[1] << 8) | p[0];
}

/* A growable byte buffer. */
typedef struct { uint8_t *data; size_t len, cap; } Buf;

static int buf_reserve(Buf *b, size_t need) {
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap *= 2;
    uint8_t *p = PyMem_Realloc(b->data, cap);
    if (!p) { PyErr_NoMemory(); return -1; }
    b->data = p;
    b->cap = cap;
    return 0;
}
static int buf_append(Buf *b, const uint8_t *p, size_t n) {
    if (buf_reserve(b, b->len + n) < 0) return -1;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}
static void buf_free(Buf *b) { PyMem_Free(b->data); b->data = NULL; b->len = b->cap = 0; }
/* The buffer's memory, handed to the caller; the buffer left empty. */
static Buf take_buf(Buf *b) {
    Buf taken = *b;
    b->data = NULL;
    b->len = b->cap = 0;
    return taken;
}
/* data[from:size] kept as the buffer's content: what a reader holds until more bytes come. `data`
 * may be the buffer's own bytes. */
static int keep_tail(Buf *b, const uint8_t *data, size_t size, size_t from) {
    if (data == b->data) {
        memmove(b->data, b->data + from, size - from);
        b->len = size - from;
        return 0;
    }
    b->len = 0;
    return buf_append(b, data + from, size - from);
}
#define PUT(buf, type, value) do { type v_ = (type)(value); if (buf_append(&(buf), (const uint8_t *)&v_, sizeof v_) < 0) return ERROR; } while (0)

/* Content (method, header, body frames) being assembled: connection.PendingContent, with the body
 * kept as bytes so that Python can take it over (hashing it) when the lane hands back. */
typedef struct {
    int direction, channel, method;  /* method: index in Engine.content_names */
    long long seq, ts_ns, packet;
    uint64_t tag;
    int has_tag;
    PyObject *shared;       /* the memo's tuple of rows.SHARED_METHOD_FIELDS */
    PyObject *properties;   /* NULL until the content header arrived */
    uint64_t body_size, received;
    Buf body;
} Pending;

/* Rows the lane made, column by column (rows.RowSink.take converts them): numbers in arrays, the
 * memo's shared tuples and the digests as Python objects. Null-able columns have a validity byte;
 * multiple/requeue are 0, 1 or 2 (null). */
typedef struct { Buf conn, seq, ts, dir, channel, method, packet, tag, multiple, requeue; Py_ssize_t n; } AckColumns;
/* An object column as its distinct objects (by identity) and an int32 index per row: the memo and
 * the digest cache hand out the same objects message after message, so there are few. */
typedef struct { PyObject *values, *positions, *last; int32_t last_index; Buf at; } ObjectColumn;
typedef struct {
    Buf conn, seq, ts, dir, channel, method, packet, tag, has_tag, body_size, has_size, complete;
    ObjectColumn shared, properties, hash, identity;
    Py_ssize_t n;
} ContentColumns;

static int put_object(ObjectColumn *c, PyObject *obj) {
    if (obj != c->last || !c->last) {
        PyObject *key = PyLong_FromVoidPtr(obj);
        if (!key) return -1;
        PyObject *known = PyDict_GetItemWithError(c->positions, key);
        Py_ssize_t index;
        if (known) {
            index = PyLong_AsSsize_t(known);
        } else if (PyErr_Occurred()) {
            Py_DECREF(key);
            return -1;
        } else {
            index = PyList_GET_SIZE(c->values);
            PyObject *at = PyLong_FromSsize_t(index);
            if (!at || PyList_Append(c->values, obj) < 0 || PyDict_SetItem(c->positions, key, at) < 0) {
                Py_XDECREF(at);
                Py_DECREF(key);
                return -1;
            }
            Py_DECREF(at);
        }
        Py_DECREF(key);
        c->last = obj;  /* kept alive by c->values */
        c->last_index = (int32_t)index;
    }
    return buf_append(&c->at, (const uint8_t *)&c->last_index, sizeof c->last_index);
}

/* One direction of an armed connection: reassembly and framing state, and what was counted. */
typedef struct {
    uint32_t next_seq;
    PyObject *unseen_acks;  /* TcpDirection.unseen_acks, as Python had it (in-order data resets it) */
    int reset_unseen;
    Buf carry;              /* FrameReader._chunks joined: the start of a frame not yet complete */
    Buf records;            /* TLS: RecordReader.buf, the start of a record not yet complete */
    long long nrecords;     /* TLS: records opened here, for TlsLayer.records */
    long long offset;       /* FrameReader.offset: stream offset of the carry's first byte */
    uint64_t max_frame;
    long long frames, bytes, headers, bodies;
    /* the last content method (its bytes but the tag) and content header (its bytes after the body
     * size) with what the memo gave for them: a stream repeats them, and comparing bytes is cheaper
     * than making the memo's key */
    Buf last_method, last_header;
    PyObject *last_fields, *last_values;
    /* the last complete body's digests, for streams that repeat their bodies */
    Buf last_body;
    PyObject *last_shared, *last_properties, *last_hash, *last_identity;
} Lane;

typedef struct {
    PyObject *conn;         /* NULL: the slot is free */
    long index;
    PyObject *facts, *memo, *memo_methods, *memo_properties, *keys[2];
    PyObject *open[2];      /* TLS: per direction, TlsLayer.lane_openers(); NULL: the wire bytes are AMQP */
    long long seq, ts_ns, packet;
    Lane lanes[2];
    Pending pending[MAX_PENDING];
    int npending;
} Slot;

typedef struct {
    PyObject_HEAD
    PyObject *counts, *flows;  /* flows: 12-byte flow key -> slot * 2 + direction, or -1: ignored */
    PyObject *ack_names[3];           /* basic.ack, basic.nack, basic.reject */
    PyObject *header_name, *body_name, *facts_frames[2], *facts_bytes[2];
    PyObject *digests;                /* connection.body_digests(body, shared, properties) */
    PyObject *incomplete_identity;    /* connection.incomplete_identity(properties) */
    PyObject *no_properties;
    PyObject *content_names[4];       /* basic.publish, basic.deliver, basic.get-ok, basic.return */
    AckColumns ack_rows;
    ContentColumns content_rows;
    Slot *slots;
    int nslots;
} Engine;

/* -- state in and out ---------------------------------------------------------------------------- */

static void lane_clear(Lane *l) {
    Py_CLEAR(l->unseen_acks);
    buf_free(&l->records);
    buf_free(&l->last_method);
    buf_free(&l->last_header);
    Py_CLEAR(l->last_fields);
    Py_CLEAR(l->last_values);
    buf_free(&l->carry);
    buf_free(&l->last_body);
    Py_CLEAR(l->last_shared);
    Py_CLEAR(l->last_properties);
    Py_CLEAR(l->last_hash);
    Py_CLEAR(l->last_identity);
}

static void pending_clear(Pending *p) {
    Py_CLEAR(p->shared);
    Py_CLEAR(p->properties);
    buf_free(&p->body);
}

static void slot_clear(Slot *s) {
    Py_CLEAR(s->conn);
    Py_CLEAR(s->facts);
    Py_CLEAR(s->memo);
    Py_CLEAR(s->memo_methods);
    Py_CLEAR(s->memo_properties);
    Py_CLEAR(s->keys[0]);
    Py_CLEAR(s->keys[1]);
    Py_CLEAR(s->open[0]);
    Py_CLEAR(s->open[1]);
    for (int d = 0; d < 2; d++) lane_clear(&s->lanes[d]);
    for (int i = 0; i < s->npending; i++) pending_clear(&s->pending[i]);
    s->npending = 0;
}

static int dict_add(PyObject *dict, PyObject *key, long long delta) {
    if (!delta) return 0;
    PyObject *old = PyDict_GetItemWithError(dict, key);
    if (!old && PyErr_Occurred()) return -1;
    PyObject *d = PyLong_FromLongLong(delta);
    if (!d) return -1;
    PyObject *sum = old ? PyNumber_Add(old, d) : (Py_INCREF(d), d);
    Py_DECREF(d);
    if (!sum) return -1;
    int rc = PyDict_SetItem(dict, key, sum);
    Py_DECREF(sum);
    return rc;
}

/* Engine.arm(conn, index, seq, key_to_broker, key_to_client, lane0, lane1, facts, memo[, tls])
 * laneN = (next_seq, unseen_acks, carry, offset, max_frame). The connection must have no content
 * open (native.py checks what may be armed). tls, for a connection whose AMQP is inside TLS:
 * (open0, open1, records0, records1), openN(version, fragment) -> the plaintext of direction N's
 * next application-data record, or None for a record the lane leaves to Python (which reads it
 * again from its start); recordsN: RecordReader.buf. */
static PyObject *engine_arm(Engine *e, PyObject *args) {
    PyObject *conn, *keys[2], *lanes[2], *facts, *memo, *tls = Py_None;
    PyObject *opens[2] = {NULL, NULL}, *records[2] = {NULL, NULL};
    long index;
    long long seq;
    if (!PyArg_ParseTuple(args, "OlLSSO!O!O!O|O", &conn, &index, &seq, &keys[0], &keys[1], &PyTuple_Type, &lanes[0],
                          &PyTuple_Type, &lanes[1], &PyDict_Type, &facts, &memo, &tls))
        return NULL;
    if (PyBytes_GET_SIZE(keys[0]) != 12 || PyBytes_GET_SIZE(keys[1]) != 12) {
        PyErr_SetString(PyExc_ValueError, "flow keys are 12 bytes (IPv4)");
        return NULL;
    }
    if (tls != Py_None) {
        if (!PyArg_ParseTuple(tls, "OOSS", &opens[0], &opens[1], &records[0], &records[1])) return NULL;
        if (!PyCallable_Check(opens[0]) || !PyCallable_Check(opens[1])) {
            PyErr_SetString(PyExc_TypeError, "TLS openers are callables");
            return NULL;
        }
    }
    int k = 0;
    while (k < e->nslots && e->slots[k].conn) k++;
    if (k == e->nslots) {
        int n = e->nslots ? e->nslots * 2 : 8;
        Slot *grown = PyMem_Realloc(e->slots, sizeof(Slot) * n);
        if (!grown) return PyErr_NoMemory();
        memset(grown + e->nslots, 0, sizeof(Slot) * (n - e->nslots));
        e->slots = grown;
        e->nslots = n;
    }
    Slot *s = &e->slots[k];
    PyObject *methods = PyObject_GetAttrString(memo, "methods");
    PyObject *properties = methods ? PyObject_GetAttrString(memo, "properties") : NULL;
    if (!properties || !PyDict_Check(methods) || !PyDict_Check(properties)) {
        Py_XDECREF(methods);
        Py_XDECREF(properties);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "memo dicts expected");
        return NULL;
    }
    for (int d = 0; d < 2; d++) {
        unsigned long long next_seq, max_frame;
        PyObject *unseen, *carry;
        long long offset;
        if (!PyArg_ParseTuple(lanes[d], "KOSLK", &next_seq, &unseen, &carry, &offset, &max_frame)) {
            Py_DECREF(methods);
            Py_DECREF(properties);
            slot_clear(s);
            return NULL;
        }
        Lane *l = &s->lanes[d];
        memset(l, 0, sizeof(Lane));
        l->next_seq = (uint32_t)next_seq;
        Py_INCREF(unseen);
        l->unseen_acks = unseen;
        l->offset = offset;
        l->max_frame = max_frame;
        if (buf_append(&l->carry, (const uint8_t *)PyBytes_AS_STRING(carry), PyBytes_GET_SIZE(carry)) < 0
            || (records[d] && buf_append(&l->records, (const uint8_t *)PyBytes_AS_STRING(records[d]),
                                         PyBytes_GET_SIZE(records[d])) < 0)) {
            Py_DECREF(methods);
            Py_DECREF(properties);
            slot_clear(s);
            return NULL;
        }
    }
    s->memo_methods = methods;
    s->memo_properties = properties;
    for (int d = 0; d < 2; d++) {
        Py_XINCREF(opens[d]);
        s->open[d] = opens[d];
    }
    Py_INCREF(conn); s->conn = conn;
    s->index = index;
    Py_INCREF(facts); s->facts = facts;
    Py_INCREF(memo); s->memo = memo;
    Py_INCREF(keys[0]); s->keys[0] = keys[0];
    Py_INCREF(keys[1]); s->keys[1] = keys[1];
    s->seq = seq;
    s->ts_ns = s->packet = -1;
    s->npending = 0;
    for (int d = 0; d < 2; d++) {
        PyObject *code = PyLong_FromLong(k * 2 + d);
        if (!code || PyDict_SetItem(e->flows, keys[d], code) < 0) {
            Py_XDECREF(code);
            return NULL;
        }
        Py_DECREF(code);
    }
    Py_RETURN_NONE;
}

/* The slot's state for Python, its counters added to the facts and counts dicts, and the slot
 * freed: (conn, seq, ts_ns, packet, lane0, lane1, pending, resume), laneN = (next_seq,
 * unseen_acks, carry, offset, records, nrecords) (TLS: the start of a record, and the records
 * opened); pending: (direction, channel, row, body_size, received, properties or None, body) in
 * the order they were opened; resume: None, or (direction, rest, wire): rest, the bytes from the
 * frame boundary where the lane stopped (of the stream, or TLS: of the record's plaintext), and
 * wire, None, or TLS: the stream bytes after that record (from the record the lane stopped
 * before, if it stopped there, with rest empty). */
static PyObject *disarm(Engine *e, int k, int resume_direction, const uint8_t *rest, Py_ssize_t rest_len,
                        const uint8_t *wire, Py_ssize_t wire_len) {
    Slot *s = &e->slots[k];
    PyObject *out = NULL, *lanes[2] = {NULL, NULL}, *pending = NULL, *resume = NULL;
    for (int d = 0; d < 2; d++) {
        Lane *l = &s->lanes[d];
        if (dict_add(s->facts, e->facts_frames[d], l->frames) < 0 || dict_add(s->facts, e->facts_bytes[d], l->bytes) < 0
            || dict_add(e->counts, e->header_name, l->headers) < 0 || dict_add(e->counts, e->body_name, l->bodies) < 0)
            goto done;
        l->frames = l->bytes = l->headers = l->bodies = 0;
        PyObject *unseen = l->reset_unseen ? PyLong_FromLong(0) : (Py_INCREF(l->unseen_acks), l->unseen_acks);
        if (!unseen) goto done;
        lanes[d] = Py_BuildValue("(kNy#Ly#L)", (unsigned long)l->next_seq, unseen,
                                 l->carry.data ? (const char *)l->carry.data : "", (Py_ssize_t)l->carry.len, l->offset,
                                 l->records.data ? (const char *)l->records.data : "", (Py_ssize_t)l->records.len,
                                 l->nrecords);
        if (!lanes[d]) goto done;
    }
    pending = PyList_New(s->npending);
    if (!pending) goto done;
    for (int i = 0; i < s->npending; i++) {
        Pending *p = &s->pending[i];
        PyObject *tag = p->has_tag ? PyLong_FromUnsignedLongLong(p->tag) : (Py_INCREF(Py_None), Py_None);
        PyObject *row = tag ? Py_BuildValue("(lLLiiOLNO)", s->index, p->seq, p->ts_ns, p->direction, p->channel,
                                            e->content_names[p->method], p->packet, tag, p->shared) : NULL;
        if (!row) goto done;
        PyObject *item = Py_BuildValue("(iiNKKOy#)", p->direction, p->channel, row,
                                       (unsigned long long)p->body_size, (unsigned long long)p->received,
                                       p->properties ? p->properties : Py_None,
                                       p->body.data ? (const char *)p->body.data : "", (Py_ssize_t)p->body.len);
        if (!item) goto done;
        PyList_SET_ITEM(pending, i, item);
    }
    if (resume_direction >= 0) {
        resume = wire ? Py_BuildValue("(iy#y#)", resume_direction, rest ? (const char *)rest : "", rest_len,
                                      (const char *)wire, wire_len)
                      : Py_BuildValue("(iy#O)", resume_direction, rest ? (const char *)rest : "", rest_len, Py_None);
        if (!resume) goto done;
    } else {
        Py_INCREF(Py_None);
        resume = Py_None;
    }
    for (int d = 0; d < 2; d++)
        if (PyDict_DelItem(e->flows, s->keys[d]) < 0) PyErr_Clear();
    out = Py_BuildValue("(OLLLOOOO)", s->conn, s->seq, s->ts_ns, s->packet, lanes[0], lanes[1], pending, resume);
    if (out) slot_clear(s);
done:
    Py_XDECREF(lanes[0]);
    Py_XDECREF(lanes[1]);
    Py_XDECREF(pending);
    Py_XDECREF(resume);
    return out;
}

/* Engine.release(key) -> the state of the armed connection owning the flow key (see disarm), or None. */
static PyObject *engine_release(Engine *e, PyObject *key) {
    PyObject *code = PyDict_GetItemWithError(e->flows, key);
    if (!code) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    long c = PyLong_AsLong(code);
    if (c < 0) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;  /* an ignored flow: nothing to hand over */
    }
    return disarm(e, (int)(c / 2), -1, NULL, 0, NULL, 0);
}

/* Engine.release_all() -> [state, ...] of every armed connection (the end of the capture). */
static PyObject *engine_release_all(Engine *e, PyObject *unused) {
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (int k = 0; k < e->nslots; k++) {
        if (!e->slots[k].conn) continue;
        PyObject *state = disarm(e, k, -1, NULL, 0, NULL, 0);
        if (!state || PyList_Append(out, state) < 0) {
            Py_XDECREF(state);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(state);
    }
    return out;
}

/* Engine.ignore(key) / Engine.forget(key): packets of an ignored flow are passed over (FlowTable.ignored). */
static PyObject *engine_ignore(Engine *e, PyObject *key) {
    PyObject *minus = PyLong_FromLong(-1);
    if (!minus) return NULL;
    PyObject *code = PyDict_GetItemWithError(e->flows, key);
    if (code || PyErr_Occurred()) {  /* an armed flow stays armed */
        Py_DECREF(minus);
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    int rc = PyDict_SetItem(e->flows, key, minus);
    Py_DECREF(minus);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *engine_forget(Engine *e, PyObject *key) {
    PyObject *code = PyDict_GetItemWithError(e->flows, key);
    if (code && PyLong_AsLong(code) == -1 && PyDict_DelItem(e->flows, key) < 0) return NULL;
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* -- rows ------------------------------------------------------------------------------------------ */

enum { TAKEN = 0, STOP = 1, ERROR = -1 };

static Pending *find_pending(Slot *s, int direction, int channel) {
    for (int i = 0; i < s->npending; i++)
        if (s->pending[i].direction == direction && s->pending[i].channel == channel) return &s->pending[i];
    return NULL;
}

static void drop_pending(Slot *s, Pending *p) {
    pending_clear(p);
    int i = (int)(p - s->pending);
    memmove(&s->pending[i], &s->pending[i + 1], sizeof(Pending) * (s->npending - i - 1));
    s->npending--;
    memset(&s->pending[s->npending], 0, sizeof(Pending));
}

/* connection._emit_content: the pending content's row, complete or cut short. */
static int emit_content(Engine *e, Slot *s, Pending *p, int complete) {
    Lane *l = &s->lanes[p->direction];
    PyObject *properties = p->properties ? p->properties : e->no_properties;
    PyObject *hash = NULL, *identity = NULL;
    PyObject *shared = p->shared;
    if (complete) {
        if (l->last_hash && l->last_shared == shared && l->last_properties == properties
            && l->last_body.len == p->body.len
            && (!p->body.len || !memcmp(l->last_body.data, p->body.data, p->body.len))) {
            hash = l->last_hash;
            identity = l->last_identity;
            Py_INCREF(hash);
            Py_INCREF(identity);
        } else {
            PyObject *body = PyBytes_FromStringAndSize(p->body.data ? (const char *)p->body.data : "", (Py_ssize_t)p->body.len);
            if (!body) return ERROR;
            PyObject *pair = PyObject_CallFunctionObjArgs(e->digests, body, shared, properties, NULL);
            Py_DECREF(body);
            if (!pair) return ERROR;
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
                Py_DECREF(pair);
                PyErr_SetString(PyExc_TypeError, "body_digests returns (hash, identity)");
                return ERROR;
            }
            hash = PyTuple_GET_ITEM(pair, 0);
            identity = PyTuple_GET_ITEM(pair, 1);
            Py_INCREF(hash);
            Py_INCREF(identity);
            Py_DECREF(pair);
            if (p->body.len <= MAX_MEMO_BODY) {
                l->last_body.len = 0;
                if (buf_append(&l->last_body, p->body.data, p->body.len) < 0) goto fail;
                Py_INCREF(shared); Py_XSETREF(l->last_shared, shared);
                Py_INCREF(properties); Py_XSETREF(l->last_properties, properties);
                Py_INCREF(hash); Py_XSETREF(l->last_hash, hash);
                Py_INCREF(identity); Py_XSETREF(l->last_identity, identity);
            }
        }
    } else {
        hash = Py_None;
        Py_INCREF(hash);
        identity = PyObject_CallFunctionObjArgs(e->incomplete_identity, properties, NULL);
        if (!identity) goto fail;
    }
    ContentColumns *c = &e->content_rows;
    if (put_object(&c->shared, shared) < 0 || put_object(&c->properties, properties) < 0
        || put_object(&c->hash, hash) < 0 || put_object(&c->identity, identity) < 0)
        goto fail;
    Py_DECREF(hash);
    Py_DECREF(identity);
    PUT(c->conn, int32_t, s->index);
    PUT(c->seq, int64_t, p->seq);
    PUT(c->ts, int64_t, p->ts_ns);
    PUT(c->dir, int8_t, p->direction);
    PUT(c->channel, int32_t, p->channel);
    PUT(c->method, int8_t, p->method);
    PUT(c->packet, int64_t, p->packet);
    PUT(c->tag, int64_t, p->has_tag ? p->tag : 0);
    PUT(c->has_tag, int8_t, p->has_tag);
    PUT(c->body_size, int64_t, p->properties ? p->body_size : 0);
    PUT(c->has_size, int8_t, p->properties != NULL);
    PUT(c->complete, int8_t, complete);
    c->n++;
    drop_pending(s, p);
    return TAKEN;
fail:
    Py_XDECREF(hash);
    Py_XDECREF(identity);
    return ERROR;
}

/* -- frames ---------------------------------------------------------------------------------------- */

static int count_method(Engine *e, PyObject *name) { return dict_add(e->counts, name, 1); }

/* A method frame: ack/nack/reject becomes its row; a content method opens content (what
 * connection._method does on its fast branch). Anything else stops the lane. */
static int method_frame(Engine *e, Slot *s, int direction, int channel, const uint8_t *p, size_t n) {
    if (n < 4) return STOP;
    uint32_t mid = be32(p);
    if (mid == ID_ACK || mid == ID_NACK || mid == ID_REJECT) {
        if (n < 13) return STOP;
        uint64_t tag = be64(p + 4);
        int bits = p[12];
        if (tag > INT64_MAX_U) return STOP;  /* malformed: the general path names the problem */
        Pending *open = find_pending(s, direction, channel);
        if (open && emit_content(e, s, open, 0) == ERROR) return ERROR;
        int which = mid == ID_ACK ? 0 : mid == ID_NACK ? 1 : 2;
        if (count_method(e, e->ack_names[which]) < 0) return ERROR;
        s->seq++;
        AckColumns *c = &e->ack_rows;
        PUT(c->conn, int32_t, s->index);
        PUT(c->seq, int64_t, s->seq);
        PUT(c->ts, int64_t, s->ts_ns);
        PUT(c->dir, int8_t, direction);
        PUT(c->channel, int32_t, channel);
        PUT(c->method, int8_t, which);
        PUT(c->packet, int64_t, s->packet);
        PUT(c->tag, int64_t, tag);
        PUT(c->multiple, int8_t, which == 2 ? 2 : (bits & 1));
        PUT(c->requeue, int8_t, which == 0 ? 2 : (bits & (which == 1 ? 2 : 1)) != 0);
        c->n++;
        return TAKEN;
    }
    if (mid != ID_DELIVER && mid != ID_PUBLISH && mid != ID_GET_OK && mid != ID_RETURN) return STOP;
    /* methods.DecodeMemo.content_method, looked up here; a miss is decoded by the memo itself. */
    size_t tag_at = 0;
    if (mid == ID_DELIVER) {
        if (n < 5) return STOP;
        tag_at = 5 + (size_t)p[4];
    } else if (mid == ID_GET_OK) {
        tag_at = 4;
    }
    PyObject *fields = NULL;
    uint64_t tag = 0;
    int has_tag = 0;
    Lane *l = &s->lanes[direction];
    Buf *last = &l->last_method;
    if (l->last_fields && (tag_at ? tag_at + 8 <= n && last->len == n - 8 && !memcmp(p, last->data, tag_at)
                                        && !memcmp(p + tag_at + 8, last->data + tag_at, n - tag_at - 8)
                                  : last->len == n && !memcmp(p, last->data, n))) {
        fields = l->last_fields;
        Py_INCREF(fields);
        if (tag_at) {
            tag = be64(p + tag_at);
            has_tag = 1;
        } else if (PyTuple_GET_ITEM(fields, 1) != Py_None) {
            Py_DECREF(fields);
            return STOP;
        }
        goto decoded;
    }
    PyObject *key;
    if (tag_at) {
        size_t tail = tag_at + 8 < n ? tag_at + 8 : n;
        size_t head = tag_at < n ? tag_at : n;
        key = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(head + (n - tail)));
        if (!key) return ERROR;
        memcpy(PyBytes_AS_STRING(key), p, head);
        memcpy(PyBytes_AS_STRING(key) + head, p + tail, n - tail);
    } else {
        key = PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)n);
        if (!key) return ERROR;
    }
    PyObject *known = PyDict_GetItemWithError(s->memo_methods, key);
    Py_DECREF(key);
    if (!known && PyErr_Occurred()) return ERROR;
    if (known && PyTuple_Check(known) && PyTuple_GET_SIZE(known) == 3) {
        fields = known;
        Py_INCREF(fields);
        if (tag_at) {
            if (tag_at + 8 > n) { Py_DECREF(fields); return STOP; }
            tag = be64(p + tag_at);
            has_tag = 1;
        }
    } else {
        PyObject *payload = PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)n);
        if (!payload) return ERROR;
        fields = PyObject_CallMethod(s->memo, "content_method", "kO", (unsigned long)mid, payload);
        Py_DECREF(payload);
        if (!fields) {  /* malformed: the general path names the problem */
            PyErr_Clear();
            return STOP;
        }
        if (!PyTuple_Check(fields) || PyTuple_GET_SIZE(fields) != 3) {
            Py_DECREF(fields);
            return STOP;
        }
        PyObject *t = PyTuple_GET_ITEM(fields, 1);
        if (t != Py_None) {
            tag = PyLong_AsUnsignedLongLong(t);
            if (tag == (uint64_t)-1 && PyErr_Occurred()) {
                PyErr_Clear();
                Py_DECREF(fields);
                return STOP;
            }
            has_tag = 1;
        }
    }
    if (!tag_at || tag_at + 8 <= n) {  /* remembered for the next message */
        last->len = 0;
        if (buf_append(last, p, tag_at ? tag_at : n) < 0
            || (tag_at && buf_append(last, p + tag_at + 8, n - tag_at - 8) < 0)) {
            Py_DECREF(fields);
            return ERROR;
        }
        Py_INCREF(fields);
        Py_XSETREF(l->last_fields, fields);
    }
decoded:;
    PyObject *name = PyTuple_GET_ITEM(fields, 0), *shared = PyTuple_GET_ITEM(fields, 2);
    int method = -1;
    for (int i = 0; i < 4 && method < 0; i++)
        if (name == e->content_names[i]) method = i;
    for (int i = 0; i < 4 && method < 0; i++)
        if (PyUnicode_Check(name) && PyUnicode_Compare(name, e->content_names[i]) == 0) method = i;
    if (PyErr_Occurred()) PyErr_Clear();
    if (method < 0 || tag > INT64_MAX_U || (s->npending >= MAX_PENDING && !find_pending(s, direction, channel))) {
        Py_DECREF(fields);
        return STOP;
    }
    Pending *open = find_pending(s, direction, channel);
    if ((open && emit_content(e, s, open, 0) == ERROR) || count_method(e, name) < 0) {
        Py_DECREF(fields);
        return ERROR;
    }
    s->seq++;
    Pending *q = &s->pending[s->npending++];
    memset(q, 0, sizeof(Pending));
    q->direction = direction;
    q->channel = channel;
    q->method = method;
    q->seq = s->seq;
    q->ts_ns = s->ts_ns;
    q->packet = s->packet;
    q->tag = tag;
    q->has_tag = has_tag;
    Py_INCREF(shared);
    q->shared = shared;
    Py_DECREF(fields);
    return TAKEN;
}

/* connection._content_header: the properties of the content open on the channel, if any. */
static int header_frame(Engine *e, Slot *s, int direction, int channel, const uint8_t *p, size_t n) {
    Pending *q = find_pending(s, direction, channel);
    if (!q || q->properties) return TAKEN;  /* content whose method the capture missed: counted only */
    if (n < 14) return STOP;
    uint64_t body_size = be64(p + 4);
    Lane *l = &s->lanes[direction];
    if (l->last_values && l->last_header.len == n - 12 && !memcmp(p + 12, l->last_header.data, n - 12)) {
        if (be16(p) != 60 || be16(p + 2) != 0 || body_size > INT64_MAX_U) return STOP;
        Py_INCREF(l->last_values);
        q->properties = l->last_values;
        q->body_size = body_size;
        return body_size ? TAKEN : emit_content(e, s, q, 1);
    }
    PyObject *key = PyBytes_FromStringAndSize((const char *)p + 12, (Py_ssize_t)(n - 12));
    if (!key) return ERROR;
    PyObject *values = PyDict_GetItemWithError(s->memo_properties, key);
    Py_DECREF(key);
    if (!values && PyErr_Occurred()) return ERROR;
    if (values) {
        if (be16(p) != 60 || be16(p + 2) != 0 || body_size > INT64_MAX_U) return STOP;
        Py_INCREF(values);
    } else {
        PyObject *payload = PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)n);
        if (!payload) return ERROR;
        PyObject *pair = PyObject_CallMethod(s->memo, "content_header", "O", payload);
        Py_DECREF(payload);
        if (!pair) {
            PyErr_Clear();
            return STOP;
        }
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            Py_DECREF(pair);
            return STOP;
        }
        values = PyTuple_GET_ITEM(pair, 1);
        unsigned long long decoded = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(pair, 0));
        if (decoded == (unsigned long long)-1 && PyErr_Occurred()) {
            Py_DECREF(pair);
            return ERROR;
        }
        body_size = decoded;
        Py_INCREF(values);
        Py_DECREF(pair);
    }
    l->last_header.len = 0;
    if (buf_append(&l->last_header, p + 12, n - 12) < 0) {
        Py_DECREF(values);
        return ERROR;
    }
    Py_INCREF(values);
    Py_XSETREF(l->last_values, values);
    q->properties = values;
    q->body_size = body_size;
    return body_size ? TAKEN : emit_content(e, s, q, 1);
}

/* A body frame: hashed with its content by connection._stream; here kept until the content ends. */
static int body_frame(Engine *e, Slot *s, int direction, int channel, const uint8_t *p, size_t n) {
    Pending *q = find_pending(s, direction, channel);
    if (!q || !q->properties) return TAKEN;
    if (q->body.len + n > MAX_PENDING_BODY) return STOP;
    if (buf_append(&q->body, p, n) < 0) return ERROR;
    q->received += n;
    if (q->received >= q->body_size) return emit_content(e, s, q, q->received == q->body_size);
    return TAKEN;
}

/* FrameReader._frames on the lane's carry + this payload, frame by frame. Returns TAKEN, or STOP
 * with *stopped at the first frame left to Python, or ERROR. */
static int frames(Engine *e, Slot *s, int direction, const uint8_t *data, size_t n, size_t *stopped) {
    Lane *l = &s->lanes[direction];
    size_t pos = 0;
    while (n - pos >= 8) {
        int ftype = data[pos];
        int channel = be16(data + pos + 1);
        uint64_t size = be32(data + pos + 3);
        if (size > l->max_frame || !(ftype == FRAME_METHOD || ftype == FRAME_HEADER || ftype == FRAME_BODY
                                     || ftype == FRAME_HEARTBEAT))
            goto stop;  /* the reader loses sync: Python reports it and hunts */
        uint64_t end = pos + 7 + size;
        if (end >= n) break;
        if (data[end] != FRAME_END || ftype == FRAME_HEARTBEAT) goto stop;
        const uint8_t *payload = data + pos + 7;
        int rc;
        if (ftype == FRAME_METHOD) rc = method_frame(e, s, direction, channel, payload, size);
        else if (ftype == FRAME_HEADER) rc = header_frame(e, s, direction, channel, payload, size);
        else rc = body_frame(e, s, direction, channel, payload, size);
        if (rc == ERROR) return ERROR;
        if (rc == STOP) goto stop;
        l->frames++;
        if (ftype == FRAME_HEADER) l->headers++;
        else if (ftype == FRAME_BODY) l->bodies++;
        pos = (size_t)end + 1;
    }
    l->offset += (long long)pos;
    *stopped = pos;
    return TAKEN;
stop:
    l->offset += (long long)pos;
    *stopped = pos;
    return STOP;
}

/* -- packets --------------------------------------------------------------------------------------- */

/* Stream bytes through the direction's framer, after what it carries: the wire's bytes, or the
 * plaintext of a TLS record. TAKEN or ERROR; or STOP at the first frame left to Python: the
 * bytes from that frame boundary on are *rest (*rest_len of them), which point into the given
 * bytes or into *held, the lane's carry taken out of it (emptied), for the caller to free once
 * Python has them. */
static int stream(Engine *e, Slot *s, int direction, const uint8_t *payload, size_t len,
                  const uint8_t **rest, size_t *rest_len, Buf *held) {
    Lane *l = &s->lanes[direction];
    const uint8_t *data = payload;
    size_t size = len;
    if (l->carry.len) {
        if (buf_append(&l->carry, payload, len) < 0) return ERROR;
        data = l->carry.data;
        size = l->carry.len;
        /* a frame still incomplete waits for more, as FrameReader does with _need */
    }
    size_t stopped = 0;
    int rc = frames(e, s, direction, data, size, &stopped);
    if (rc == ERROR) return ERROR;
    if (rc == STOP) {
        *held = take_buf(&l->carry);
        *rest = data + stopped;
        *rest_len = size - stopped;
        return STOP;
    }
    return keep_tail(&l->carry, data, size, stopped) < 0 ? ERROR : TAKEN;
}

/* A TLS connection's stream bytes (connection._through_tls): cut into records as
 * tls/records.RecordReader does, each application-data record opened by the connection's TLS
 * layer in Python (`cryptography`), its plaintext framed as a plain connection's wire bytes are.
 * Python takes the connection over at the first record the lane does not take, from its first
 * byte: another content type or record version, one that does not open, or whose content is not
 * application data (a KeyUpdate, a session ticket); the layer's opener leaves its sequence
 * number as it was. Or at a frame boundary inside a record's plaintext, the rest of the
 * plaintext and the stream bytes after the record handed over apart. */
static int tls_records(Engine *e, Slot *s, int k, int direction, const uint8_t *payload, size_t len,
                       PyObject **handback) {
    Lane *l = &s->lanes[direction];
    const uint8_t *data = payload;
    size_t size = len, pos = 0;
    if (l->records.len) {
        if (buf_append(&l->records, payload, len) < 0) return ERROR;
        data = l->records.data;
        size = l->records.len;
    }
    const uint8_t *rest = NULL;
    size_t rest_len = 0;
    Buf held = {0};
    PyObject *plain = NULL;
    int rc = TAKEN;
    while (size - pos >= TLS_HEADER) {
        const uint8_t *h = data + pos;
        size_t length = be16(h + 3);
        if (h[0] != TLS_APPLICATION_DATA || be16(h + 1) != 0x0303 || length > TLS_MAX_RECORD) {
            rc = STOP;
            break;
        }
        if (length > size - pos - TLS_HEADER) break;  /* the record goes on in the next segments */
        PyObject *fragment = PyBytes_FromStringAndSize((const char *)h + TLS_HEADER, (Py_ssize_t)length);
        if (!fragment) return ERROR;
        plain = PyObject_CallOneArg(s->open[direction], fragment);
        Py_DECREF(fragment);
        if (!plain || !PyBytes_Check(plain)) {  /* None: not a record for the lane; an error: Python's to meet */
            if (!plain) PyErr_Clear();
            Py_CLEAR(plain);
            rc = STOP;
            break;
        }
        pos += TLS_HEADER + length;
        l->nrecords++;
        rc = PyBytes_GET_SIZE(plain) ? stream(e, s, direction, (const uint8_t *)PyBytes_AS_STRING(plain),
                                              (size_t)PyBytes_GET_SIZE(plain), &rest, &rest_len, &held)
                                     : TAKEN;
        if (rc == ERROR) {
            Py_DECREF(plain);
            return ERROR;
        }
        if (rc == STOP) break;  /* rest may point into plain: kept until Python has it */
        Py_CLEAR(plain);
    }
    if (rc == STOP) {
        Buf records = take_buf(&l->records);  /* what Python reads next is all in wire below */
        *handback = disarm(e, k, direction, rest, (Py_ssize_t)rest_len, data + pos, (Py_ssize_t)(size - pos));
        Py_XDECREF(plain);
        buf_free(&held);
        buf_free(&records);
        return *handback ? STOP : ERROR;
    }
    return keep_tail(&l->records, data, size, pos) < 0 ? ERROR : TAKEN;
}

static inline int32_t seq_diff(uint32_t a, uint32_t b) { return (int32_t)(a - b); }

/* One captured packet. TAKEN: decoded. STOP: not taken, nothing changed (Python decodes it).
 * Or it was taken in part: *handback is the disarmed connection's state, with what to resume. */
static int packet(Engine *e, int linktype, const uint8_t *d, size_t n, long long ts_ns, long long number,
                  PyObject **handback) {
    /* packets.tcp_segment's fast path, and only it: anything else is Python's. */
    if (linktype != 1 || n < 54 || be16(d + 12) != 0x0800 || d[14] != 0x45 || d[23] != 6 || (be16(d + 20) & 0x3FFF))
        return STOP;
    PyObject *key = PyBytes_FromStringAndSize(NULL, 12);
    if (!key) return ERROR;
    char *kp = PyBytes_AS_STRING(key);
    memcpy(kp, d + 26, 8);       /* src, dst */
    memcpy(kp + 8, d + 34, 4);   /* sport, dport: FlowTable's (src, sport, dst, dport), in this layout */
    PyObject *code = PyDict_GetItemWithError(e->flows, key);
    Py_DECREF(key);
    if (!code) return PyErr_Occurred() ? ERROR : STOP;
    long c = PyLong_AsLong(code);
    if (c == -1) return PyErr_Occurred() ? ERROR : TAKEN;  /* FlowTable ignores this flow */
    Slot *s = &e->slots[c / 2];
    int direction = (int)(c % 2);
    Lane *l = &s->lanes[direction], *other = &s->lanes[1 - direction];
    size_t total = be16(d + 16);
    size_t ip_end = 14 + (total ? total : n - 14);
    size_t payload_off = 34 + (size_t)(d[46] >> 4) * 4;
    size_t end = ip_end < n ? ip_end : n;
    size_t cut = n > payload_off ? n : payload_off;
    if (ip_end > cut) return STOP;  /* cut by the snap length */
    int flags = d[47];
    if (flags & 0x07) return STOP;  /* SYN, FIN, RST */
    uint32_t seq = be32(d + 38), ack = be32(d + 42);
    size_t len = payload_off < end ? end - payload_off : 0;
    if (len && seq != l->next_seq) return STOP;  /* out of order, a retransmission, a hole */
    if ((flags & 0x10) && ack != other->next_seq && seq_diff(ack, other->next_seq) > 0)
        return STOP;  /* acknowledges bytes not seen yet: TcpDirection.acked keeps count */
    s->ts_ns = ts_ns;
    s->packet = number;
    if (!len) return TAKEN;
    const uint8_t *payload = d + payload_off;
    l->reset_unseen = 1;
    l->next_seq = seq + (uint32_t)len;
    l->bytes += (long long)len;
    int k = (int)(c / 2);
    if (s->open[direction]) return tls_records(e, s, k, direction, payload, len, handback);
    const uint8_t *rest = NULL;
    size_t rest_len = 0;
    Buf held = {0};
    int rc = stream(e, s, direction, payload, len, &rest, &rest_len, &held);
    if (rc == STOP) {
        /* Python takes the connection over at this frame boundary: the rest of these bytes are fed
         * to its frame reader, which starts empty (the rest is what it would have held). */
        *handback = disarm(e, k, direction, rest, (Py_ssize_t)rest_len, NULL, 0);
        buf_free(&held);
        return *handback ? STOP : ERROR;
    }
    return rc;
}

/* -- records --------------------------------------------------------------------------------------- */

static PyObject *result(Py_ssize_t pos, long long number, long long last_ts, int any, long long nbytes,
                        PyObject *handback) {
    PyObject *ts = any ? PyLong_FromLongLong(last_ts) : (Py_INCREF(Py_None), Py_None);
    if (!handback) {
        Py_INCREF(Py_None);
        handback = Py_None;
    }
    if (!ts) {
        Py_DECREF(handback);
        return NULL;
    }
    return Py_BuildValue("(nLNLN)", pos, number, ts, nbytes, handback);  /* N: the tuple takes both */
}

/* Engine.pcapng(buf, pos, number, interfaces, limit) -> (pos, number, last_ts or None, bytes, handback)
 * Takes little-endian Enhanced Packet Blocks from pos on while they are whole in buf and their
 * packets are the lane's, at most `limit` of them. interfaces: ((linktype, ticks per second), ...),
 * ticks 0 where they do not fit 64 bits. What capture_file._pcapng's fast loop checks, checked
 * the same way, so that where the lane stops Python reads the same block the same way. */
static PyObject *engine_pcapng(Engine *e, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos;
    long long number, limit;
    PyObject *interfaces;
    if (!PyArg_ParseTuple(args, "y*nLO!L", &view, &pos, &number, &PyTuple_Type, &interfaces, &limit)) return NULL;
    Py_ssize_t known = PyTuple_GET_SIZE(interfaces);
    int linktypes[64];
    unsigned long long ticks[64];
    if (known > 64) known = 64;  /* more interfaces than that: the rest are Python's */
    for (Py_ssize_t i = 0; i < known; i++) {
        PyObject *it = PyTuple_GET_ITEM(interfaces, i);
        if (!PyArg_ParseTuple(it, "iK", &linktypes[i], &ticks[i])) { PyBuffer_Release(&view); return NULL; }
    }
    const uint8_t *buf = view.buf;
    Py_ssize_t size = view.len;
    long long last_ts = 0, nbytes = 0, taken = 0;
    PyObject *handback = NULL;
    while (taken < limit && pos >= 0 && size - pos >= 28) {
        const uint8_t *b = buf + pos;
        uint32_t block_type = le32(b), length = le32(b + 4), iface = le32(b + 8), caplen = le32(b + 20);
        if (!(block_type == EPB && length <= (uint64_t)(size - pos) && !(length % 4) && iface < (uint64_t)known
              && length >= 32 && caplen <= length - 32))
            break;
        if (!ticks[iface]) break;
        unsigned __int128 t = (((unsigned __int128)le32(b + 12) << 32) | le32(b + 16)) * 1000000000u / ticks[iface];
        if (t > (unsigned __int128)INT64_MAX) break;
        int rc = packet(e, linktypes[iface], b + 28, caplen, (long long)t, number + 1, &handback);
        if (rc == ERROR) { PyBuffer_Release(&view); return NULL; }
        if (rc == STOP && !handback) break;
        number++;
        taken++;
        last_ts = (long long)t;
        nbytes += caplen;
        pos += length;
        if (handback) break;
    }
    PyBuffer_Release(&view);
    return result(pos, number, last_ts, taken > 0, nbytes, handback);
}

/* Engine.pcap(buf, pos, number, linktype, little_endian, nanos, limit): the same for pcap records. */
static PyObject *engine_pcap(Engine *e, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos;
    long long number, limit;
    int linktype, nanos;
    if (!PyArg_ParseTuple(args, "y*nLipL", &view, &pos, &number, &linktype, &nanos, &limit)) return NULL;
    const uint8_t *buf = view.buf;
    Py_ssize_t size = view.len;
    long long last_ts = 0, nbytes = 0, taken = 0, scale = nanos ? 1 : 1000;
    PyObject *handback = NULL;
    while (taken < limit && pos >= 0 && size - pos >= 16) {
        const uint8_t *b = buf + pos;
        uint32_t caplen = le32(b + 8);
        if (caplen > MAX_RECORD || (uint64_t)(size - pos) < 16 + (uint64_t)caplen) break;
        long long t = (long long)le32(b) * 1000000000LL + (long long)le32(b + 4) * scale;
        int rc = packet(e, linktype, b + 16, caplen, t, number + 1, &handback);
        if (rc == ERROR) { PyBuffer_Release(&view); return NULL; }
        if (rc == STOP && !handback) break;
        number++;
        taken++;
        last_ts = t;
        nbytes += caplen;
        pos += 16 + caplen;
        if (handback) break;
    }
    PyBuffer_Release(&view);
    return result(pos, number, last_ts, taken > 0, nbytes, handback);
}

/* -- the type ---------------------------------------------------------------------------------------- */

static int new_object_column(ObjectColumn *c) {
    c->values = PyList_New(0);
    c->positions = PyDict_New();
    c->last = NULL;
    return c->values && c->positions ? 0 : -1;
}

static int new_content_lists(ContentColumns *c) {
    return new_object_column(&c->shared) < 0 || new_object_column(&c->properties) < 0
           || new_object_column(&c->hash) < 0 || new_object_column(&c->identity) < 0 ? -1 : 0;
}

static void free_object_column(ObjectColumn *c) {
    Py_CLEAR(c->values);
    Py_CLEAR(c->positions);
    c->last = NULL;
    buf_free(&c->at);
}

static void free_columns(Engine *e) {
    AckColumns *a = &e->ack_rows;
    Buf *ack_bufs[] = {&a->conn, &a->seq, &a->ts, &a->dir, &a->channel, &a->method, &a->packet, &a->tag,
                       &a->multiple, &a->requeue};
    for (size_t i = 0; i < sizeof ack_bufs / sizeof *ack_bufs; i++) buf_free(ack_bufs[i]);
    a->n = 0;
    ContentColumns *c = &e->content_rows;
    Buf *content_bufs[] = {&c->conn, &c->seq, &c->ts, &c->dir, &c->channel, &c->method, &c->packet, &c->tag,
                           &c->has_tag, &c->body_size, &c->has_size, &c->complete};
    for (size_t i = 0; i < sizeof content_bufs / sizeof *content_bufs; i++) buf_free(content_bufs[i]);
    free_object_column(&c->shared);
    free_object_column(&c->properties);
    free_object_column(&c->hash);
    free_object_column(&c->identity);
    c->n = 0;
}

static PyObject *bytes_of(Buf *b) {
    return PyBytes_FromStringAndSize(b->data ? (const char *)b->data : "", (Py_ssize_t)b->len);
}

/* Engine.take_rows() -> (acks, contents): the rows made since the last call, column by column, and
 * starts anew. acks: (n, conn i32, seq i64, ts_ns i64, direction i8, channel i32, method i8 (index
 * in the ack names), packet i64, tag i64, multiple i8, requeue i8) as bytes; contents: (n, conn,
 * seq, ts_ns, direction, channel, method i8 (index in the content names), packet, tag i64, has_tag
 * i8, body_size i64, has_size i8, complete i8, then shared, properties, hashes and identities, each
 * as its distinct objects and an i32 index per row). */
static PyObject *engine_take_rows(Engine *e, PyObject *unused) {
    AckColumns *a = &e->ack_rows;
    ContentColumns *c = &e->content_rows;
    PyObject *acks = Py_BuildValue("(nNNNNNNNNNN)", a->n, bytes_of(&a->conn), bytes_of(&a->seq), bytes_of(&a->ts),
                                   bytes_of(&a->dir), bytes_of(&a->channel), bytes_of(&a->method),
                                   bytes_of(&a->packet), bytes_of(&a->tag), bytes_of(&a->multiple),
                                   bytes_of(&a->requeue));
    if (!acks) return NULL;
    PyObject *contents = Py_BuildValue("(nNNNNNNNNNNNN(ON)(ON)(ON)(ON))", c->n, bytes_of(&c->conn), bytes_of(&c->seq),
                                       bytes_of(&c->ts), bytes_of(&c->dir), bytes_of(&c->channel),
                                       bytes_of(&c->method), bytes_of(&c->packet), bytes_of(&c->tag),
                                       bytes_of(&c->has_tag), bytes_of(&c->body_size), bytes_of(&c->has_size),
                                       bytes_of(&c->complete), c->shared.values, bytes_of(&c->shared.at),
                                       c->properties.values, bytes_of(&c->properties.at), c->hash.values,
                                       bytes_of(&c->hash.at), c->identity.values, bytes_of(&c->identity.at));
    if (!contents) {
        Py_DECREF(acks);
        return NULL;
    }
    free_columns(e);
    if (new_content_lists(&e->content_rows) < 0) {
        Py_DECREF(acks);
        Py_DECREF(contents);
        return NULL;
    }
    return Py_BuildValue("(NN)", acks, contents);
}

/* Engine.rows(): rows made since the last take_rows(). */
static PyObject *engine_rows(Engine *e, PyObject *unused) {
    return PyLong_FromSsize_t(e->ack_rows.n + e->content_rows.n);
}

static int engine_init(Engine *e, PyObject *args, PyObject *kwds) {
    PyObject *counts, *ack_names, *content_names, *other_names, *digests, *incomplete, *no_properties;
    if (!PyArg_ParseTuple(args, "O!O!O!O!OOO!", &PyDict_Type, &counts, &PyTuple_Type, &ack_names,
                          &PyTuple_Type, &content_names, &PyTuple_Type, &other_names, &digests, &incomplete,
                          &PyTuple_Type, &no_properties))
        return -1;
    if (e->flows) {
        PyErr_SetString(PyExc_RuntimeError, "an Engine is initialised once");
        return -1;
    }
    if (PyTuple_GET_SIZE(ack_names) != 3 || PyTuple_GET_SIZE(content_names) != 4 || PyTuple_GET_SIZE(other_names) != 6) {
        PyErr_SetString(PyExc_ValueError, "3 ack names, 4 content names; content.header, content.body, 4 facts keys");
        return -1;
    }
    e->flows = PyDict_New();
    if (!e->flows || new_content_lists(&e->content_rows) < 0) return -1;
    Py_INCREF(counts); e->counts = counts;
    for (int i = 0; i < 3; i++) { e->ack_names[i] = PyTuple_GET_ITEM(ack_names, i); Py_INCREF(e->ack_names[i]); }
    for (int i = 0; i < 4; i++) {
        e->content_names[i] = PyTuple_GET_ITEM(content_names, i);
        Py_INCREF(e->content_names[i]);
    }
    PyObject **names[6] = {&e->header_name, &e->body_name, &e->facts_frames[0], &e->facts_frames[1],
                           &e->facts_bytes[0], &e->facts_bytes[1]};
    for (int i = 0; i < 6; i++) { *names[i] = PyTuple_GET_ITEM(other_names, i); Py_INCREF(*names[i]); }
    Py_INCREF(digests); e->digests = digests;
    Py_INCREF(incomplete); e->incomplete_identity = incomplete;
    Py_INCREF(no_properties); e->no_properties = no_properties;
    return 0;
}

static void engine_dealloc(Engine *e) {
    for (int k = 0; k < e->nslots; k++) slot_clear(&e->slots[k]);
    PyMem_Free(e->slots);
    free_columns(e);
    Py_XDECREF(e->counts);
    Py_XDECREF(e->flows);
    for (int i = 0; i < 3; i++) Py_XDECREF(e->ack_names[i]);
    for (int i = 0; i < 4; i++) Py_XDECREF(e->content_names[i]);
    Py_XDECREF(e->header_name);
    Py_XDECREF(e->body_name);
    for (int d = 0; d < 2; d++) { Py_XDECREF(e->facts_frames[d]); Py_XDECREF(e->facts_bytes[d]); }
    Py_XDECREF(e->digests);
    Py_XDECREF(e->incomplete_identity);
    Py_XDECREF(e->no_properties);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static PyObject *engine_armed(Engine *e, PyObject *unused) {
    int n = 0;
    for (int k = 0; k < e->nslots; k++) n += e->slots[k].conn != NULL;
    return PyLong_FromLong(n);
}

static PyMethodDef engine_methods[] = {
    {"arm", (PyCFunction)engine_arm, METH_VARARGS, "Hand a connection in its plain state to the lane."},
    {"release", (PyCFunction)engine_release, METH_O, "Take the connection owning a flow key back."},
    {"release_all", (PyCFunction)engine_release_all, METH_NOARGS, "Take every connection back."},
    {"ignore", (PyCFunction)engine_ignore, METH_O, "Pass over a flow's packets."},
    {"forget", (PyCFunction)engine_forget, METH_O, "Stop passing over a flow's packets."},
    {"armed", (PyCFunction)engine_armed, METH_NOARGS, "Connections the lane holds."},
    {"rows", (PyCFunction)engine_rows, METH_NOARGS, "Rows made since the last take_rows()."},
    {"take_rows", (PyCFunction)engine_take_rows, METH_NOARGS, "The rows made, column by column."},
    {"pcapng", (PyCFunction)engine_pcapng, METH_VARARGS, "Decode pcapng packet blocks."},
    {"pcap", (PyCFunction)engine_pcap, METH_VARARGS, "Decode pcap records."},
    {NULL},
};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "analyzer._lane.Engine",
    .tp_basicsize = sizeof(Engine),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)engine_init,
    .tp_dealloc = (destructor)engine_dealloc,
    .tp_methods = engine_methods,
    .tp_doc = "The native lane of one decode (see analyzer/native.py).",
};

static struct PyModuleDef lane_module = {PyModuleDef_HEAD_INIT, "_lane", "The decoder's native lane.", -1, NULL};

PyMODINIT_FUNC PyInit__lane(void) {
    if (PyType_Ready(&EngineType) < 0) return NULL;
    PyObject *m = PyModule_Create(&lane_module);
    if (!m) return NULL;
    Py_INCREF(&EngineType);
    if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0) {
        Py_DECREF(&EngineType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
