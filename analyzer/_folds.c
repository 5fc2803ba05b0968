/* The per-record folds in C (see folds.py): C twins of the folds every delivery and publish record
 * goes through in the pass, for the records they take:
 *
 *   metrics_record(metrics, record)   timeline/metrics.py, ChannelMetrics._delivery and _publish
 *   buildup_add(buildup, delivery)    detectors/consumer.py, UnackedBuildup.add and what it calls
 *   publish_add(synchronous, publish) detectors/__init__.py, ConnectionDetectors.python_publish
 *
 * Each either does everything its Python does for the record (the same state changes, in the same
 * order) and returns True, or changes nothing and returns False: the Python then takes it. Every
 * condition is checked before the first change. The records it takes are those of plain values
 * (exact ints within 2**62, exact strs, None, True and False) into state of the shapes the Python
 * builds; anything else (a new incarnation or consumer scope, a record before the horizon, a
 * delivery past a threshold, a consumer whose ack mode is unknown, ...) goes the Python way, which
 * stays the one statement of the rules. tests/test_folds.py holds the two to the same state after
 * every record and the same rows and findings at the end.
 *
 * The state objects are slotted: their fields are read at the offsets `configure` resolves by name.
 *
 * HandOff (at the end) hands each record of a connection's timeline to these twins directly, where
 * the pass's Python took four calls to reach them (connection_analysis.py). Two more twins take
 * lists, not records: peak_change (metrics._peak_change, a closing bucket's peak level) and
 * boundary_records (carry.python_boundary_records, the checkpoint's prune of the records kept).
 */
#include "_slots.h"

/* ---- fields, by class ----------------------------------------------------------------------- */

#define CLASSES(X) X(METRICS) X(INCARNATION) X(BUCKET) X(DELIVERY) X(PUBLISH) X(UNACKED) X(BUILDUP) X(PROFILE) \
    X(SYNCHRONOUS) X(LOCKSTEP) X(FIRSTS) X(ANALYSIS) X(WHOLE) X(DETECTORS)
#define AS_ENUM(name) K_##name,
enum { CLASSES(AS_ENUM) N_CLASSES };
#define AS_NAME(name) #name,
static const char *class_keys[N_CLASSES] = {CLASSES(AS_NAME)};

#define FIELDS(X) \
    X(METRICS, size) X(METRICS, incarnations) X(METRICS, _last) X(METRICS, _last_inc) \
    X(INCARNATION, buckets) X(INCARNATION, final_before) \
    X(BUCKET, counts) X(BUCKET, arrivals) X(BUCKET, departures) X(BUCKET, deliver_at) \
    X(BUCKET, consumer_prefetch) X(BUCKET, channel_prefetch) \
    X(DELIVERY, connection_id) X(DELIVERY, agent_id) X(DELIVERY, channel) X(DELIVERY, incarnation) \
    X(DELIVERY, seq) X(DELIVERY, ts_ns) X(DELIVERY, method) X(DELIVERY, delivery_tag) X(DELIVERY, consumer_tag) \
    X(DELIVERY, redelivered) X(DELIVERY, no_ack) X(DELIVERY, consumer_prefetch) X(DELIVERY, channel_prefetch) \
    X(DELIVERY, outcome) X(DELIVERY, requeue) X(DELIVERY, settle_seq) X(DELIVERY, settle_ts_ns) \
    X(DELIVERY, observed_until_ts_ns) \
    X(PUBLISH, connection_id) X(PUBLISH, agent_id) X(PUBLISH, channel) X(PUBLISH, incarnation) \
    X(PUBLISH, seq) X(PUBLISH, ts_ns) X(PUBLISH, mode) X(PUBLISH, outcome) X(PUBLISH, return_seq) \
    X(PUBLISH, settle_seq) X(PUBLISH, settle_ts_ns) X(PUBLISH, pending_before) X(PUBLISH, persistent) \
    X(PUBLISH, out_of_order) X(PUBLISH, confirm_multiple) X(PUBLISH, confirm_seq) X(PUBLISH, message_identity) \
    X(UNACKED, age_limit_ns) X(UNACKED, stall_limit_ns) X(UNACKED, channels) \
    X(BUILDUP, agent_id) X(BUILDUP, oldest_ns) X(BUILDUP, oldest) X(BUILDUP, channel_scope) \
    X(BUILDUP, consumer_scopes) \
    X(PROFILE, limit) X(PROFILE, end_ns) X(PROFILE, keys) X(PROFILE, times) \
    X(SYNCHRONOUS, channels) \
    X(LOCKSTEP, agent_id) X(LOCKSTEP, n) X(LOCKSTEP, lockstep) X(LOCKSTEP, first_ns) X(LOCKSTEP, last_ns) \
    X(LOCKSTEP, items) X(LOCKSTEP, pending) \
    X(FIRSTS, _items) \
    X(ANALYSIS, out_record) X(ANALYSIS, detectors) X(ANALYSIS, metrics) X(WHOLE, kept)

#define FIELD_ENUM(cls, name) F_##cls##_##name,
enum { FIELDS(FIELD_ENUM) N_FIELDS };
typedef struct {
    int cls;
    const char *name;
} FieldName;
#define FIELD_NAME(cls, name) {K_##cls, #name},
static const FieldName field_names[N_FIELDS] = {FIELDS(FIELD_NAME)};

static PyTypeObject *classes[N_CLASSES];
static Py_ssize_t offsets[N_FIELDS];
static int metrics_configured = 0, buildup_configured = 0, publish_configured = 0;
static Py_ssize_t max_evidence;   /* common.MAX_EVIDENCE */

#define GET(obj, field) slot_get((obj), offsets[F_##field])
#define PUT(obj, field, value) slot_put((obj), offsets[F_##field], (value))

static int is_a(PyObject *obj, int cls) { return obj && Py_TYPE(obj) == classes[cls]; }

/* ---- constants -------------------------------------------------------------------------------- */

#define STRINGS(X) \
    X(unknown) X(confirm) X(basic_deliver) X(ack) X(nack) X(reject) X(recovered) X(channel_closed) \
    X(connection_closed) X(open) X(acked) X(nacked) X(lost) X(consumer_scope) X(none)
#define STRING_ENUM(name) S_##name,
enum { STRINGS(STRING_ENUM) N_STRINGS };
static const char *string_names[N_STRINGS] = {STRINGS(AS_NAME)};
static PyObject *strings[N_STRINGS];
static PyObject *empty;   /* "" */
static PyObject *key_seq, *key_confirm_seq, *key_message_identity;   /* a lockstep publish's evidence item */

/* channel_metrics' counts, in metrics.COUNTS order (configure checks the names). */
#define COUNTS(X) \
    X(deliveries) X(redeliveries) X(deliveries_unknown) X(acks) X(nacks) X(rejects) X(requeues) X(publishes) \
    X(returns) X(publishes_unknown) X(confirms) X(confirm_nacks) X(lost)
#define COUNT_ENUM(name) C_##name,
enum { COUNTS(COUNT_ENUM) N_COUNTS };
static const char *count_names[N_COUNTS] = {COUNTS(AS_NAME)};
enum { UNACKED_LEVEL = 0, UNCONFIRMED_LEVEL = 1 };

/* ---- plain values ----------------------------------------------------------------------------- */

#define BOUND (1LL << 62)   /* times, seqs and counts the twins take: their encodings cannot overflow */

/* An exact int in [0, 2**62). */
static int bounded(PyObject *value, long long *out) { return as_i64(value, out) && *out >= 0 && *out < BOUND; }

/* True, False or None as 1, 0, 0; -1 for anything else (its truth could run code). */
static int flag(PyObject *value) {
    if (value == Py_True) return 1;
    return value == Py_False || value == Py_None ? 0 : -1;
}

/* None or an exact int within 64 bits: 1 (with *is_none), 0 for anything else. */
static int optional_i64(PyObject *value, long long *out, int *is_none) {
    *is_none = value == Py_None;
    return *is_none || as_i64(value, out);
}

/* A key part the Python compares or hashes: only these, whose == and hash run no code. */
static int plain_key(PyObject *value) {
    return value && (value == Py_None || PyUnicode_CheckExact(value) || PyLong_CheckExact(value));
}

/* a == b for two plain keys: 1, 0. */
static int same_key(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    if (PyUnicode_CheckExact(a) && PyUnicode_CheckExact(b)) return same_str(a, b);
    if (PyLong_CheckExact(a) && PyLong_CheckExact(b)) return PyObject_RichCompareBool(a, b, Py_EQ);
    return 0;
}

static PyObject *int_from_le(const unsigned char *bytes, size_t n) {
#if PY_VERSION_HEX >= 0x030D0000
    return PyLong_FromUnsignedNativeBytes(bytes, n, Py_ASNATIVEBYTES_LITTLE_ENDIAN);
#else
    return _PyLong_FromByteArray(bytes, n, 1, 0);
#endif
}

typedef unsigned __int128 u128;

/* metrics.py's instant of (ts, seq): ts * 2**65 + 2 * seq + extra (2: a departure's, 3: an arrival's). */
static u128 instant(long long ts, long long seq, unsigned extra) { return ((u128)ts << 65) + ((u128)seq << 1) + extra; }

static PyObject *u128_int(u128 value) {
    unsigned char bytes[16];
    for (int i = 0; i < 16; i++) bytes[i] = (unsigned char)(value >> (8 * i));
    return int_from_le(bytes, 16);
}

/* metrics.py's outstanding item: (arrival instant << 64) + settle ts + 2**63. */
static PyObject *item_int(u128 arrival, unsigned long long settle_part) {
    unsigned char bytes[24];
    for (int i = 0; i < 8; i++) bytes[i] = (unsigned char)(settle_part >> (8 * i));
    for (int i = 0; i < 16; i++) bytes[8 + i] = (unsigned char)(arrival >> (8 * i));
    return int_from_le(bytes, 24);
}

/* list.append of a new reference (stolen). */
static int append_new(PyObject *list, PyObject *item) {
    if (!item) return -1;
    int failed = PyList_Append(list, item);
    Py_DECREF(item);
    return failed;
}

/* ---- channel_metrics -------------------------------------------------------------------------- */

/* A record's fields of the classes' offsets, by kind (Delivery or Publish). */
typedef struct {
    int connection_id, agent_id, channel, incarnation, seq, ts_ns, settle_seq, settle_ts_ns;
} RecordFields;
static const RecordFields delivery_fields = {
    F_DELIVERY_connection_id, F_DELIVERY_agent_id, F_DELIVERY_channel, F_DELIVERY_incarnation, F_DELIVERY_seq,
    F_DELIVERY_ts_ns, F_DELIVERY_settle_seq, F_DELIVERY_settle_ts_ns};
static const RecordFields publish_fields = {
    F_PUBLISH_connection_id, F_PUBLISH_agent_id, F_PUBLISH_channel, F_PUBLISH_incarnation, F_PUBLISH_seq,
    F_PUBLISH_ts_ns, F_PUBLISH_settle_seq, F_PUBLISH_settle_ts_ns};
#define FIELD_OF(x, f) slot_get((x), offsets[(f)])

/* When a record happened and settled, as _delivery and _publish read it: never settled before its
 * own row. */
typedef struct {
    long long ts, seq, settle_ts, settle_seq;
    int settled, settle_seq_known;
} Times;

static int times_of(PyObject *x, const RecordFields *f, Times *t) {
    if (!bounded(FIELD_OF(x, f->ts_ns), &t->ts) || !bounded(FIELD_OF(x, f->seq), &t->seq)) return 0;
    PyObject *settle_ts = FIELD_OF(x, f->settle_ts_ns), *settle_seq = FIELD_OF(x, f->settle_seq);
    if (!settle_ts || !settle_seq) return 0;
    t->settled = settle_ts != Py_None;
    t->settle_seq_known = 0;
    if (!t->settled) return 1;
    if (!bounded(settle_ts, &t->settle_ts)) return 0;
    t->settle_seq_known = settle_seq != Py_None;
    if (t->settle_seq_known && !bounded(settle_seq, &t->settle_seq)) return 0;
    if (t->settle_ts < t->ts) t->settle_ts = t->ts, t->settle_seq = t->seq, t->settle_seq_known = 1;
    return 1;
}

/* ChannelMetrics._of: the record's incarnation (borrowed), the last record's when it is the same
 * one. 1 found (*miss: by the key, so _last moves to it), 0 not taken. */
static int incarnation_of(PyObject *metrics, PyObject *x, const RecordFields *f, PyObject **inc, int *miss) {
    PyObject *parts[4] = {FIELD_OF(x, f->connection_id), FIELD_OF(x, f->agent_id), FIELD_OF(x, f->channel),
                          FIELD_OF(x, f->incarnation)};
    for (int i = 0; i < 4; i++)
        if (!plain_key(parts[i])) return 0;
    PyObject *last = GET(metrics, METRICS__last);
    const RecordFields *lf = is_a(last, K_DELIVERY) ? &delivery_fields : is_a(last, K_PUBLISH) ? &publish_fields : NULL;
    if (lf) {
        /* the Python compares incarnation, channel, connection_id, agent_id: all plain, so in any order */
        PyObject *theirs[4] = {FIELD_OF(last, lf->connection_id), FIELD_OF(last, lf->agent_id),
                               FIELD_OF(last, lf->channel), FIELD_OF(last, lf->incarnation)};
        int same = 1;
        for (int i = 0; i < 4 && same; i++) {
            if (!plain_key(theirs[i])) return 0;
            same = same_key(parts[i], theirs[i]);
        }
        if (same) {
            *inc = GET(metrics, METRICS__last_inc), *miss = 0;
            return is_a(*inc, K_INCARNATION);
        }
    } else if (!last || last != Py_None) {
        return 0;
    }
    PyObject *incarnations = GET(metrics, METRICS_incarnations);
    if (!incarnations || !PyDict_CheckExact(incarnations)) return 0;
    PyObject *key = PyTuple_Pack(4, parts[0], parts[1], parts[2], parts[3]);
    if (!key) return -1;
    *inc = PyDict_GetItemWithError(incarnations, key);
    Py_DECREF(key);
    if (!*inc) return PyErr_Occurred() ? -1 : 0;   /* a new incarnation: the Python way */
    *miss = 1;
    return is_a(*inc, K_INCARNATION);
}

/* A bucket as the Python built it: counts of exact ints, two lists per level, deliver_at. */
static int plain_bucket(PyObject *b) {
    if (!is_a(b, K_BUCKET)) return 0;
    PyObject *counts = GET(b, BUCKET_counts), *arrivals = GET(b, BUCKET_arrivals);
    PyObject *departures = GET(b, BUCKET_departures), *deliver_at = GET(b, BUCKET_deliver_at);
    if (!counts || !PyList_CheckExact(counts) || PyList_GET_SIZE(counts) != N_COUNTS) return 0;
    for (int i = 0; i < N_COUNTS; i++) {
        long long n;
        if (!bounded(PyList_GET_ITEM(counts, i), &n)) return 0;
    }
    PyObject *pairs[2] = {arrivals, departures};
    for (int i = 0; i < 2; i++) {
        if (!pairs[i] || !PyTuple_CheckExact(pairs[i]) || PyTuple_GET_SIZE(pairs[i]) != 2 ||
            !PyList_CheckExact(PyTuple_GET_ITEM(pairs[i], 0)) || !PyList_CheckExact(PyTuple_GET_ITEM(pairs[i], 1)))
            return 0;
    }
    return deliver_at && (deliver_at == Py_None || PyLong_CheckExact(deliver_at)) &&
           GET(b, BUCKET_consumer_prefetch) && GET(b, BUCKET_channel_prefetch);
}

/* The incarnation's bucket starting at `start` (borrowed) or NULL when it has none yet; 1, 0 (not
 * a plain bucket) or -1. */
static int bucket_at(PyObject *buckets, long long start, PyObject **bucket) {
    PyObject *key = PyLong_FromLongLong(start);
    if (!key) return -1;
    *bucket = PyDict_GetItemWithError(buckets, key);
    Py_DECREF(key);
    if (!*bucket) return PyErr_Occurred() ? -1 : 1;
    return plain_bucket(*bucket);
}

/* _Incarnation.bucket: the one at `start`, made if missing (borrowed). */
static PyObject *bucket(PyObject *buckets, long long start, PyObject *found) {
    if (found) return found;
    PyObject *key = PyLong_FromLongLong(start), *made = key ? PyObject_CallNoArgs((PyObject *)classes[K_BUCKET]) : NULL;
    int failed = !made || PyDict_SetItem(buckets, key, made) < 0;
    Py_XDECREF(key);
    Py_XDECREF(made);   /* the dict holds it */
    return failed ? NULL : made;
}

/* counts[i] += 1 (an exact int below 2**62, checked). */
static int bump(PyObject *b, int i) {
    PyObject *counts = GET(b, BUCKET_counts), *old = PyList_GET_ITEM(counts, i);
    PyObject *now = PyLong_FromLongLong(PyLong_AsLongLong(old) + 1);
    if (!now) return -1;
    PyList_SET_ITEM(counts, i, now);
    Py_DECREF(old);
    return 0;
}

static PyObject *level_list(PyObject *b, int pair_field, int level) {
    return PyTuple_GET_ITEM(slot_get(b, offsets[pair_field]), level);
}

/* What _delivery and _publish share: the record's incarnation, its times and its two buckets
 * (the one it arrived in and the one it settled in), checked; nothing changed yet. */
typedef struct {
    PyObject *inc, *buckets, *arrived_in, *settled_in;   /* borrowed; a bucket NULL until made */
    long long start, settled_start;
    int miss;
    Times t;
} Placed;

static int place(PyObject *metrics, PyObject *x, const RecordFields *f, Placed *p) {
    if (!times_of(x, f, &p->t)) return 0;
    int found = incarnation_of(metrics, x, f, &p->inc, &p->miss);
    if (found <= 0) return found;
    PyObject *final_before = GET(p->inc, INCARNATION_final_before);
    long long size, before;
    int no_horizon;
    if (!final_before || !optional_i64(final_before, &before, &no_horizon)) return 0;
    if (!no_horizon && p->t.ts < before) return 0;   /* HorizonError: the Python raises it */
    if (!as_i64(GET(metrics, METRICS_size), &size) || size <= 0) return 0;
    p->buckets = GET(p->inc, INCARNATION_buckets);
    if (!p->buckets || !PyDict_CheckExact(p->buckets)) return 0;
    p->start = p->t.ts - p->t.ts % size;
    p->settled_start = p->t.settled ? p->t.settle_ts - p->t.settle_ts % size : p->start;
    int ok = bucket_at(p->buckets, p->start, &p->arrived_in);
    if (ok > 0 && p->settled_start != p->start) ok = bucket_at(p->buckets, p->settled_start, &p->settled_in);
    else p->settled_in = p->arrived_in;
    return ok;
}

/* The first changes: _of's cache, then the buckets made as the Python makes them (arrival's first). */
static int placed(PyObject *metrics, PyObject *x, Placed *p) {
    if (p->miss) {
        PUT(metrics, METRICS__last, Py_NewRef(x));
        PUT(metrics, METRICS__last_inc, Py_NewRef(p->inc));
    }
    int same = p->settled_start == p->start;
    p->arrived_in = bucket(p->buckets, p->start, p->arrived_in);
    if (!p->arrived_in) return -1;
    if (same) p->settled_in = p->arrived_in;
    return 0;
}

static PyObject *settled_bucket(Placed *p) {
    if (!p->settled_in) p->settled_in = bucket(p->buckets, p->settled_start, NULL);
    return p->settled_in;
}

static PyObject *departure(Placed *p) {
    return u128_int(p->t.settle_seq_known ? instant(p->t.settle_ts, p->t.settle_seq, 2) : instant(p->t.settle_ts, 0, 0));
}

#define SETTLE_OFFSET (1ULL << 63)
#define NEVER_PART (~0ULL)   /* NEVER (2**63 - 1) + 2**63 */

/* metrics.ever_outstanding(x) of a delivery or publish whose outcome (and mode, or no_ack) were
 * read as the callers read them: 1 or 0. */
static int ever_outstanding(PyObject *x, int is_delivery) {
    if (same_str(is_delivery ? GET(x, DELIVERY_outcome) : GET(x, PUBLISH_outcome), strings[S_unknown])) return 0;
    return is_delivery ? GET(x, DELIVERY_no_ack) == Py_False : same_str(GET(x, PUBLISH_mode), strings[S_confirm]);
}

/* ChannelMetrics._delivery: 1 done, 0 not taken, -1 error. */
static int metrics_delivery(PyObject *metrics, PyObject *d) {
    PyObject *method = GET(d, DELIVERY_method), *outcome = GET(d, DELIVERY_outcome), *no_ack = GET(d, DELIVERY_no_ack);
    PyObject *consumer_prefetch = GET(d, DELIVERY_consumer_prefetch), *channel_prefetch = GET(d, DELIVERY_channel_prefetch);
    if (!method || !PyUnicode_CheckExact(method) || !outcome || !PyUnicode_CheckExact(outcome) || !no_ack ||
        !consumer_prefetch || !channel_prefetch)
        return 0;
    int redelivered = flag(GET(d, DELIVERY_redelivered)), requeue = flag(GET(d, DELIVERY_requeue));
    if (redelivered < 0 || requeue < 0) return 0;
    Placed p;
    int ok = place(metrics, d, &delivery_fields, &p);
    if (ok <= 0) return ok;
    int known = !same_str(outcome, strings[S_unknown]);
    int which = same_str(outcome, strings[S_ack]) ? C_acks : same_str(outcome, strings[S_nack]) ? C_nacks
              : same_str(outcome, strings[S_reject]) ? C_rejects : -1;
    int counted = ever_outstanding(d, 1);

    if (placed(metrics, d, &p) < 0) return -1;
    PyObject *b = p.arrived_in;
    if (bump(b, C_deliveries) < 0 || (redelivered && bump(b, C_redeliveries) < 0) ||
        (!known && bump(b, C_deliveries_unknown) < 0))
        return -1;
    u128 arrived = instant(p.t.ts, p.t.seq, 3);
    if (same_str(method, strings[S_basic_deliver])) {
        PyObject *at = u128_int(arrived), *deliver_at = GET(b, BUCKET_deliver_at);
        if (!at) return -1;
        int later = deliver_at == Py_None ? 1 : PyObject_RichCompareBool(at, deliver_at, Py_GT);
        if (later < 0) {
            Py_DECREF(at);
            return -1;
        }
        if (later) {
            PUT(b, BUCKET_deliver_at, at);
            PUT(b, BUCKET_consumer_prefetch, Py_NewRef(consumer_prefetch));
            PUT(b, BUCKET_channel_prefetch, Py_NewRef(channel_prefetch));
        } else {
            Py_DECREF(at);
        }
    }
    if (!p.t.settled) {
        if (counted && append_new(level_list(b, F_BUCKET_arrivals, UNACKED_LEVEL), item_int(arrived, NEVER_PART)) < 0)
            return -1;
        return 1;
    }
    if (counted && append_new(level_list(b, F_BUCKET_arrivals, UNACKED_LEVEL),
                              item_int(arrived, (unsigned long long)p.t.settle_ts + SETTLE_OFFSET)) < 0)
        return -1;
    PyObject *s = settled_bucket(&p);
    if (!s) return -1;
    if (counted && append_new(level_list(s, F_BUCKET_departures, UNACKED_LEVEL), departure(&p)) < 0) return -1;
    if (which >= 0 && (bump(s, which) < 0 || (which != C_acks && requeue && bump(s, C_requeues) < 0))) return -1;
    return 1;
}

/* ChannelMetrics._publish: 1 done, 0 not taken, -1 error. */
static int metrics_publish(PyObject *metrics, PyObject *x) {
    PyObject *mode = GET(x, PUBLISH_mode), *outcome = GET(x, PUBLISH_outcome), *return_seq = GET(x, PUBLISH_return_seq);
    if (!mode || !PyUnicode_CheckExact(mode) || !outcome || !PyUnicode_CheckExact(outcome) || !return_seq) return 0;
    Placed p;
    int ok = place(metrics, x, &publish_fields, &p);
    if (ok <= 0) return ok;
    int known = !same_str(outcome, strings[S_unknown]);
    int which = same_str(outcome, strings[S_acked]) ? C_confirms : same_str(outcome, strings[S_nacked]) ? C_confirm_nacks
              : same_str(outcome, strings[S_lost]) ? C_lost : -1;
    int counted = ever_outstanding(x, 0);

    if (placed(metrics, x, &p) < 0) return -1;
    PyObject *b = p.arrived_in;
    if (bump(b, C_publishes) < 0 || (return_seq != Py_None && bump(b, C_returns) < 0) ||
        (!known && bump(b, C_publishes_unknown) < 0))
        return -1;
    if (counted) {
        unsigned long long settle_part = p.t.settled ? (unsigned long long)p.t.settle_ts + SETTLE_OFFSET : NEVER_PART;
        if (append_new(level_list(b, F_BUCKET_arrivals, UNCONFIRMED_LEVEL),
                       item_int(instant(p.t.ts, p.t.seq, 3), settle_part)) < 0)
            return -1;
    }
    if (!p.t.settled) return 1;
    PyObject *s = settled_bucket(&p);
    if (!s) return -1;
    if (counted && append_new(level_list(s, F_BUCKET_departures, UNCONFIRMED_LEVEL), departure(&p)) < 0) return -1;
    if (which >= 0 && bump(s, which) < 0) return -1;
    return 1;
}

/* A twin's answer (1 done, 0 not taken, -1 error) with a pending error counted as one. */
static int answer(int done) { return done < 0 || (!done && PyErr_Occurred()) ? -1 : done; }

static PyObject *as_bool(int done) {
    if (done < 0) return NULL;
    return PyBool_FromLong(done);
}

/* ChannelMetrics' fold of a record: 1 done, 0 not taken (nothing changed), -1 error. */
static int metrics_take(PyObject *metrics, PyObject *x) {
    if (!metrics_configured || !is_a(metrics, K_METRICS)) return 0;
    int done = is_a(x, K_DELIVERY) ? metrics_delivery(metrics, x) : is_a(x, K_PUBLISH) ? metrics_publish(metrics, x) : 0;
    return answer(done);
}

/* metrics_record(metrics, record) -> True (done here) or False (nothing changed). */
static PyObject *metrics_record(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "metrics_record(metrics, record)");
        return NULL;
    }
    return as_bool(metrics_take(args[0], args[1]));
}

/* A detector's state of one incarnation, `channels[(channel, incarnation)]`, of class `cls`: 1 with
 * *found (borrowed), 0 none or not of the shape the twins take, -1 error. */
static int per_incarnation(PyObject *channels, PyObject *channel, PyObject *incarnation, int cls, PyObject **found) {
    if (!channels || !PyDict_CheckExact(channels) || !plain_key(channel) || !plain_key(incarnation)) return 0;
    PyObject *key = PyTuple_Pack(2, channel, incarnation);
    if (!key) return -1;
    *found = PyDict_GetItemWithError(channels, key);
    Py_DECREF(key);
    if (!*found) return PyErr_Occurred() ? -1 : 0;
    return is_a(*found, cls);
}

/* ---- unacked_buildup -------------------------------------------------------------------------- */

/* common.most (`larger`) or least of two plain values (None skipped): the one kept, borrowed, `a`
 * on a tie as Python's max and min keep their first; NULL: not plain. */
static PyObject *extreme_of(PyObject *a, PyObject *b, int larger) {
    long long x, y;
    if (a == Py_None) return b;
    if (b == Py_None) return a;
    if (!as_i64(a, &x) || !as_i64(b, &y)) return NULL;
    return (larger ? y > x : y < x) ? b : a;
}

static PyObject *most_of(PyObject *a, PyObject *b) { return extreme_of(a, b, 1); }
static PyObject *least_of(PyObject *a, PyObject *b) { return extreme_of(a, b, 0); }

static PyObject *least_str(PyObject *a, PyObject *b) {
    if (a == Py_None) return b;
    if (b == Py_None) return a;
    if (!PyUnicode_CheckExact(a) || !PyUnicode_CheckExact(b)) return NULL;
    int less = PyUnicode_Compare(b, a);   /* exact strs: no code runs */
    return less < 0 ? b : a;
}

static int plain_profile(PyObject *scope) {
    if (!is_a(scope, K_PROFILE)) return 0;
    PyObject *keys = GET(scope, PROFILE_keys), *times = GET(scope, PROFILE_times);
    PyObject *limit = GET(scope, PROFILE_limit), *end_ns = GET(scope, PROFILE_end_ns);
    long long v;
    return keys && PyList_CheckExact(keys) && times && PyList_CheckExact(times) && limit &&
           (limit == Py_None || as_i64(limit, &v)) && end_ns && (end_ns == Py_None || as_i64(end_ns, &v));
}

/* consumer._scope_add, its values checked. */
static int scope_add(PyObject *scope, PyObject *limit, PyObject *d, long long seq, PyObject *settle_key) {
    PUT(scope, PROFILE_limit, Py_NewRef(most_of(GET(scope, PROFILE_limit), limit)));
    PUT(scope, PROFILE_end_ns, Py_NewRef(most_of(GET(scope, PROFILE_end_ns), GET(d, DELIVERY_observed_until_ts_ns))));
    PyObject *keys = GET(scope, PROFILE_keys), *times = GET(scope, PROFILE_times);
    if (append_new(keys, PyLong_FromLongLong(seq * 2)) < 0 || PyList_Append(times, GET(d, DELIVERY_ts_ns)) < 0)
        return -1;
    if (settle_key && (PyList_Append(keys, settle_key) < 0 || PyList_Append(times, GET(d, DELIVERY_settle_ts_ns)) < 0))
        return -1;
    return 0;
}

static int settled_outcome(PyObject *outcome) {
    static const int settled[] = {S_ack, S_nack, S_reject, S_recovered, S_channel_closed, S_connection_closed};
    for (size_t i = 0; i < sizeof settled / sizeof *settled; i++)
        if (same_str(outcome, strings[settled[i]])) return 1;
    return 0;
}

/* UnackedBuildup.add: 1 done, 0 not taken, -1 error. */
static int buildup_delivery(PyObject *all, PyObject *d) {
    PyObject *outcome = GET(d, DELIVERY_outcome), *no_ack = GET(d, DELIVERY_no_ack);
    if (!outcome || !PyUnicode_CheckExact(outcome) || !no_ack) return 0;
    int settled = settled_outcome(outcome);
    if (!settled && !same_str(outcome, strings[S_open])) return 1;   /* auto-ack, unknown: not counted */
    if (no_ack == Py_None) return 0;   /* waits to be proven manual: the Python way */
    if (no_ack != Py_False) return 1;
    /* _manual */
    PyObject *until_obj = settled ? GET(d, DELIVERY_settle_ts_ns) : GET(d, DELIVERY_observed_until_ts_ns);
    if (!until_obj) return 0;
    if (until_obj == Py_None) return 1;
    PyObject *b;   /* its incarnation's; none yet: its first delivery, the Python way */
    int found = per_incarnation(GET(all, UNACKED_channels), GET(d, DELIVERY_channel), GET(d, DELIVERY_incarnation),
                                K_BUILDUP, &b);
    if (found <= 0) return found;
    /* _Buildup.add */
    long long until, ts, seq, age_limit, stall_limit, oldest_ns = 0, oldest_seq = 0, settle_seq = 0;
    if (!bounded(until_obj, &until) || !bounded(GET(d, DELIVERY_ts_ns), &ts) || !bounded(GET(d, DELIVERY_seq), &seq) ||
        !as_i64(GET(all, UNACKED_age_limit_ns), &age_limit) || !as_i64(GET(all, UNACKED_stall_limit_ns), &stall_limit))
        return 0;
    long long age = until - ts;
    if (age >= age_limit || age >= stall_limit) return 0;   /* listed past a threshold: the Python way */
    PyObject *agent_id = GET(b, BUILDUP_agent_id), *d_agent_id = GET(d, DELIVERY_agent_id);
    PyObject *kept_agent = agent_id && d_agent_id ? least_str(agent_id, d_agent_id) : NULL;
    PyObject *oldest_obj = GET(b, BUILDUP_oldest_ns), *oldest = GET(b, BUILDUP_oldest);
    int no_oldest;
    if (!kept_agent || !oldest_obj || !optional_i64(oldest_obj, &oldest_ns, &no_oldest) || !oldest) return 0;
    if (!no_oldest && age == oldest_ns) {
        if (!PyTuple_CheckExact(oldest) || PyTuple_GET_SIZE(oldest) != 2 ||
            !as_i64(PyTuple_GET_ITEM(oldest, 1), &oldest_seq))
            return 0;
    }
    int older = no_oldest || age > oldest_ns || (age == oldest_ns && seq < oldest_seq);
    PyObject *method = GET(d, DELIVERY_method), *settle_seq_obj = GET(d, DELIVERY_settle_seq);
    if (!method || !PyUnicode_CheckExact(method) || !settle_seq_obj || !GET(d, DELIVERY_delivery_tag)) return 0;
    if (settled && settle_seq_obj != Py_None && !bounded(settle_seq_obj, &settle_seq)) return 0;
    int delivered = same_str(method, strings[S_basic_deliver]);
    PyObject *channel_limit = delivered ? GET(d, DELIVERY_channel_prefetch) : Py_None;
    PyObject *consumer_prefetch = GET(d, DELIVERY_consumer_prefetch), *observed = GET(d, DELIVERY_observed_until_ts_ns);
    long long v, consumer_limit = 0;
    int none;
    if (!channel_limit || !optional_i64(channel_limit, &v, &none) || !observed || !optional_i64(observed, &v, &none) ||
        !consumer_prefetch || !optional_i64(consumer_prefetch, &consumer_limit, &none))
        return 0;
    PyObject *channel_scope = GET(b, BUILDUP_channel_scope), *scopes = GET(b, BUILDUP_consumer_scopes);
    if (!plain_profile(channel_scope) || !scopes || !PyDict_CheckExact(scopes)) return 0;
    PyObject *consumer_scope = NULL;
    if (delivered && !none && consumer_limit > 0) {
        PyObject *tag = GET(d, DELIVERY_consumer_tag);
        if (!tag || (tag != Py_None && !PyUnicode_CheckExact(tag))) return 0;
        PyObject *name = PyUnicode_Concat(strings[S_consumer_scope], tag == Py_None ? empty : tag);
        if (!name) return -1;
        consumer_scope = PyDict_GetItemWithError(scopes, name);
        Py_DECREF(name);
        if (!consumer_scope) return PyErr_Occurred() ? -1 : 0;   /* a new consumer's scope: the Python way */
        if (!plain_profile(consumer_scope)) return 0;
    }
    PyObject *settle_key = NULL;
    if (settled && !(settle_key = PyLong_FromLongLong((settle_seq_obj != Py_None ? settle_seq : seq) * 2 + 1)))
        return -1;

    PUT(b, BUILDUP_agent_id, Py_NewRef(kept_agent));
    int failed = 0;
    if (older) {
        PyObject *age_obj = PyLong_FromLongLong(age);
        PyObject *pair = age_obj ? PyTuple_Pack(2, GET(d, DELIVERY_delivery_tag), GET(d, DELIVERY_seq)) : NULL;
        failed = !pair;
        if (!failed) {
            PUT(b, BUILDUP_oldest_ns, age_obj);
            PUT(b, BUILDUP_oldest, pair);
        } else {
            Py_XDECREF(age_obj);
        }
    }
    failed = failed || scope_add(channel_scope, channel_limit, d, seq, settle_key) < 0 ||
             (consumer_scope && scope_add(consumer_scope, consumer_prefetch, d, seq, settle_key) < 0);
    Py_XDECREF(settle_key);
    return failed ? -1 : 1;
}

/* UnackedBuildup.add of a record: 1 done, 0 not taken (nothing changed), -1 error. */
static int buildup_take(PyObject *buildup, PyObject *d) {
    if (!buildup_configured || !is_a(buildup, K_UNACKED) || !is_a(d, K_DELIVERY)) return 0;
    return answer(buildup_delivery(buildup, d));
}

/* buildup_add(buildup, delivery) -> True (done here) or False (nothing changed). */
static PyObject *buildup_add(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "buildup_add(buildup, delivery)");
        return NULL;
    }
    return as_bool(buildup_take(args[0], args[1]));
}

/* ---- the publish detectors -------------------------------------------------------------------- */

/* Whether `value` is the exact str constant `which`: 1, 0; -1 for a value whose == could run code. */
static int is_string(PyObject *value, int which) {
    if (!value) return -1;
    if (value == strings[which]) return 1;
    if (value == Py_None || value == Py_True || value == Py_False || PyLong_CheckExact(value)) return 0;
    return PyUnicode_CheckExact(value) ? same_str(value, strings[which]) : -1;
}

/* A publish every detector but synchronous_confirms ignores (publisher.py's `matches`): 1 it is,
 * 0 one of them would take it (or a value the Python compares could run code). */
static int only_synchronous(PyObject *p) {
    int lost = is_string(GET(p, PUBLISH_outcome), S_lost), nacked = is_string(GET(p, PUBLISH_outcome), S_nacked);
    int confirm = is_string(GET(p, PUBLISH_mode), S_confirm), none = is_string(GET(p, PUBLISH_mode), S_none);
    if (lost < 0 || nacked < 0 || confirm < 0 || none < 0) return 0;
    PyObject *out_of_order = GET(p, PUBLISH_out_of_order), *multiple = GET(p, PUBLISH_confirm_multiple);
    PyObject *persistent = GET(p, PUBLISH_persistent);
    if (!out_of_order || !multiple || !persistent) return 0;
    if (lost && confirm) return 0;                                 /* LostConfirm */
    if (nacked) return 0;                                          /* ConfirmNack */
    if (out_of_order == Py_True && multiple == Py_False) return 0; /* OutOfOrderConfirm */
    if (persistent == Py_True && none) return 0;                   /* UnconfirmedPersistentPublish */
    return 1;
}

/* SynchronousConfirms.add and _Lockstep.add: 1 done, 0 not taken, -1 error. */
static int synchronous_publish(PyObject *synchronous, PyObject *p) {
    PyObject *pending_before = GET(p, PUBLISH_pending_before);
    int confirm = is_string(GET(p, PUBLISH_mode), S_confirm);
    if (confirm < 0 || !pending_before) return 0;
    if (!confirm || pending_before == Py_None) return 1;   /* not a publish it counts */
    long long before;
    if (!as_i64(pending_before, &before)) return 0;
    PyObject *c;   /* its incarnation's; none yet: its first, the Python way */
    int found = per_incarnation(GET(synchronous, SYNCHRONOUS_channels), GET(p, PUBLISH_channel),
                                GET(p, PUBLISH_incarnation), K_LOCKSTEP, &c);
    if (found <= 0) return found;
    /* _Lockstep.add, every value checked first */
    int lockstep = before == 0;
    PyObject *seq = GET(p, PUBLISH_seq), *ts = GET(p, PUBLISH_ts_ns), *settle_ts = GET(p, PUBLISH_settle_ts_ns);
    PyObject *agent_id = GET(c, LOCKSTEP_agent_id), *p_agent_id = GET(p, PUBLISH_agent_id);
    PyObject *n_obj = GET(c, LOCKSTEP_n), *lockstep_obj = GET(c, LOCKSTEP_lockstep);
    PyObject *first_ns = GET(c, LOCKSTEP_first_ns), *last_ns = GET(c, LOCKSTEP_last_ns);
    PyObject *items = GET(c, LOCKSTEP_items), *pending = GET(c, LOCKSTEP_pending);
    long long n, count, v;
    if (!seq || !ts || !settle_ts || !agent_id || !p_agent_id || !first_ns || !last_ns || !as_i64(n_obj, &n) ||
        !as_i64(lockstep_obj, &count) || n >= BOUND || count >= BOUND || !bounded(ts, &v) ||
        (settle_ts != Py_None && !bounded(settle_ts, &v)) || !pending || !PyList_CheckExact(pending))
        return 0;
    PyObject *kept_agent = least_str(agent_id, p_agent_id);
    PyObject *kept_first = least_of(first_ns, ts), *kept_last = most_of(last_ns, settle_ts != Py_None ? settle_ts : ts);
    if (!kept_agent || !kept_first || !kept_last) return 0;
    PyObject *firsts = NULL, *item = NULL;
    if (lockstep) {   /* Firsts.add, unless it would trim: the Python way */
        firsts = is_a(items, K_FIRSTS) ? GET(items, FIRSTS__items) : NULL;
        if (!firsts || !PyList_CheckExact(firsts) || PyList_GET_SIZE(firsts) + 1 >= 4 * max_evidence) return 0;
        PyObject *confirm_seq = GET(p, PUBLISH_confirm_seq), *identity = GET(p, PUBLISH_message_identity);
        if (!confirm_seq || !identity) return 0;
        PyObject *fields = PyDict_New();
        if (!fields) return -1;
        if (PyDict_SetItem(fields, key_seq, seq) < 0 || PyDict_SetItem(fields, key_confirm_seq, confirm_seq) < 0 ||
            PyDict_SetItem(fields, key_message_identity, identity) < 0 || !(item = PyTuple_Pack(2, seq, fields))) {
            Py_DECREF(fields);
            return -1;
        }
        Py_DECREF(fields);
    }
    PyObject *waiting = PyTuple_Pack(4, seq, ts, settle_ts, lockstep ? Py_True : Py_False);
    PyObject *n_new = PyLong_FromLongLong(n + 1), *count_new = PyLong_FromLongLong(count + lockstep);
    int failed = !waiting || !n_new || !count_new || (item && PyList_Append(firsts, item) < 0) ||
                 PyList_Append(pending, waiting) < 0;
    Py_XDECREF(item);
    Py_XDECREF(waiting);
    if (failed) {   /* only an allocation fails here */
        Py_XDECREF(n_new), Py_XDECREF(count_new);
        return -1;
    }
    PUT(c, LOCKSTEP_agent_id, Py_NewRef(kept_agent));
    PUT(c, LOCKSTEP_n, n_new);
    PUT(c, LOCKSTEP_lockstep, count_new);
    PUT(c, LOCKSTEP_first_ns, Py_NewRef(kept_first));
    PUT(c, LOCKSTEP_last_ns, Py_NewRef(kept_last));
    return 1;
}

/* The publish detectors' fold of a record: 1 done, 0 not taken (nothing changed), -1 error. */
static int publish_take(PyObject *synchronous, PyObject *p) {
    if (!publish_configured || !is_a(synchronous, K_SYNCHRONOUS) || !is_a(p, K_PUBLISH)) return 0;
    return answer(only_synchronous(p) ? synchronous_publish(synchronous, p) : 0);
}

/* publish_add(synchronous, publish) -> True (ConnectionDetectors' fold of the publish done here:
 * only synchronous_confirms takes it) or False (nothing changed). */
static PyObject *publish_add(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "publish_add(synchronous, publish)");
        return NULL;
    }
    return as_bool(publish_take(args[0], args[1]));
}

/* ---- the hand-off of each record ---------------------------------------------------------------- */

/* HandOff(analysis, whole): the timeline's emit hook of a connection_analysis.ConnectionAnalysis
 * `analysis` over its carry.WholeConnection `whole` (whose `out` is analysis._record), both of the
 * classes configured or subclasses of them that keep `_record` and `_emit`. Called with each record, it does what `whole._emit` does, in one C call
 * instead of four Python ones:
 *
 *   analysis.out_record(record)
 *   analysis.detectors.record(record)    buildup_take (a delivery) or publish_take (a publish) first
 *   analysis._metrics_record(record)     metrics_take first, unless analysis.metrics is None
 *   whole.kept.append(record)
 *
 * Where a twin declines (it changed nothing), the Python method takes the record: it tries the twin
 * again, which declines again, and goes on the Python way. The twins are tried on detectors of the
 * configured class only (ConnectionDetectors: its `record` is the dispatch above). The fields are
 * read at each record, as the Python reads them (the pass replaces out_record, metrics and kept as
 * it goes): the two classes are slotted, so that costs no dict lookup. */
typedef struct {
    PyObject_HEAD
    PyObject *analysis, *whole;
    vectorcallfunc vectorcall;
} HandOff;

static PyObject *name_buildup, *name_synchronous, *name_record, *name_metrics_record, *name_append;

/* A slotted field, borrowed; NULL with Python's AttributeError if it is unset. */
static PyObject *field(PyObject *obj, int f) {
    PyObject *value = slot_get(obj, offsets[f]);
    if (!value)
        PyErr_Format(PyExc_AttributeError, "'%s' object has no attribute '%s'", Py_TYPE(obj)->tp_name,
                     field_names[f].name);
    return value;
}
#define FIELD(obj, name) field((obj), F_##name)

/* obj.<name>(arg), its result dropped: 0, -1 error. */
static int call_method(PyObject *obj, PyObject *name, PyObject *arg) {
    PyObject *result = PyObject_CallMethodOneArg(obj, name, arg);
    Py_XDECREF(result);
    return result ? 0 : -1;
}

/* analysis.detectors.record(record), its twins first: 0, -1 error. */
static int detectors_part(PyObject *analysis, PyObject *record) {
    PyObject *detectors = FIELD(analysis, ANALYSIS_detectors);
    if (!detectors) return -1;
    Py_INCREF(detectors);   /* the Python it calls may replace the field */
    int done = 0, delivery = is_a(record, K_DELIVERY);
    if ((delivery || is_a(record, K_PUBLISH)) && is_a(detectors, K_DETECTORS)) {
        PyObject *fold = PyObject_GetAttr(detectors, delivery ? name_buildup : name_synchronous);
        done = !fold ? -1 : delivery ? buildup_take(fold, record) : publish_take(fold, record);
        Py_XDECREF(fold);
    }
    if (!done) done = call_method(detectors, name_record, record);
    Py_DECREF(detectors);
    return done < 0 ? -1 : 0;
}

/* analysis._metrics_record(record), its twin first: 0, -1 error. */
static int metrics_part(PyObject *analysis, PyObject *record) {
    PyObject *metrics = FIELD(analysis, ANALYSIS_metrics);
    if (!metrics) return -1;
    Py_INCREF(metrics);
    int done = metrics == Py_None ? 1 : metrics_take(metrics, record);
    Py_DECREF(metrics);
    if (!done) done = call_method(analysis, name_metrics_record, record);
    return done < 0 ? -1 : 0;
}

static PyObject *hand_off_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    HandOff *h = (HandOff *)self;
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames) {
        PyErr_SetString(PyExc_TypeError, "hand_off(record)");
        return NULL;
    }
    PyObject *record = args[0], *out = FIELD(h->analysis, ANALYSIS_out_record);
    if (!out) return NULL;
    Py_INCREF(out);   /* held while it runs: Python may replace the field */
    PyObject *result = PyObject_CallOneArg(out, record);
    Py_DECREF(out);
    if (!result) return NULL;
    Py_DECREF(result);
    if (detectors_part(h->analysis, record) < 0 || metrics_part(h->analysis, record) < 0) return NULL;
    PyObject *kept = FIELD(h->whole, WHOLE_kept);
    if (!kept) return NULL;
    Py_INCREF(kept);
    int failed = PyList_CheckExact(kept) ? PyList_Append(kept, record) : call_method(kept, name_append, record);
    Py_DECREF(kept);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

static int hand_off_traverse(HandOff *h, visitproc visit, void *arg) {
    Py_VISIT(h->analysis);
    Py_VISIT(h->whole);
    return 0;
}

static int hand_off_clear(HandOff *h) {
    Py_CLEAR(h->analysis);
    Py_CLEAR(h->whole);
    return 0;
}

static void hand_off_dealloc(HandOff *h) {
    PyObject_GC_UnTrack(h);
    hand_off_clear(h);
    PyObject_GC_Del(h);
}

static int hand_off_configured = 0;

static PyObject *hand_off_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *analysis, *whole;
    static char *keywords[] = {"analysis", "whole", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:HandOff", keywords, &analysis, &whole)) return NULL;
    /* Subclasses too (the carried ones): their instances hold the slots read here at the same
     * offsets; connection_analysis.py hands off only for those that override neither method. */
    if (!hand_off_configured || !PyObject_TypeCheck(analysis, classes[K_ANALYSIS]) ||
        !PyObject_TypeCheck(whole, classes[K_WHOLE]))
        return PyErr_Format(PyExc_TypeError, "HandOff: a ConnectionAnalysis and its WholeConnection, of the "
                                             "classes configure_hand_off was given or theirs");
    HandOff *h = PyObject_GC_New(HandOff, type);
    if (!h) return NULL;
    h->analysis = Py_NewRef(analysis);
    h->whole = Py_NewRef(whole);
    h->vectorcall = hand_off_call;
    PyObject_GC_Track(h);
    return (PyObject *)h;
}

static PyTypeObject HandOffType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "analyzer._folds.HandOff",
    .tp_doc = "HandOff(analysis, whole): the timeline's emit hook doing what WholeConnection._emit does when its "
              "out is ConnectionAnalysis._record, in one call.",
    .tp_basicsize = sizeof(HandOff),
    .tp_new = hand_off_new,
    .tp_dealloc = (destructor)hand_off_dealloc,
    .tp_vectorcall_offset = offsetof(HandOff, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_traverse = (traverseproc)hand_off_traverse,
    .tp_clear = (inquiry)hand_off_clear,
};

/* ---- configure -------------------------------------------------------------------------------- */

/* Resolve the fields of the classes in `part` (a bit per class) from `given_classes`; every string. */
static int configure_part(PyObject *given_classes, PyObject *given_strings, unsigned part) {
    PyTypeObject *found[N_CLASSES] = {0};
    for (int k = 0; k < N_CLASSES; k++) {
        if (!(part & (1u << k))) continue;
        PyObject *cls = PyDict_GetItemString(given_classes, class_keys[k]);
        if (!cls || !PyType_Check(cls)) {
            PyErr_Format(PyExc_TypeError, "configure: no class %s", class_keys[k]);
            return -1;
        }
        found[k] = (PyTypeObject *)cls;
    }
    PyObject *found_strings[N_STRINGS];
    if (named_strings(given_strings, string_names, N_STRINGS, found_strings) < 0) return -1;
    Py_ssize_t found_offsets[N_FIELDS];
    for (int f = 0; f < N_FIELDS; f++)
        if (found[field_names[f].cls] &&
            (found_offsets[f] = slot_offset(found[field_names[f].cls], field_names[f].name)) < 0)
            return -1;
    for (int k = 0; k < N_CLASSES; k++)
        if (found[k]) Py_XSETREF(classes[k], (PyTypeObject *)Py_NewRef(found[k]));
    for (int i = 0; i < N_STRINGS; i++) Py_XSETREF(strings[i], Py_NewRef(found_strings[i]));
    for (int f = 0; f < N_FIELDS; f++)
        if (found[field_names[f].cls]) offsets[f] = found_offsets[f];
    return 0;
}

#define BIT(k) (1u << K_##k)
static const unsigned METRICS_PART = BIT(METRICS) | BIT(INCARNATION) | BIT(BUCKET) | BIT(DELIVERY) | BIT(PUBLISH);
static const unsigned BUILDUP_PART = BIT(UNACKED) | BIT(BUILDUP) | BIT(PROFILE) | BIT(DELIVERY);
static const unsigned PUBLISH_PART = BIT(SYNCHRONOUS) | BIT(LOCKSTEP) | BIT(FIRSTS) | BIT(PUBLISH);
static const unsigned HAND_OFF_PART = BIT(ANALYSIS) | BIT(WHOLE) | BIT(DETECTORS) | BIT(DELIVERY) | BIT(PUBLISH);

/* configure_metrics(classes: dict key -> class, strings: dict name -> str, counts: metrics.COUNTS) */
static PyObject *configure_metrics(PyObject *module, PyObject *args) {
    PyObject *given_classes, *given_strings, *given_counts;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyDict_Type, &given_classes, &PyDict_Type, &given_strings, &PyTuple_Type,
                          &given_counts))
        return NULL;
    int same = PyTuple_GET_SIZE(given_counts) == N_COUNTS;
    for (int i = 0; same && i < N_COUNTS; i++) {
        PyObject *name = PyTuple_GET_ITEM(given_counts, i);
        same = PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, count_names[i]) == 0;
    }
    if (!same)
        return PyErr_Format(PyExc_TypeError, "configure: channel_metrics' counts are not the ones _folds.c knows");
    metrics_configured = 0;
    if (configure_part(given_classes, given_strings, METRICS_PART) < 0) return NULL;
    metrics_configured = 1;
    Py_RETURN_NONE;
}

/* configure_buildup(classes: dict key -> class, strings: dict name -> str) */
static PyObject *configure_buildup(PyObject *module, PyObject *args) {
    PyObject *given_classes, *given_strings;
    if (!PyArg_ParseTuple(args, "O!O!", &PyDict_Type, &given_classes, &PyDict_Type, &given_strings)) return NULL;
    buildup_configured = 0;
    if (configure_part(given_classes, given_strings, BUILDUP_PART) < 0) return NULL;
    buildup_configured = 1;
    Py_RETURN_NONE;
}

/* configure_publish(classes: dict key -> class, strings: dict name -> str, max_evidence: int) */
static PyObject *configure_publish(PyObject *module, PyObject *args) {
    PyObject *given_classes, *given_strings;
    Py_ssize_t given_max;
    if (!PyArg_ParseTuple(args, "O!O!n", &PyDict_Type, &given_classes, &PyDict_Type, &given_strings, &given_max))
        return NULL;
    if (given_max < 1) return PyErr_Format(PyExc_ValueError, "configure: MAX_EVIDENCE must be at least 1");
    publish_configured = 0;
    if (configure_part(given_classes, given_strings, PUBLISH_PART) < 0) return NULL;
    max_evidence = given_max;
    publish_configured = 1;
    Py_RETURN_NONE;
}

/* configure_hand_off(classes: dict key -> class, strings: dict name -> str) */
static PyObject *configure_hand_off(PyObject *module, PyObject *args) {
    PyObject *given_classes, *given_strings;
    if (!PyArg_ParseTuple(args, "O!O!", &PyDict_Type, &given_classes, &PyDict_Type, &given_strings)) return NULL;
    hand_off_configured = 0;
    if (configure_part(given_classes, given_strings, HAND_OFF_PART) < 0) return NULL;
    hand_off_configured = 1;
    Py_RETURN_NONE;
}

/* -- channel_metrics' bucket peak ------------------------------------------------------------------ */

/* The low `n` bytes of a non-negative int `v` from byte `skip` on, as a u128 (n - skip <= 16):
   0, or -1 with no error set for an int it does not read (negative, or wider than n bytes). */
static int u128_of(PyObject *v, size_t n, size_t skip, u128 *out) {
    unsigned char bytes[24];
    if (!PyLong_CheckExact(v) || _PyLong_AsByteArray((PyLongObject *)v, bytes, n, 1, 0) < 0) {
        PyErr_Clear();
        return -1;
    }
    u128 value = 0;
    for (size_t i = n; i > skip; i--) value = (value << 8) | bytes[i - 1];
    *out = value;
    return 0;
}

static int u128_order(const void *a, const void *b) {
    u128 x = *(const u128 *)a, y = *(const u128 *)b;
    return (x > y) - (x < y);
}

/* Read each int of `list` into values (sorted: qsort unless it came sorted). */
static int read_sorted(PyObject *list, size_t n, size_t skip, u128 *values) {
    Py_ssize_t count = PyList_GET_SIZE(list);
    int sorted = 1;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (u128_of(PyList_GET_ITEM(list, i), n, skip, &values[i]) < 0) return -1;
        if (i && values[i] < values[i - 1]) sorted = 0;
    }
    if (!sorted) qsort(values, (size_t)count, sizeof *values, u128_order);
    return 0;
}

/* metrics._peak_change(arrivals, departures) on the same ints: arrivals are outstanding items
   (their instant is the item >> 64, 24 bytes at most), departures instants (16 bytes at most). */
static PyObject *peak_change(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "peak_change(arrivals: list, departures: list)");
        return NULL;
    }
    Py_ssize_t arrivals = PyList_GET_SIZE(args[0]), departures = PyList_GET_SIZE(args[1]);
    if (!departures) return PyLong_FromSsize_t(arrivals);
    if (!arrivals) return PyLong_FromLong(0);
    u128 *a = PyMem_Malloc(sizeof(u128) * (size_t)(arrivals + departures));
    if (!a) return PyErr_NoMemory();
    u128 *d = a + arrivals;
    PyObject *result = Py_None;
    if (read_sorted(args[0], 24, 8, a) == 0 && read_sorted(args[1], 16, 0, d) == 0) {
        /* The running level over both in instant order, its largest value; an instant's departures
           come before its arrivals (their encodings are even and odd, so never equal). */
        long long level = 0, peak = LLONG_MIN;
        Py_ssize_t i = 0, j = 0;
        while (i < arrivals || j < departures) {
            if (j < departures && (i == arrivals || d[j] < a[i])) {
                level--;
                j++;
            } else {
                level++;
                i++;
            }
            if (level > peak) peak = level;
        }
        result = PyLong_FromLongLong(peak);
    } else {
        Py_INCREF(result);   /* None: an int not read here; the Python takes it */
    }
    PyMem_Free(a);
    return result;
}

/* -- the checkpoint's boundary records ------------------------------------------------------------- */

static int boundary_configured = 0;

/* configure_boundary(classes: dict key -> class, strings: dict name -> str) */
static PyObject *configure_boundary(PyObject *module, PyObject *args) {
    PyObject *given_classes, *given_strings;
    if (!PyArg_ParseTuple(args, "O!O!", &PyDict_Type, &given_classes, &PyDict_Type, &given_strings)) return NULL;
    boundary_configured = 0;
    if (configure_part(given_classes, given_strings, BIT(DELIVERY) | BIT(PUBLISH)) < 0) return NULL;
    boundary_configured = 1;
    Py_RETURN_NONE;
}

/* A record's ts_ns and settle_ts_ns (None: *unsettled), each an exact int of 64 bits: 1, else 0. */
static int record_times(PyObject *x, int is_delivery, long long *ts, long long *settle, int *unsettled) {
    PyObject *settled = is_delivery ? GET(x, DELIVERY_settle_ts_ns) : GET(x, PUBLISH_settle_ts_ns);
    *unsettled = settled == Py_None;
    return as_i64(is_delivery ? GET(x, DELIVERY_ts_ns) : GET(x, PUBLISH_ts_ns), ts) &&
           (*unsettled || as_i64(settled, settle));
}

/* Whether ever_outstanding reads x as the Python does: its outcome (and its mode) exact str, its
 * no_ack present. */
static int outcome_read(PyObject *x, int is_delivery) {
    PyObject *outcome = is_delivery ? GET(x, DELIVERY_outcome) : GET(x, PUBLISH_outcome);
    if (!outcome || !PyUnicode_CheckExact(outcome)) return 0;
    if (is_delivery) return GET(x, DELIVERY_no_ack) != NULL;
    PyObject *mode = GET(x, PUBLISH_mode);
    return mode && PyUnicode_CheckExact(mode);
}

/* carry._boundary_records(records, boundary_ns) on a list of records of the exact classes (and
   others, skipped as the Python skips them): a new list of the same records, or None for what it
   does not read (a subclass of either, a time or seq that is not an exact int of 64 bits, a method,
   outcome or mode that is not a str, a channel that is not a plain key), which the Python then takes. */
static PyObject *boundary_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "boundary_records(records, boundary_ns)");
        return NULL;
    }
    if (!boundary_configured) {
        PyErr_SetString(PyExc_RuntimeError, "boundary_records: configure_boundary first");
        return NULL;
    }
    PyObject *records = args[0];
    long long boundary;
    if (!PyList_CheckExact(records) || !as_i64(args[1], &boundary)) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *kept = PyList_New(0), *last_deliver = PyDict_New(), *where = NULL;
    if (!kept || !last_deliver) goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(records); i++) {
        PyObject *x = PyList_GET_ITEM(records, i);
        int is_delivery = is_a(x, K_DELIVERY);
        if (!is_delivery && !is_a(x, K_PUBLISH)) {
            if (PyType_IsSubtype(Py_TYPE(x), classes[K_DELIVERY]) || PyType_IsSubtype(Py_TYPE(x), classes[K_PUBLISH]))
                goto decline;
            continue;   /* not an item: the Python's isinstance skips it */
        }
        long long ts, settle, seq;
        int unsettled;
        if (!record_times(x, is_delivery, &ts, &settle, &unsettled)) goto decline;
        if (unsettled && ts < boundary && !outcome_read(x, is_delivery)) goto decline;
        if (ts >= boundary || (unsettled ? ever_outstanding(x, is_delivery) : settle >= boundary)) {
            if (PyList_Append(kept, x) < 0) goto fail;
            continue;
        }
        if (!is_delivery) continue;
        PyObject *method = GET(x, DELIVERY_method);
        if (!method || !PyUnicode_CheckExact(method)) goto decline;
        if (!same_str(method, strings[S_basic_deliver])) continue;
        PyObject *channel = GET(x, DELIVERY_channel), *incarnation = GET(x, DELIVERY_incarnation);
        if (!as_i64(GET(x, DELIVERY_seq), &seq) || !plain_key(channel) || !plain_key(incarnation)) goto decline;
        /* Each incarnation's latest basic.deliver by (ts_ns, seq); the first of equals stays. */
        if (!(where = PyTuple_Pack(2, channel, incarnation))) goto fail;
        PyObject *before = PyDict_GetItemWithError(last_deliver, where);
        long long before_ts, before_seq;
        if (before) {   /* a record read above: its ts_ns and seq are exact ints of 64 bits */
            as_i64(GET(before, DELIVERY_ts_ns), &before_ts);
            as_i64(GET(before, DELIVERY_seq), &before_seq);
        } else if (PyErr_Occurred()) {
            goto fail;
        }
        if ((!before || ts > before_ts || (ts == before_ts && seq > before_seq)) &&
            PyDict_SetItem(last_deliver, where, x) < 0)
            goto fail;
        Py_CLEAR(where);
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(last_deliver, &pos, &key, &value))
        if (PyList_Append(kept, value) < 0) goto fail;
    Py_DECREF(last_deliver);
    return kept;
decline:
    Py_XDECREF(kept);
    Py_XDECREF(last_deliver);
    Py_XDECREF(where);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
fail:
    Py_XDECREF(kept);
    Py_XDECREF(last_deliver);
    Py_XDECREF(where);
    return NULL;
}

static PyMethodDef methods[] = {
    {"metrics_record", (PyCFunction)(void (*)(void))metrics_record, METH_FASTCALL,
     "metrics_record(metrics, record) -> True if ChannelMetrics' fold of it was done here; False (nothing changed)."},
    {"buildup_add", (PyCFunction)(void (*)(void))buildup_add, METH_FASTCALL,
     "buildup_add(buildup, delivery) -> True if UnackedBuildup.add was done here; False (nothing changed)."},
    {"publish_add", (PyCFunction)(void (*)(void))publish_add, METH_FASTCALL,
     "publish_add(synchronous, publish) -> True if the detectors' fold of the publish was done here; False "
     "(nothing changed)."},
    {"peak_change", (PyCFunction)(void (*)(void))peak_change, METH_FASTCALL,
     "peak_change(arrivals, departures) -> metrics._peak_change's value, or None for an int it does not read."},
    {"boundary_records", (PyCFunction)(void (*)(void))boundary_records, METH_FASTCALL,
     "boundary_records(records, boundary_ns) -> carry._boundary_records' list, or None for what it does not read."},
    {"configure_boundary", configure_boundary, METH_VARARGS,
     "configure_boundary(classes, strings): the record classes boundary_records reads."},
    {"configure_publish", configure_publish, METH_VARARGS,
     "configure_publish(classes, strings, max_evidence): the publish detectors' classes and constants."},
    {"configure_metrics", configure_metrics, METH_VARARGS,
     "configure_metrics(classes, strings, counts): channel_metrics' classes and constants."},
    {"configure_buildup", configure_buildup, METH_VARARGS,
     "configure_buildup(classes, strings): unacked_buildup's classes and constants."},
    {"configure_hand_off", configure_hand_off, METH_VARARGS,
     "configure_hand_off(classes, strings): HandOff's classes (the analysis, its machine, the detectors)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_folds", NULL, -1, methods};

PyMODINIT_FUNC PyInit__folds(void) {
    if (!(empty = PyUnicode_FromString("")) || !(key_seq = PyUnicode_InternFromString("seq")) ||
        !(key_confirm_seq = PyUnicode_InternFromString("confirm_seq")) ||
        !(key_message_identity = PyUnicode_InternFromString("message_identity")))
        return NULL;
    struct { PyObject **name; const char *text; } names[] = {
        {&name_buildup, "buildup"}, {&name_synchronous, "synchronous"}, {&name_record, "record"},
        {&name_metrics_record, "_metrics_record"}, {&name_append, "append"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(*names[i].name = PyUnicode_InternFromString(names[i].text))) return NULL;
    if (PyType_Ready(&HandOffType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddObjectRef(m, "HandOff", (PyObject *)&HandOffType) < 0) Py_CLEAR(m);
    return m;
}
