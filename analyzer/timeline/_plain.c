/* The machine's plain frames in C (see plain.py): a C twin of ConnectionTimeline.feed for the rows
 * that make up nearly all of a busy connection, on an incarnation in its ordinary state:
 *
 *   basic.deliver      a delivery with the next tag, its consumer known or not, no early ack waiting
 *   basic.ack/nack/reject from the client, naming an outstanding tag, outside a transaction
 *   basic.publish      on a channel whose broker is not refusing it, no early confirm waiting
 *   basic.ack/nack     from the broker, confirming publishes it numbered
 *
 * `feed(timeline, row)` either does everything the Python machine does for such a row (the same
 * state changes, the same records emitted in the same order) and returns True, or changes nothing
 * and returns False: the Python transition then takes the row. Every condition is checked before
 * the first change. Each step below names the Python it mirrors (connection.py, consumer.py,
 * publisher.py, channel.py); tests/test_plain.py runs both on the same traffic and compares every
 * record and the state after every row.
 *
 * The state objects are slotted: their fields are read at the offsets `configure` resolves from
 * the classes, by name, once. Records are made as records.py's maker makes them (no __init__).
 */
#include "_slots.h"
#include "_row.h"
#include "_untrack.h"

/* ---- fields, by class ----------------------------------------------------------------------- */

#define CLASSES(X) X(TIMELINE) X(LIFE) X(CONSUMER) X(PUBLISHER) X(DELIVERY_STATE) X(PUBLISH_STATE) \
    X(DELIVERY) X(PUBLISH)
#define AS_ENUM(name) K_##name,
enum { CLASSES(AS_ENUM) N_CLASSES };

typedef struct {
    int cls;
    const char *name;
} FieldName;

#define FIELDS(X) \
    X(TIMELINE, id) X(TIMELINE, agent_id) X(TIMELINE, lives) X(TIMELINE, last_seq) X(TIMELINE, last_ts_ns) \
    X(TIMELINE, finished) X(TIMELINE, awaiting_next) X(TIMELINE, emit) \
    X(LIFE, connection) X(LIFE, channel) X(LIFE, incarnation) X(LIFE, open_row) X(LIFE, gap_seen) \
    X(LIFE, gap_since_end) X(LIFE, ended) X(LIFE, holding) X(LIFE, held) X(LIFE, consumer) X(LIFE, publisher) \
    X(CONSUMER, consumers) X(CONSUMER, outstanding) X(CONSUMER, early) X(CONSUMER, proven_manual) \
    X(CONSUMER, first_tag) X(CONSUMER, max_tag) X(CONSUMER, channel_prefetch) X(CONSUMER, unacked) \
    X(CONSUMER, peak_unacked) X(CONSUMER, deliveries) X(CONSUMER, refusing) \
    X(PUBLISHER, confirm) X(PUBLISHER, tx) X(PUBLISHER, aligned) X(PUBLISHER, next_confirm) X(PUBLISHER, pending) \
    X(PUBLISHER, awaiting_return) X(PUBLISHER, early_confirms) X(PUBLISHER, early_multiple) \
    X(PUBLISHER, answered_select) X(PUBLISHER, publishes) \
    X(DELIVERY_STATE, row) X(DELIVERY_STATE, tag) X(DELIVERY_STATE, consumer_tag) X(DELIVERY_STATE, queue) \
    X(DELIVERY_STATE, no_ack) X(DELIVERY_STATE, consumer_prefetch) X(DELIVERY_STATE, channel_prefetch) \
    X(PUBLISH_STATE, row) X(PUBLISH_STATE, mode) X(PUBLISH_STATE, confirm_seq) X(PUBLISH_STATE, pending_before) \
    X(PUBLISH_STATE, outcome) X(PUBLISH_STATE, settle) X(PUBLISH_STATE, confirm) X(PUBLISH_STATE, out_of_order_by) \
    X(PUBLISH_STATE, returned) X(PUBLISH_STATE, observed_until)

/* A record's fields: every one must be set, so `configure` checks these are all its slots. */
#define DELIVERY_FIELDS(X) \
    X(DELIVERY, connection_id) X(DELIVERY, agent_id) X(DELIVERY, channel) X(DELIVERY, incarnation) \
    X(DELIVERY, channel_open_seq) X(DELIVERY, seq) X(DELIVERY, ts_ns) X(DELIVERY, method) X(DELIVERY, delivery_tag) \
    X(DELIVERY, consumer_tag) X(DELIVERY, queue) X(DELIVERY, exchange) X(DELIVERY, routing_key) \
    X(DELIVERY, message_id) X(DELIVERY, message_identity) X(DELIVERY, redelivered) X(DELIVERY, x_death_count) \
    X(DELIVERY, no_ack) X(DELIVERY, consumer_prefetch) X(DELIVERY, channel_prefetch) X(DELIVERY, outcome) \
    X(DELIVERY, settled_by_multiple) X(DELIVERY, settle_tag) X(DELIVERY, requeue) X(DELIVERY, in_tx) \
    X(DELIVERY, settle_frame_seq) X(DELIVERY, settle_seq) X(DELIVERY, settle_ts_ns) X(DELIVERY, settle_latency_ns) \
    X(DELIVERY, observed_until_ts_ns)
#define PUBLISH_FIELDS(X) \
    X(PUBLISH, connection_id) X(PUBLISH, agent_id) X(PUBLISH, channel) X(PUBLISH, incarnation) \
    X(PUBLISH, channel_open_seq) X(PUBLISH, seq) X(PUBLISH, ts_ns) X(PUBLISH, exchange) X(PUBLISH, routing_key) \
    X(PUBLISH, mandatory) X(PUBLISH, persistent) X(PUBLISH, message_id) X(PUBLISH, message_identity) X(PUBLISH, mode) \
    X(PUBLISH, confirm_seq) X(PUBLISH, pending_before) X(PUBLISH, outcome) X(PUBLISH, confirm_tag) \
    X(PUBLISH, confirm_multiple) X(PUBLISH, out_of_order) X(PUBLISH, out_of_order_by) X(PUBLISH, return_code) \
    X(PUBLISH, return_text) X(PUBLISH, return_seq) X(PUBLISH, settle_seq) X(PUBLISH, settle_ts_ns) \
    X(PUBLISH, settle_latency_ns) X(PUBLISH, observed_until_ts_ns)

#define ALL_FIELDS(X) FIELDS(X) DELIVERY_FIELDS(X) PUBLISH_FIELDS(X)
#define FIELD_ENUM(cls, name) F_##cls##_##name,
enum { ALL_FIELDS(FIELD_ENUM) N_FIELDS };
#define FIELD_NAME(cls, name) {K_##cls, #name},
static const FieldName field_names[N_FIELDS] = {ALL_FIELDS(FIELD_NAME)};
#define COUNT_ONE(cls, name) +1
enum { N_DELIVERY_FIELDS = 0 DELIVERY_FIELDS(COUNT_ONE), N_PUBLISH_FIELDS = 0 PUBLISH_FIELDS(COUNT_ONE) };

static PyTypeObject *classes[N_CLASSES];
static Py_ssize_t offsets[N_FIELDS];
static int configured = 0;

/* A field of `obj` (borrowed; NULL if unset), `obj` being of the field's class exactly. */
#define GET(obj, field) (*(PyObject **)((char *)(obj) + offsets[F_##field]))

/* Set a field to a new reference (stolen). */
#define PUT(obj, field, value) slot_put((obj), offsets[F_##field], (value))

static int is_a(PyObject *obj, int cls) { return obj && Py_TYPE(obj) == classes[cls]; }

/* ---- constants -------------------------------------------------------------------------------- */

#define STRINGS(X) \
    X(to_broker) X(to_client) X(basic_deliver) X(basic_ack) X(basic_nack) X(basic_reject) X(basic_publish) \
    X(ack) X(nack) X(reject) X(auto_) X(unknown) X(acked) X(nacked) X(untracked) X(confirm) X(tx) X(none)
#define STRING_ENUM(name) S_##name,
enum { STRINGS(STRING_ENUM) N_STRINGS };
#define STRING_NAME(name) #name,
static const char *string_names[N_STRINGS] = {STRINGS(STRING_NAME)};
static PyObject *strings[N_STRINGS];   /* the values records.py and the machine use, from `configure` */

#define KEYS(X) \
    X(connection_id) X(seq) X(ts_ns) X(method) X(direction) X(channel) X(malformed) X(delivery_tag) X(consumer_tag) X(multiple) \
    X(requeue) X(mandatory) X(exchange) X(routing_key) X(message_id) X(message_identity) X(redelivered) \
    X(x_death_count) X(delivery_mode) X(body_size) X(reply_code) X(reply_text)
#define KEY_ENUM(name) R_##name,
enum { KEYS(KEY_ENUM) N_KEYS };
static PyObject *keys[N_KEYS];   /* interned row keys */
static PyObject *two, *zero;     /* the ints 2 (delivery_mode persistent) and 0 */

/* A row is a dict or a Row (analyzer/_row.h, the type `configure` is given; NULL if none). */
static PyTypeObject *row_type;
static int is_row(PyObject *obj) { return obj && (PyDict_CheckExact(obj) || (row_type && Py_TYPE(obj) == row_type)); }

/* Where each key is in the Rows of one `index` (the last one met: batches of the same columns
 * share it, _columns.c's shared_names, so this is looked up once a pass), -1 where it is not a
 * column. Holding `index` keeps it alive. */
static PyObject *known_index;
static Py_ssize_t key_at[N_KEYS];

static int learn_index(Row *row) {
    for (int k = 0; k < N_KEYS; k++) {
        PyObject *at = PyDict_GetItemWithError(row->index, keys[k]);
        Py_ssize_t i = at && PyLong_CheckExact(at) ? PyLong_AsSsize_t(at) : -1;
        if (PyErr_Occurred()) return -1;
        key_at[k] = i >= 0 && i < Py_SIZE(row) ? i : -1;
    }
    Py_XSETREF(known_index, Py_NewRef(row->index));
    return 0;
}

/* row.get(key): borrowed, NULL when missing. No lookup can run code: a dict's keys here are
 * interned str (a lookup raises only on a broken hash), a Row's are read by position. */
static PyObject *row_get(PyObject *row, int key) {
    if (Py_TYPE(row) != row_type) return PyDict_GetItemWithError(row, keys[key]);
    if (((Row *)row)->index != known_index && learn_index((Row *)row) < 0) return NULL;
    return key_at[key] < 0 ? NULL : row_at(row, key_at[key]);
}
static PyObject *or_none(PyObject *value) { return value ? value : Py_None; }

/* bool(row.get(...)): 1, 0, or -1 with an error. */
static int truthy(PyObject *value) {
    if (!value || value == Py_None || value == Py_False) return 0;
    return value == Py_True ? 1 : PyObject_IsTrue(value);
}

/* ---- records ---------------------------------------------------------------------------------- */

/* A record of class `cls` from `values` (new references, stolen, in the class's field order). */
static PyObject *make_record(int cls, PyObject **values, int first_field, int n) {
    PyObject *record = classes[cls]->tp_alloc(classes[cls], 0);
    if (!record) {
        for (int i = 0; i < n; i++) Py_XDECREF(values[i]);
        return NULL;
    }
    for (int i = 0; i < n; i++) *(PyObject **)((char *)record + offsets[first_field + i]) = values[i];
    untrack_if_plain(record, values, n);
    return record;
}

/* ChannelLife.out: held while a close waits for its close-ok, else to the connection's emit. */
static int out(PyObject *life, PyObject *record) {
    int failed;
    PyObject *holding = GET(life, LIFE_holding);
    if (holding && holding != Py_None) {
        failed = PyList_Append(GET(life, LIFE_held), record);
    } else {
        PyObject *result = PyObject_CallOneArg(GET(GET(life, LIFE_connection), TIMELINE_emit), record);
        failed = result == NULL;
        Py_XDECREF(result);
    }
    Py_DECREF(record);
    return failed ? -1 : 0;
}

/* consumer.settle_point: (settle_seq, settle_ts_ns) as new references. */
static int settle_point(PyObject *item_row, PyObject *at, int timed, PyObject **seq, PyObject **ts) {
    if (!at || at == Py_None) {
        *seq = Py_NewRef(Py_None), *ts = Py_NewRef(Py_None);
        return 0;
    }
    int later = PyObject_RichCompareBool(or_none(row_get(at, R_seq)), or_none(row_get(item_row, R_seq)), Py_GE);
    if (later < 0) return -1;
    PyObject *row = later ? at : item_row;
    *seq = Py_NewRef(or_none(row_get(row, R_seq)));
    *ts = Py_NewRef(timed ? or_none(row_get(row, R_ts_ns)) : Py_None);
    return 0;
}

/* settle_ts - row ts (None if either is None). */
static PyObject *latency(PyObject *settle_ts, PyObject *row) {
    if (settle_ts == Py_None) return Py_NewRef(Py_None);
    return PyNumber_Subtract(settle_ts, or_none(row_get(row, R_ts_ns)));
}

/* ConsumerSide._settle, with observed_until None (every settlement this file makes). `frame`:
 * the ack that settles it, or NULL. */
static int settle_delivery(PyObject *life, PyObject *d, PyObject *outcome, PyObject *at, PyObject *frame,
                           PyObject *by_multiple, PyObject *requeue, PyObject *in_tx) {
    PyObject *row = GET(d, DELIVERY_STATE_row), *c = GET(life, LIFE_connection);
    int timed = outcome != strings[S_unknown];   /* never OPEN here */
    PyObject *settle_seq, *settle_ts;
    if (settle_point(row, at, timed, &settle_seq, &settle_ts) < 0) return -1;
    int by_ack = frame != NULL;   /* every frame passed here is a client ack, nack or reject */
    PyObject *lat = latency(settle_ts, row);
    if (!lat) {
        Py_DECREF(settle_seq), Py_DECREF(settle_ts);
        return -1;
    }
    PyObject *values[N_DELIVERY_FIELDS] = {
        Py_NewRef(GET(c, TIMELINE_id)), Py_NewRef(GET(c, TIMELINE_agent_id)), Py_NewRef(GET(life, LIFE_channel)),
        Py_NewRef(GET(life, LIFE_incarnation)),
        Py_NewRef(or_none(row_get(GET(life, LIFE_open_row), R_seq))),
        Py_NewRef(or_none(row_get(row, R_seq))), Py_NewRef(or_none(row_get(row, R_ts_ns))),
        Py_NewRef(or_none(row_get(row, R_method))), Py_NewRef(GET(d, DELIVERY_STATE_tag)),
        Py_NewRef(GET(d, DELIVERY_STATE_consumer_tag)), Py_NewRef(GET(d, DELIVERY_STATE_queue)),
        Py_NewRef(or_none(row_get(row, R_exchange))), Py_NewRef(or_none(row_get(row, R_routing_key))),
        Py_NewRef(or_none(row_get(row, R_message_id))), Py_NewRef(or_none(row_get(row, R_message_identity))),
        Py_NewRef(or_none(row_get(row, R_redelivered))), Py_NewRef(or_none(row_get(row, R_x_death_count))),
        Py_NewRef(GET(d, DELIVERY_STATE_no_ack)), Py_NewRef(GET(d, DELIVERY_STATE_consumer_prefetch)),
        Py_NewRef(GET(d, DELIVERY_STATE_channel_prefetch)), Py_NewRef(outcome),
        Py_NewRef(by_ack ? by_multiple : Py_None),
        Py_NewRef(by_ack ? or_none(row_get(frame, R_delivery_tag)) : Py_None),
        Py_NewRef(requeue), Py_NewRef(in_tx),
        Py_NewRef(frame ? or_none(row_get(frame, R_seq)) : Py_None),
        settle_seq, settle_ts, lat, Py_NewRef(Py_None),
    };
    PyObject *record = make_record(K_DELIVERY, values, F_DELIVERY_connection_id, N_DELIVERY_FIELDS);
    return record ? out(life, record) : -1;
}

/* PublisherSide._emit_publish. */
static int emit_publish(PyObject *life, PyObject *p) {
    PyObject *row = GET(p, PUBLISH_STATE_row), *c = GET(life, LIFE_connection);
    PyObject *settle = GET(p, PUBLISH_STATE_settle), *confirm = GET(p, PUBLISH_STATE_confirm);
    PyObject *settle_seq = Py_None, *settle_ts = Py_None, *confirm_tag = Py_None, *confirm_multiple = Py_None;
    if (PyTuple_CheckExact(settle) && PyTuple_GET_SIZE(settle) == 2)
        settle_seq = PyTuple_GET_ITEM(settle, 0), settle_ts = PyTuple_GET_ITEM(settle, 1);
    if (PyTuple_CheckExact(confirm) && PyTuple_GET_SIZE(confirm) == 2)
        confirm_tag = PyTuple_GET_ITEM(confirm, 0), confirm_multiple = PyTuple_GET_ITEM(confirm, 1);
    PyObject *delivery_mode = row_get(row, R_delivery_mode), *persistent;
    if (delivery_mode && delivery_mode != Py_None)
        persistent = PyObject_RichCompare(delivery_mode, two, Py_EQ);
    else
        persistent = Py_NewRef(or_none(row_get(row, R_body_size)) == Py_None ? Py_None : Py_False);
    if (!persistent) return -1;
    PyObject *returned = GET(p, PUBLISH_STATE_returned);
    int has_return = is_row(returned);
    PyObject *oob = GET(p, PUBLISH_STATE_out_of_order_by), *out_of_order = Py_None;
    if (oob != Py_None) {
        int later = PyObject_RichCompareBool(oob, zero, Py_GT);
        if (later < 0) {
            Py_DECREF(persistent);
            return -1;
        }
        out_of_order = later ? Py_True : Py_False;
    }
    PyObject *lat = latency(settle_ts, row);
    if (!lat) {
        Py_DECREF(persistent);
        return -1;
    }
    PyObject *values[N_PUBLISH_FIELDS] = {
        Py_NewRef(GET(c, TIMELINE_id)), Py_NewRef(GET(c, TIMELINE_agent_id)), Py_NewRef(GET(life, LIFE_channel)),
        Py_NewRef(GET(life, LIFE_incarnation)),
        Py_NewRef(or_none(row_get(GET(life, LIFE_open_row), R_seq))),
        Py_NewRef(or_none(row_get(row, R_seq))), Py_NewRef(or_none(row_get(row, R_ts_ns))),
        Py_NewRef(or_none(row_get(row, R_exchange))), Py_NewRef(or_none(row_get(row, R_routing_key))),
        Py_NewRef(or_none(row_get(row, R_mandatory))), persistent,
        Py_NewRef(or_none(row_get(row, R_message_id))), Py_NewRef(or_none(row_get(row, R_message_identity))),
        Py_NewRef(GET(p, PUBLISH_STATE_mode)), Py_NewRef(GET(p, PUBLISH_STATE_confirm_seq)),
        Py_NewRef(GET(p, PUBLISH_STATE_pending_before)), Py_NewRef(GET(p, PUBLISH_STATE_outcome)),
        Py_NewRef(confirm_tag), Py_NewRef(confirm_multiple), Py_NewRef(out_of_order), Py_NewRef(oob),
        Py_NewRef(has_return ? or_none(row_get(returned, R_reply_code)) : Py_None),
        Py_NewRef(has_return ? or_none(row_get(returned, R_reply_text)) : Py_None),
        Py_NewRef(has_return ? or_none(row_get(returned, R_seq)) : Py_None),
        Py_NewRef(settle_seq), Py_NewRef(settle_ts), lat, Py_NewRef(GET(p, PUBLISH_STATE_observed_until)),
    };
    PyObject *record = make_record(K_PUBLISH, values, F_PUBLISH_connection_id, N_PUBLISH_FIELDS);
    return record ? out(life, record) : -1;
}

/* PublisherSide._finish, timed: the publish's outcome and settle point, and its record unless a
 * basic.return may still name it. */
static int finish_publish(PyObject *life, PyObject *publisher, PyObject *p, PyObject *outcome, PyObject *at) {
    PyObject *row = GET(p, PUBLISH_STATE_row);
    int timed = outcome == strings[S_acked] || outcome == strings[S_nacked];   /* the outcomes given here */
    PyObject *seq, *ts;
    if (settle_point(row, at, timed, &seq, &ts) < 0) return -1;
    PyObject *settle = PyTuple_Pack(2, seq, ts);
    Py_DECREF(seq), Py_DECREF(ts);
    if (!settle) return -1;
    PUT(p, PUBLISH_STATE_outcome, Py_NewRef(outcome));
    PUT(p, PUBLISH_STATE_settle, settle);
    int waiting = PyDict_Contains(GET(publisher, PUBLISHER_awaiting_return), or_none(row_get(row, R_seq)));
    if (waiting < 0) return -1;
    return waiting ? 0 : emit_publish(life, p);
}

/* ---- the transitions -------------------------------------------------------------------------- */

/* The life a channel frame goes to, if the plain path may take it (connection.py's dispatch): the
 * channel's current incarnation, not ended, with no gap since an end. */
static PyObject *plain_life(PyObject *timeline, PyObject *channel) {
    PyObject *life = PyDict_GetItemWithError(GET(timeline, TIMELINE_lives), channel);
    if (!is_a(life, K_LIFE)) return NULL;
    PyObject *ended = GET(life, LIFE_ended), *gap_since_end = GET(life, LIFE_gap_since_end);
    if (!ended || ended != Py_None || gap_since_end != Py_False) return NULL;
    if (!is_a(GET(life, LIFE_consumer), K_CONSUMER) || !is_a(GET(life, LIFE_publisher), K_PUBLISHER) ||
        GET(life, LIFE_connection) != timeline || !is_row(GET(life, LIFE_open_row)))
        return NULL;
    return life;
}

static int empty_list(PyObject *value) { return value && PyList_CheckExact(value) && PyList_GET_SIZE(value) == 0; }
static int empty_dict(PyObject *value) { return value && PyDict_CheckExact(value) && PyDict_GET_SIZE(value) == 0; }

/* The row is taken: ConnectionTimeline.feed's first change, the connection's last row. */
static void taken(PyObject *timeline, PyObject *row) {
    PUT(timeline, TIMELINE_last_seq, Py_NewRef(row_get(row, R_seq)));
    PUT(timeline, TIMELINE_last_ts_ns, Py_NewRef(row_get(row, R_ts_ns)));
}

/* dict.pop(key): a new reference, or NULL with KeyError (or another error). */
static PyObject *pop_item(PyObject *dict, PyObject *key) {
    PyObject *value = PyDict_GetItemWithError(dict, key);
    if (!value) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    Py_INCREF(value);
    if (PyDict_DelItem(dict, key) < 0) Py_CLEAR(value);
    return value;
}

/* The keys of `by_number` (ascending ints) up to `number`, as consumer.up_to: a new list. */
static PyObject *up_to(PyObject *by_number, PyObject *number_obj, long long number) {
    PyObject *found = PyList_New(0), *key, *value;
    Py_ssize_t pos = 0;
    if (!found) return NULL;
    while (PyDict_Next(by_number, &pos, &key, &value)) {
        long long k;
        int le = as_i64(key, &k) ? k <= number : PyObject_RichCompareBool(key, number_obj, Py_LE);
        if (le < 0) {
            Py_DECREF(found);
            return NULL;
        }
        if (!le) break;
        if (PyList_Append(found, key) < 0) {
            Py_DECREF(found);
            return NULL;
        }
    }
    return found;
}

static PyObject *new_int(long long value) { return PyLong_FromLongLong(value); }

/* [item] */
static PyObject *list_of(PyObject *item) {
    PyObject *list = PyList_New(1);
    if (list) PyList_SET_ITEM(list, 0, Py_NewRef(item));
    return list;
}

/* ConsumerSide.deliver for basic.deliver: 1 done, 0 not taken, -1 error. */
static int deliver(PyObject *timeline, PyObject *life, PyObject *row, PyObject *tag_obj, long long tag) {
    PyObject *consumer = GET(life, LIFE_consumer);
    long long max_tag, first_tag;
    if (!as_i64(GET(consumer, CONSUMER_max_tag), &max_tag) || tag <= max_tag) return 0;   /* tag_restart */
    if (!as_i64(GET(consumer, CONSUMER_first_tag), &first_tag) || !empty_list(GET(consumer, CONSUMER_early)))
        return 0;
    PyObject *consumers = GET(consumer, CONSUMER_consumers), *outstanding = GET(consumer, CONSUMER_outstanding);
    if (!PyDict_CheckExact(consumers) || !PyDict_CheckExact(outstanding)) return 0;
    PyObject *consumer_tag = or_none(row_get(row, R_consumer_tag));
    PyObject *entry = PyDict_GetItemWithError(consumers, consumer_tag);
    PyObject *queue = Py_None, *no_ack = Py_None, *prefetch = Py_None;
    if (entry) {
        if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 3) return 0;
        queue = PyTuple_GET_ITEM(entry, 0), no_ack = PyTuple_GET_ITEM(entry, 1), prefetch = PyTuple_GET_ITEM(entry, 2);
    } else if (PyErr_Occurred()) {
        return -1;
    }
    if (no_ack != Py_None && no_ack != Py_True && no_ack != Py_False) return 0;
    long long unacked = 0, peak = 0;
    if (no_ack == Py_False && (!as_i64(GET(consumer, CONSUMER_unacked), &unacked) ||
                               !as_i64(GET(consumer, CONSUMER_peak_unacked), &peak)))
        return 0;
    long long deliveries;
    if (!as_i64(GET(consumer, CONSUMER_deliveries), &deliveries)) return 0;

    taken(timeline, row);   /* then ConsumerSide.deliver */
    PyObject *d = classes[K_DELIVERY_STATE]->tp_alloc(classes[K_DELIVERY_STATE], 0);
    if (!d) return -1;
    GET(d, DELIVERY_STATE_row) = Py_NewRef(row);
    GET(d, DELIVERY_STATE_tag) = Py_NewRef(tag_obj);
    GET(d, DELIVERY_STATE_consumer_tag) = Py_NewRef(consumer_tag);
    GET(d, DELIVERY_STATE_queue) = Py_NewRef(queue);
    GET(d, DELIVERY_STATE_no_ack) = Py_NewRef(no_ack);
    GET(d, DELIVERY_STATE_consumer_prefetch) = Py_NewRef(prefetch);
    GET(d, DELIVERY_STATE_channel_prefetch) = Py_NewRef(GET(consumer, CONSUMER_channel_prefetch));
    int failed = 0;
    PUT(consumer, CONSUMER_deliveries, new_int(deliveries + 1));
    if (!first_tag) PUT(consumer, CONSUMER_first_tag, Py_NewRef(tag_obj));
    PUT(consumer, CONSUMER_max_tag, Py_NewRef(tag_obj));
    if (no_ack == Py_True) {
        failed = settle_delivery(life, d, strings[S_auto_], row, NULL, Py_None, Py_None, Py_None);
    } else {   /* ConsumerSide._put */
        failed = PyDict_SetItem(outstanding, tag_obj, d);
        if (!failed && no_ack == Py_False) {
            unacked += 1;
            PUT(consumer, CONSUMER_unacked, new_int(unacked));
            if (unacked > peak) PUT(consumer, CONSUMER_peak_unacked, new_int(unacked));
        }
    }
    Py_DECREF(d);
    return failed ? -1 : 1;
}

/* ConsumerSide.client_settle for a tag outstanding, outside a transaction: 1, 0 or -1. */
static int client_settle(PyObject *timeline, PyObject *life, PyObject *row, PyObject *method, PyObject *tag_obj,
                         long long tag) {
    PyObject *consumer = GET(life, LIFE_consumer), *publisher = GET(life, LIFE_publisher);
    PyObject *refusing = GET(consumer, CONSUMER_refusing), *in_tx = GET(publisher, PUBLISHER_tx);
    if (refusing != Py_False || (in_tx != Py_None && in_tx != Py_False)) return 0;
    PyObject *outstanding = GET(consumer, CONSUMER_outstanding), *proven = GET(consumer, CONSUMER_proven_manual);
    if (!PyDict_CheckExact(outstanding) || !PyAnySet_CheckExact(proven)) return 0;
    int is_ack = method == strings[S_basic_ack], is_reject = method == strings[S_basic_reject];
    int multiple = is_reject ? 0 : truthy(row_get(row, R_multiple));
    if (multiple < 0) return -1;
    if (multiple && tag == 0) return 0;
    PyObject *exact = PyDict_GetItemWithError(outstanding, tag_obj);
    if (!exact) return PyErr_Occurred() ? -1 : 0;   /* early, double or unknown: the Python way */
    long long unacked;
    if (!as_i64(GET(consumer, CONSUMER_unacked), &unacked)) return 0;
    PyObject *outcome = is_ack ? strings[S_ack] : is_reject ? strings[S_reject] : strings[S_nack];
    PyObject *requeue = is_ack ? Py_None : or_none(row_get(row, R_requeue));
    PyObject *by_multiple = multiple ? Py_True : Py_False;
    PyObject *tags = multiple ? up_to(outstanding, tag_obj, tag) : list_of(tag_obj);
    if (!tags) return -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(tags); i++) {   /* each a delivery of a row */
        PyObject *d = PyDict_GetItemWithError(outstanding, PyList_GET_ITEM(tags, i));
        if (!is_a(d, K_DELIVERY_STATE) || !is_row(GET(d, DELIVERY_STATE_row))) {
            Py_DECREF(tags);
            return PyErr_Occurred() ? -1 : 0;
        }
    }

    taken(timeline, row);
    int failed = 0;
    PyObject *exact_consumer = GET(exact, DELIVERY_STATE_consumer_tag);
    if (exact_consumer != Py_None) failed = PySet_Add(proven, exact_consumer);
    for (Py_ssize_t i = 0; !failed && i < PyList_GET_SIZE(tags); i++) {   /* ConsumerSide._apply */
        PyObject *t = PyList_GET_ITEM(tags, i);
        PyObject *d = pop_item(outstanding, t);   /* ConsumerSide._take */
        if (!d) {
            failed = 1;
            break;
        }
        PyObject *no_ack = GET(d, DELIVERY_STATE_no_ack);
        if (no_ack == Py_False) PUT(consumer, CONSUMER_unacked, new_int(--unacked));
        /* Its consumer's ack mode not known: if auto-ack, a multiple ack never covered it. */
        int unknown = 0;
        if (no_ack == Py_None && PyObject_RichCompareBool(t, tag_obj, Py_NE) == 1) {
            int proven_here = PySet_Contains(proven, GET(d, DELIVERY_STATE_consumer_tag));
            failed = proven_here < 0;
            unknown = proven_here == 0;
        }
        if (!failed)
            failed = settle_delivery(life, d, unknown ? strings[S_unknown] : outcome, row, row, by_multiple, requeue,
                                     unknown ? Py_None : Py_False) < 0;
        Py_DECREF(d);
    }
    Py_DECREF(tags);
    return failed ? -1 : 1;
}

/* PublisherSide.publish, on a channel the broker is not refusing: 1, 0 or -1. */
static int publish(PyObject *timeline, PyObject *life, PyObject *row) {
    PyObject *consumer = GET(life, LIFE_consumer), *publisher = GET(life, LIFE_publisher);
    if (GET(consumer, CONSUMER_refusing) != Py_False) return 0;
    PyObject *tx = GET(publisher, PUBLISHER_tx), *confirm = GET(publisher, PUBLISHER_confirm);
    if ((tx != Py_None && tx != Py_False && tx != Py_True) || (confirm != Py_None && confirm != Py_False &&
                                                                confirm != Py_True))
        return 0;
    PyObject *mode = tx == Py_True ? strings[S_tx] : confirm == Py_True ? strings[S_confirm]
                   : (tx == Py_False && confirm == Py_False) ? strings[S_none] : strings[S_unknown];
    if (mode == strings[S_tx]) return 0;   /* held for the commit: the Python way */
    PyObject *aligned = GET(publisher, PUBLISHER_aligned), *pending = GET(publisher, PUBLISHER_pending);
    PyObject *awaiting = GET(publisher, PUBLISHER_awaiting_return);
    int numbered = mode == strings[S_confirm] && aligned == Py_True;
    if (mode == strings[S_confirm] && aligned != Py_False && !numbered) return 0;
    long long publishes, next_confirm = 0;
    if (!as_i64(GET(publisher, PUBLISHER_publishes), &publishes) || !PyDict_CheckExact(pending) ||
        !PyDict_CheckExact(awaiting))
        return 0;
    if (numbered && (!as_i64(GET(publisher, PUBLISHER_next_confirm), &next_confirm) ||
                     !empty_dict(GET(publisher, PUBLISHER_early_confirms)) ||
                     GET(publisher, PUBLISHER_early_multiple) != Py_None))
        return 0;
    int mandatory = truthy(row_get(row, R_mandatory));
    if (mandatory < 0) return -1;

    taken(timeline, row);
    PyObject *p = classes[K_PUBLISH_STATE]->tp_alloc(classes[K_PUBLISH_STATE], 0);
    if (!p) return -1;
    for (int f = F_PUBLISH_STATE_row; f <= F_PUBLISH_STATE_observed_until; f++)
        *(PyObject **)((char *)p + offsets[f]) = Py_NewRef(Py_None);
    PUT(p, PUBLISH_STATE_row, Py_NewRef(row));
    PUT(p, PUBLISH_STATE_mode, Py_NewRef(mode));
    PUT(publisher, PUBLISHER_publishes, new_int(publishes + 1));
    PUT(publisher, PUBLISHER_answered_select, Py_NewRef(Py_None));
    int failed = mandatory ? PyDict_SetItem(awaiting, row_get(row, R_seq), p) < 0 : 0;
    if (!failed && numbered) {
        PyObject *number = new_int(next_confirm + 1);
        PyObject *before = GET(life, LIFE_gap_seen) == Py_False ? PyLong_FromSsize_t(PyDict_GET_SIZE(pending))
                                                                : Py_NewRef(Py_None);
        failed = !number || !before;
        if (!failed) {
            PUT(publisher, PUBLISHER_next_confirm, Py_NewRef(number));
            PUT(p, PUBLISH_STATE_confirm_seq, Py_NewRef(number));
            PUT(p, PUBLISH_STATE_pending_before, Py_NewRef(before));
            failed = PyDict_SetItem(pending, number, p) < 0;
        }
        Py_XDECREF(number), Py_XDECREF(before);
    } else if (!failed) {   /* _finish(p, UNTRACKED or UNKNOWN, None) */
        PyObject *outcome = mode == strings[S_none] ? strings[S_untracked] : strings[S_unknown];
        PUT(p, PUBLISH_STATE_outcome, Py_NewRef(outcome));
        PyObject *settle = PyTuple_Pack(2, Py_None, Py_None);
        failed = !settle;
        if (!failed) {
            PUT(p, PUBLISH_STATE_settle, settle);
            int waiting = PyDict_Contains(awaiting, row_get(row, R_seq));
            failed = waiting < 0 || (!waiting && emit_publish(life, p) < 0);
        }
    }
    Py_DECREF(p);
    return failed ? -1 : 1;
}

/* PublisherSide.broker_confirm for publishes it numbered and still waits for: 1, 0 or -1. */
static int broker_confirm(PyObject *timeline, PyObject *life, PyObject *row, PyObject *method, PyObject *tag_obj,
                          long long tag) {
    PyObject *publisher = GET(life, LIFE_publisher);
    if (GET(publisher, PUBLISHER_confirm) != Py_True) return 0;   /* None, or a tx channel: the Python way */
    PyObject *pending = GET(publisher, PUBLISHER_pending), *awaiting = GET(publisher, PUBLISHER_awaiting_return);
    if (!PyDict_CheckExact(pending) || !PyDict_CheckExact(awaiting)) return 0;
    int multiple = truthy(row_get(row, R_multiple));
    if (multiple < 0) return -1;
    PyObject *done;
    if (multiple) {
        long long next_confirm;
        if (tag == 0 || (GET(publisher, PUBLISHER_aligned) != Py_False &&
                         (!as_i64(GET(publisher, PUBLISHER_next_confirm), &next_confirm) || tag > next_confirm)))
            return 0;   /* everything, or an early multiple: the Python way */
        done = up_to(pending, tag_obj, tag);
    } else {
        int known = PyDict_Contains(pending, tag_obj);
        if (known <= 0) return known;   /* early or unknown: the Python way */
        done = list_of(tag_obj);
    }
    if (!done) return -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(done); i++) {   /* each a publish of a row */
        PyObject *p = PyDict_GetItemWithError(pending, PyList_GET_ITEM(done, i));
        PyObject *returned = p ? GET(p, PUBLISH_STATE_returned) : NULL;
        if (!is_a(p, K_PUBLISH_STATE) || !is_row(GET(p, PUBLISH_STATE_row)) ||
            !returned || (returned != Py_None && !is_row(returned))) {
            Py_DECREF(done);
            return PyErr_Occurred() ? -1 : 0;
        }
    }
    PyObject *outcome = method == strings[S_basic_ack] ? strings[S_acked] : strings[S_nacked];

    taken(timeline, row);
    PyObject *confirm = PyTuple_Pack(2, tag_obj, multiple ? Py_True : Py_False);
    int failed = !confirm;
    for (Py_ssize_t i = 0; !failed && i < PyList_GET_SIZE(done); i++) {   /* PublisherSide._confirmed */
        PyObject *number = PyList_GET_ITEM(done, i);
        PyObject *p = pop_item(pending, number);
        if (!p) {
            failed = 1;
            break;
        }
        PyObject *oldest = NULL, *value;
        Py_ssize_t pos = 0;
        PyDict_Next(pending, &pos, &oldest, &value);
        /* how far ahead of the oldest publish still waiting */
        int ahead = oldest && !multiple ? PyObject_RichCompareBool(oldest, number, Py_LT) : 0;
        PyObject *by = ahead > 0 ? PyNumber_Subtract(number, oldest) : ahead == 0 ? Py_NewRef(zero) : NULL;
        failed = !by;
        if (!failed) {
            PUT(p, PUBLISH_STATE_out_of_order_by, by);
            PUT(p, PUBLISH_STATE_confirm, Py_NewRef(confirm));
            PyObject *seq = or_none(row_get(GET(p, PUBLISH_STATE_row), R_seq));
            int waiting = PyDict_Contains(awaiting, seq);   /* a return always comes before the confirm */
            failed = waiting < 0 || (waiting && PyDict_DelItem(awaiting, seq) < 0);
        }
        if (!failed) failed = finish_publish(life, publisher, p, outcome, row) < 0;
        Py_DECREF(p);
    }
    Py_XDECREF(confirm);
    Py_DECREF(done);
    return failed ? -1 : 1;
}

/* One row: 1 done here, 0 not taken (nothing changed), -1 error. */
static int feed_row(PyObject *timeline, PyObject *row) {
    if (!configured || !is_a(timeline, K_TIMELINE) || !is_row(row)) return 0;
    /* ConnectionTimeline.feed's checks and dispatch, for a frame on a channel */
    PyObject *seq = row_get(row, R_seq), *ts = row_get(row, R_ts_ns), *method = row_get(row, R_method);
    PyObject *direction = row_get(row, R_direction), *channel = row_get(row, R_channel);
    long long s, t, c, last;
    if (!as_i64(seq, &s) || !as_i64(ts, &t) || !as_i64(channel, &c) || c == 0 || !method || !direction)
        goto not_taken;
    PyObject *last_seq = GET(timeline, TIMELINE_last_seq);
    if (GET(timeline, TIMELINE_finished) != Py_False || !empty_list(GET(timeline, TIMELINE_awaiting_next)) ||
        !last_seq || (last_seq != Py_None && (!as_i64(last_seq, &last) || s <= last)))
        goto not_taken;
    PyObject *malformed = row_get(row, R_malformed);
    if (malformed && malformed != Py_None && malformed != Py_False) goto not_taken;
    PyObject *tag_obj = row_get(row, R_delivery_tag);
    long long tag = 0;
    int has_tag = as_i64(tag_obj, &tag);
    int to_broker = same_str(direction, strings[S_to_broker]);
    if (!to_broker && !same_str(direction, strings[S_to_client])) goto not_taken;
    /* the method as the machine's own string object, so later tests compare identity */
    static const int client_methods[] = {S_basic_ack, S_basic_nack, S_basic_reject, S_basic_publish};
    static const int broker_methods[] = {S_basic_deliver, S_basic_ack, S_basic_nack};
    const int *names = to_broker ? client_methods : broker_methods;
    int n = to_broker ? 4 : 3, which = -1;
    for (int i = 0; i < n && which < 0; i++)
        if (same_str(method, strings[names[i]])) which = names[i];
    if (which < 0) goto not_taken;
    PyObject *life = plain_life(timeline, channel);
    if (!life) goto not_taken;
    PyObject *m = strings[which];
    int done;
    if (which == S_basic_publish)
        done = publish(timeline, life, row);
    else if (!has_tag)
        done = 0;
    else if (!to_broker && which == S_basic_deliver)
        done = deliver(timeline, life, row, tag_obj, tag);
    else if (to_broker)
        done = client_settle(timeline, life, row, m, tag_obj, tag);
    else
        done = broker_confirm(timeline, life, row, m, tag_obj, tag);
    if (done) return done;
not_taken:
    return PyErr_Occurred() ? -1 : 0;
}

/* feed(timeline, row) -> True (the row went through here) or False (nothing changed). */
static PyObject *feed(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "feed(timeline, row)");
        return NULL;
    }
    int done = feed_row(args[0], args[1]);
    if (done < 0) return NULL;
    if (done) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

/* feed_rows(timeline, rows, start, stop[, since_ns]) -> the index of the first row of
 * rows[start:stop] not taken (stop if every one was): `feed` on each row in turn, as long as it
 * takes them and they are the timeline's connection's (a row of another connection stops it,
 * untouched), and, given `since_ns` (an int, or None for no bound), their ts_ns is an int not below
 * it (an older row stops it, untouched: a carried connection's check, carry.ResumedConnection.feed). */
static PyObject *feed_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *since = nargs == 5 && args[4] != Py_None ? args[4] : NULL;
    if ((nargs != 4 && nargs != 5) || !PyList_CheckExact(args[1]) || (since && !PyLong_CheckExact(since))) {
        PyErr_SetString(PyExc_TypeError, "feed_rows(timeline, rows: list, start, stop, since_ns: int | None = None)");
        return NULL;
    }
    PyObject *timeline = args[0], *rows = args[1];
    Py_ssize_t start = PyLong_AsSsize_t(args[2]), stop = PyLong_AsSsize_t(args[3]);
    if ((start == -1 || stop == -1) && PyErr_Occurred()) return NULL;
    if (start < 0) start = 0;
    if (!configured || !is_a(timeline, K_TIMELINE)) return PyLong_FromSsize_t(start);
    PyObject *id = GET(timeline, TIMELINE_id);
    Py_ssize_t at = start;
    for (; at < stop && at < PyList_GET_SIZE(rows); at++) {
        PyObject *row = PyList_GET_ITEM(rows, at);
        if (!is_row(row)) break;
        PyObject *connection_id = row_get(row, R_connection_id);
        if (!connection_id || !id || !PyUnicode_CheckExact(id) || !same_str(connection_id, id)) break;
        if (since) {
            PyObject *ts = row_get(row, R_ts_ns);
            if (!ts || !PyLong_CheckExact(ts)) break;   /* an error (raised below) or a row for Python */
            int older = PyObject_RichCompareBool(ts, since, Py_LT);
            if (older < 0) return NULL;
            if (older) break;
        }
        Py_INCREF(row);   /* the rows list stays the caller's to change (emit runs Python) */
        int done = feed_row(timeline, row);
        Py_DECREF(row);
        if (done < 0) return NULL;
        if (!done) break;
    }
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(at);
}

/* ---- configure -------------------------------------------------------------------------------- */

/* A record class's slots must be exactly the fields this file sets, in the same order. */
static int same_fields(int cls, int first, int n) {
    PyObject *slots = PyDict_GetItemString(classes[cls]->tp_dict, "__slots__");
    if (!slots || !PyTuple_Check(slots) || PyTuple_GET_SIZE(slots) != n) goto differ;
    for (int i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(slots, i);
        if (!PyUnicode_Check(name) || PyUnicode_CompareWithASCIIString(name, field_names[first + i].name) != 0)
            goto differ;
    }
    return 0;
differ:
    PyErr_Format(PyExc_TypeError, "%s's fields are not the ones _plain.c sets: update it", classes[cls]->tp_name);
    return -1;
}

/* configure(classes: dict name -> class, strings: dict name -> str) */
static PyObject *configure(PyObject *module, PyObject *args) {
    PyObject *given_classes, *given_strings;
    if (!PyArg_ParseTuple(args, "O!O!", &PyDict_Type, &given_classes, &PyDict_Type, &given_strings)) return NULL;
    static const char *class_names[N_CLASSES] = {
        "ConnectionTimeline", "ChannelLife", "ConsumerSide", "PublisherSide", "_Delivery", "_Publish", "Delivery",
        "Publish"};
    PyTypeObject *found[N_CLASSES];
    for (int k = 0; k < N_CLASSES; k++) {
        PyObject *cls = PyDict_GetItemString(given_classes, class_names[k]);
        if (!cls || !PyType_Check(cls)) return PyErr_Format(PyExc_TypeError, "configure: no class %s", class_names[k]);
        found[k] = (PyTypeObject *)cls;
    }
    /* The Row type, optional (None where analyzer/_columns.c is not built): laid out as _row.h says. */
    PyObject *row_class = PyDict_GetItemString(given_classes, "Row");
    if (row_class && row_class != Py_None &&
        (!PyType_Check(row_class) || strcmp(((PyTypeObject *)row_class)->tp_name, "analyzer._columns.Row") != 0 ||
         ((PyTypeObject *)row_class)->tp_basicsize != (Py_ssize_t)offsetof(Row, values) ||
         ((PyTypeObject *)row_class)->tp_itemsize != (Py_ssize_t)sizeof(PyObject *)))
        return PyErr_Format(PyExc_TypeError, "configure: Row is not analyzer._columns.Row as _row.h lays it out");
    PyObject *found_strings[N_STRINGS];
    if (named_strings(given_strings, string_names, N_STRINGS, found_strings) < 0) return NULL;
    Py_ssize_t found_offsets[N_FIELDS];
    for (int f = 0; f < N_FIELDS; f++)
        if ((found_offsets[f] = slot_offset(found[field_names[f].cls], field_names[f].name)) < 0) return NULL;
    for (int k = 0; k < N_CLASSES; k++) {
        Py_XSETREF(classes[k], (PyTypeObject *)Py_NewRef(found[k]));
    }
    for (int i = 0; i < N_STRINGS; i++) Py_XSETREF(strings[i], Py_NewRef(found_strings[i]));
    Py_XSETREF(row_type, row_class && row_class != Py_None ? (PyTypeObject *)Py_NewRef(row_class) : NULL);
    Py_CLEAR(known_index);
    memcpy(offsets, found_offsets, sizeof(offsets));
    configured = 0;
    if (same_fields(K_DELIVERY, F_DELIVERY_connection_id, N_DELIVERY_FIELDS) < 0 ||
        same_fields(K_PUBLISH, F_PUBLISH_connection_id, N_PUBLISH_FIELDS) < 0)
        return NULL;
    configured = 1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"feed", (PyCFunction)(void (*)(void))feed, METH_FASTCALL,
     "feed(timeline, row) -> True if the row was a plain frame, done here; False (nothing changed) otherwise."},
    {"feed_rows", (PyCFunction)(void (*)(void))feed_rows, METH_FASTCALL,
     "feed_rows(timeline, rows, start, stop, since_ns=None) -> the index of the first row not taken: feed on each "
     "row of the timeline's connection (and not older than since_ns) in turn, while it takes them."},
    {"configure", configure, METH_VARARGS, "configure(classes, strings): the machine's classes (and Row, if any) and constants."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_plain", NULL, -1, methods};

PyMODINIT_FUNC PyInit__plain(void) {
    static const char *key_names[N_KEYS] = {
        "connection_id", "seq", "ts_ns", "method", "direction", "channel", "malformed", "delivery_tag", "consumer_tag", "multiple",
        "requeue", "mandatory", "exchange", "routing_key", "message_id", "message_identity", "redelivered",
        "x_death_count", "delivery_mode", "body_size", "reply_code", "reply_text"};
    for (int i = 0; i < N_KEYS; i++)
        if (!(keys[i] = PyUnicode_InternFromString(key_names[i]))) return NULL;
    if (!(two = PyLong_FromLong(2)) || !(zero = PyLong_FromLong(0))) return NULL;
    return PyModule_Create(&module);
}
