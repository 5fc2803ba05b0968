/* Arrow columns to and from Python objects, in C (see analyzer/columns.py).
 *
 * The connection pass spends a third of its Python outside the rules: making a row per frame out
 * of each Arrow batch, and reading every record's fields back into Arrow columns. These two loops
 * do the same conversions as pyarrow's `to_pylist` + `dict(zip(...))` and `pa.array(...)`, without
 * a Python list per column in between, each row a `Row` (analyzer/_row.h) equal to the dict
 * `to_pylist` gives. They take only what they know exactly (the plain
 * Arrow layouts of the frames' columns; exact int, bool and str values in a record's slots) and
 * otherwise say "not taken" (None), so that the caller does the general conversion, which stays
 * the reference (tests/test_columns.py compares the two). Every read is bounds-checked against the
 * buffers: a buffer shorter than its column claims is a ValueError, never a read past its end.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#include "_row.h"

/* Column kinds, as columns.py names them. */
enum { K_INT64, K_INT32, K_INT16, K_INT8, K_BOOL, K_UTF8, K_LARGE_UTF8, K_NULL, K_BINARY, K_LARGE_BINARY, K_COUNT };
static const int WIDTH[K_COUNT] = {8, 4, 2, 1, 0, 4, 8, 0, 4, 8};

/* Columns of values between offsets: str, or bytes (the carried pass's checkpoints). */
static inline int has_offsets(int kind) {
    return kind == K_UTF8 || kind == K_LARGE_UTF8 || kind == K_BINARY || kind == K_LARGE_BINARY;
}

static inline int bit(const uint8_t *bits, Py_ssize_t i) { return (bits[i >> 3] >> (i & 7)) & 1; }

/* ---- Arrow batch -> row dicts ------------------------------------------------------------------ */

typedef struct {
    int kind;
    Py_ssize_t offset;                 /* the array's offset into its buffers */
    Py_buffer validity, data, offsets; /* .obj NULL when absent */
    PyObject *last;                    /* strings: the previous row's value, reused while equal */
    const char *last_ptr;
    Py_ssize_t last_len;
} Column;

static void column_release(Column *c) {
    if (c->validity.obj) PyBuffer_Release(&c->validity);
    if (c->data.obj) PyBuffer_Release(&c->data);
    if (c->offsets.obj) PyBuffer_Release(&c->offsets);
    Py_CLEAR(c->last);
}

static int get_buffer(PyObject *obj, Py_buffer *view) {
    if (obj == Py_None) return 0;
    return PyObject_GetBuffer(obj, view, PyBUF_SIMPLE);
}

static int too_short(const char *what, Py_ssize_t have, Py_ssize_t need) {
    PyErr_Format(PyExc_ValueError, "%s buffer holds %zd bytes, the column needs %zd", what, have, need);
    return -1;
}

/* Checks the buffers against `length` rows from the column's offset. */
static int column_open(Column *c, PyObject *spec, Py_ssize_t length) {
    PyObject *validity, *data, *offsets;
    if (!PyArg_ParseTuple(spec, "inOOO", &c->kind, &c->offset, &validity, &data, &offsets)) return -1;
    if (c->kind < 0 || c->kind >= K_COUNT || c->offset < 0) {
        PyErr_SetString(PyExc_ValueError, "unknown column kind or negative offset");
        return -1;
    }
    if (get_buffer(validity, &c->validity) < 0 || get_buffer(data, &c->data) < 0 || get_buffer(offsets, &c->offsets) < 0)
        return -1;
    Py_ssize_t end = c->offset + length;
    if (c->validity.obj && c->validity.len < (end + 7) / 8) return too_short("validity", c->validity.len, (end + 7) / 8);
    if (c->kind == K_NULL) return 0;
    if (!c->data.obj) {
        PyErr_SetString(PyExc_ValueError, "a column without its data buffer");
        return -1;
    }
    if (c->kind == K_BOOL) return c->data.len < (end + 7) / 8 ? too_short("data", c->data.len, (end + 7) / 8) : 0;
    if (has_offsets(c->kind)) {
        Py_ssize_t need = (end + 1) * WIDTH[c->kind];
        if (!c->offsets.obj) {
            PyErr_SetString(PyExc_ValueError, "a string or binary column without its offsets buffer");
            return -1;
        }
        return c->offsets.len < need ? too_short("offsets", c->offsets.len, need) : 0;
    }
    return c->data.len < end * WIDTH[c->kind] ? too_short("data", c->data.len, end * WIDTH[c->kind]) : 0;
}

static PyObject *string_at(Column *c, Py_ssize_t i) {
    int64_t start, stop;
    if (WIDTH[c->kind] == 4) {
        const int32_t *o = (const int32_t *)c->offsets.buf;
        start = o[i], stop = o[i + 1];
    } else {
        const int64_t *o = (const int64_t *)c->offsets.buf;
        start = o[i], stop = o[i + 1];
    }
    if (start < 0 || stop < start || stop > c->data.len) {
        PyErr_Format(PyExc_ValueError, "string offsets %lld..%lld outside a data buffer of %zd bytes",
                     (long long)start, (long long)stop, c->data.len);
        return NULL;
    }
    const char *p = (const char *)c->data.buf + start;
    Py_ssize_t n = (Py_ssize_t)(stop - start);
    /* Runs of one value (a connection's id, a method, a direction) share one str object. */
    if (c->last && n == c->last_len && memcmp(p, c->last_ptr, (size_t)n) == 0) {
        Py_INCREF(c->last);
        return c->last;
    }
    PyObject *s = c->kind == K_BINARY || c->kind == K_LARGE_BINARY ? PyBytes_FromStringAndSize(p, n)
                                                                    : PyUnicode_DecodeUTF8(p, n, "strict");
    if (!s) return NULL;
    Py_XSETREF(c->last, Py_NewRef(s));
    c->last_ptr = p, c->last_len = n;
    return s;
}

static PyObject *value_at(Column *c, Py_ssize_t row) {
    Py_ssize_t i = c->offset + row;
    if (c->kind == K_NULL || (c->validity.obj && !bit(c->validity.buf, i))) Py_RETURN_NONE;
    const void *d = c->data.buf;
    switch (c->kind) {
    case K_INT64: return PyLong_FromLongLong(((const int64_t *)d)[i]);
    case K_INT32: return PyLong_FromLong(((const int32_t *)d)[i]);
    case K_INT16: return PyLong_FromLong(((const int16_t *)d)[i]);
    case K_INT8: return PyLong_FromLong(((const int8_t *)d)[i]);
    case K_BOOL: return PyBool_FromLong(bit(d, i));
    default: return string_at(c, i);
    }
}

/* ---- the row: a read-only Mapping of a batch's columns (analyzer/_row.h) -------------------- */

static void row_dealloc(PyObject *self) {
    Row *row = (Row *)self;
    for (Py_ssize_t i = 0; i < Py_SIZE(row); i++) Py_XDECREF(row->values[i]);
    Py_XDECREF(row->names);
    Py_XDECREF(row->index);
    Py_TYPE(self)->tp_free(self);
}

/* The position of `key`, -1 if it is not a column (with an error only if the lookup failed). */
static Py_ssize_t row_position(PyObject *self, PyObject *key) {
    PyObject *at = PyDict_GetItemWithError(((Row *)self)->index, key);
    return at ? PyLong_AsSsize_t(at) : -1;
}

static Py_ssize_t row_length(PyObject *self) { return Py_SIZE(self); }

static PyObject *row_subscript(PyObject *self, PyObject *key) {
    Py_ssize_t i = row_position(self, key);
    if (i < 0) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    return Py_NewRef(row_at(self, i));
}

static int row_contains(PyObject *self, PyObject *key) { return PyDict_Contains(((Row *)self)->index, key); }

static PyObject *row_iter(PyObject *self) { return PyObject_GetIter(((Row *)self)->names); }

/* dict(row): a new dict of every column, in order. */
static PyObject *row_dict(PyObject *self) {
    Row *row = (Row *)self;
    PyObject *dict = _PyDict_NewPresized(Py_SIZE(row));
    for (Py_ssize_t i = 0; dict && i < Py_SIZE(row); i++)
        if (PyDict_SetItem(dict, PyTuple_GET_ITEM(row->names, i), row_at(self, i)) < 0) Py_CLEAR(dict);
    return dict;
}

static PyObject *row_get_method(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(key, default=None)");
        return NULL;
    }
    Py_ssize_t i = row_position(self, args[0]);
    if (i < 0) return PyErr_Occurred() ? NULL : Py_NewRef(nargs == 2 ? args[1] : Py_None);
    return Py_NewRef(row_at(self, i));
}

static PyObject *row_keys(PyObject *self, PyObject *unused) {
    return PyObject_CallMethod(((Row *)self)->index, "keys", NULL);
}

static PyObject *row_values(PyObject *self, PyObject *unused) {
    PyObject *list = PyList_New(Py_SIZE(self));
    for (Py_ssize_t i = 0; list && i < Py_SIZE(self); i++) PyList_SET_ITEM(list, i, Py_NewRef(row_at(self, i)));
    return list;
}

static PyObject *row_items(PyObject *self, PyObject *unused) {
    PyObject *list = PyList_New(Py_SIZE(self));
    for (Py_ssize_t i = 0; list && i < Py_SIZE(self); i++) {
        PyObject *item = PyTuple_Pack(2, PyTuple_GET_ITEM(((Row *)self)->names, i), row_at(self, i));
        if (!item) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

static PyObject *row_copy(PyObject *self, PyObject *unused) { return row_dict(self); }

static PyObject *row_deepcopy(PyObject *self, PyObject *memo) { return row_dict(self); }  /* values are atomic */

static PyTypeObject RowType;

/* Equal to a dict (or a row) of the same keys and values, as a dict would be. */
static PyObject *row_richcompare(PyObject *self, PyObject *other, int op) {
    if ((op != Py_EQ && op != Py_NE) || !(PyDict_Check(other) || Py_IS_TYPE(other, &RowType)))
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *mine = row_dict(self), *theirs = Py_IS_TYPE(other, &RowType) ? row_dict(other) : Py_NewRef(other);
    PyObject *result = mine && theirs ? PyObject_RichCompare(mine, theirs, op) : NULL;
    Py_XDECREF(mine);
    Py_XDECREF(theirs);
    return result;
}

static PyObject *row_repr(PyObject *self) {
    PyObject *dict = row_dict(self);
    if (!dict) return NULL;
    PyObject *text = PyUnicode_FromFormat("Row(%R)", dict);
    Py_DECREF(dict);
    return text;
}

static PyMappingMethods row_as_mapping = {row_length, row_subscript, NULL};
static PySequenceMethods row_as_sequence = {.sq_contains = row_contains};

static PyMethodDef row_methods[] = {
    {"get", (PyCFunction)(void (*)(void))row_get_method, METH_FASTCALL, "get(key, default=None), as dict.get"},
    {"keys", row_keys, METH_NOARGS, "the column names, in order"},
    {"values", row_values, METH_NOARGS, "the values, in column order"},
    {"items", row_items, METH_NOARGS, "(name, value) pairs, in column order"},
    {"copy", row_copy, METH_NOARGS, "a dict of the row"},
    {"__copy__", row_copy, METH_NOARGS, "a dict of the row"},
    {"__deepcopy__", row_deepcopy, METH_O, "a dict of the row"},
    {NULL, NULL, 0, NULL},
};

/* Not GC-tracked: it holds only ints, bools, strs and the batch's shared names (a tuple of str
 * and a dict of str to int), so it can never be part of a reference cycle. No constructor: only
 * `rows` makes them, which is what keeps that true. */
static PyTypeObject RowType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "analyzer._columns.Row",
    .tp_basicsize = offsetof(Row, values),
    .tp_itemsize = sizeof(PyObject *),
    .tp_dealloc = row_dealloc,
    .tp_repr = row_repr,
    .tp_as_sequence = &row_as_sequence,
    .tp_as_mapping = &row_as_mapping,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_MAPPING,
    .tp_doc = "A frame row of an Arrow batch: a read-only mapping of every column to its value (None for a null).",
    .tp_richcompare = row_richcompare,
    .tp_iter = row_iter,
    .tp_methods = row_methods,
};

/* The names and index of the last batch, shared by every batch of the same columns: the rows of a
 * connection's batches then have one index, which _plain.c looks up once, not at every switch
 * between a stored row of an earlier batch and the current one. */
static PyObject *last_names, *last_index;

/* `*names` (interned str): the shared tuple if equal to it, and its index (new references). */
static int shared_names(PyObject **names, PyObject **index) {
    int same = last_names ? PyObject_RichCompareBool(*names, last_names, Py_EQ) : 0;
    if (same < 0) return -1;
    if (!same) {
        PyObject *made = _PyDict_NewPresized(PyTuple_GET_SIZE(*names));
        for (Py_ssize_t k = 0; made && k < PyTuple_GET_SIZE(*names); k++) {
            PyObject *at = PyLong_FromSsize_t(k);
            if (!at || PyDict_SetItem(made, PyTuple_GET_ITEM(*names, k), at) < 0) Py_CLEAR(made);
            Py_XDECREF(at);
        }
        if (!made) return -1;
        Py_XSETREF(last_index, made);
        Py_XSETREF(last_names, Py_NewRef(*names));
    }
    Py_SETREF(*names, Py_NewRef(last_names));
    *index = Py_NewRef(last_index);
    return 0;
}

/* rows(names, columns, length) -> [Row]: row i maps names[k] to column k's value i.
 * columns[k] = (kind, offset, validity, data, offsets), buffers as pyarrow gives them (or None). */
static PyObject *rows(PyObject *self, PyObject *args) {
    PyObject *names, *specs;
    Py_ssize_t length;
    if (!PyArg_ParseTuple(args, "O!O!n", &PyTuple_Type, &names, &PyTuple_Type, &specs, &length)) return NULL;
    Py_ssize_t width = PyTuple_GET_SIZE(names);
    if (PyTuple_GET_SIZE(specs) != width || length < 0) {
        PyErr_SetString(PyExc_ValueError, "one column per name, and a length of at least 0");
        return NULL;
    }
    PyObject *out = NULL, *index = NULL, *keys = PyTuple_New(width);
    Column *columns = PyMem_Calloc((size_t)(width ? width : 1), sizeof(Column));
    if (!keys || !columns) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < width; k++) {
        PyObject *key = PyTuple_GET_ITEM(names, k);
        if (!PyUnicode_CheckExact(key)) {
            PyErr_SetString(PyExc_TypeError, "column names must be str");
            goto done;
        }
        Py_INCREF(key);
        PyUnicode_InternInPlace(&key);  /* the rules' literal keys find it by identity */
        PyTuple_SET_ITEM(keys, k, key);
        if (column_open(&columns[k], PyTuple_GET_ITEM(specs, k), length) < 0) goto done;
    }
    if (shared_names(&keys, &index) < 0) goto done;
    out = PyList_New(length);
    if (!out) goto done;
    for (Py_ssize_t row = 0; row < length; row++) {
        Row *r = PyObject_NewVar(Row, &RowType, width);
        if (!r) goto fail;
        r->names = Py_NewRef(keys), r->index = Py_NewRef(index);
        memset(r->values, 0, (size_t)width * sizeof(PyObject *));
        PyList_SET_ITEM(out, row, (PyObject *)r);
        for (Py_ssize_t k = 0; k < width; k++) {   /* most of a frame's columns are null: left NULL */
            PyObject *value = value_at(&columns[k], row);
            if (!value) goto fail;
            if (value == Py_None) Py_DECREF(value);
            else r->values[k] = value;
        }
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    if (columns)
        for (Py_ssize_t k = 0; k < width; k++) column_release(&columns[k]);
    PyMem_Free(columns);
    Py_XDECREF(index);
    Py_XDECREF(keys);
    return out;
}

/* ---- records -> Arrow buffers ----------------------------------------------------------------- */

/* A growable byte buffer, handed over as bytes. */
typedef struct { char *data; Py_ssize_t len, cap; } Bytes;

static int bytes_reserve(Bytes *b, Py_ssize_t more) {
    if (b->len + more <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + more) cap *= 2;
    char *p = PyMem_Realloc(b->data, (size_t)cap);
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = p, b->cap = cap;
    return 0;
}

static PyObject *bytes_copy(Bytes *b) { return PyBytes_FromStringAndSize(b->data ? b->data : "", b->len); }

/* (validity bytes or None, data bytes, offsets bytes or None, null count): one column's buffers as
 * record_column and RecordColumns.take hand them (copies: the caller keeps or frees its own).
 * Validity only with nulls; `offsets` NULL for a column without. */
static PyObject *column_buffers(Bytes *validity, Bytes *data, Bytes *offsets, Py_ssize_t nulls) {
    PyObject *v = nulls ? bytes_copy(validity) : Py_NewRef(Py_None);
    PyObject *d = bytes_copy(data);
    PyObject *o = offsets ? bytes_copy(offsets) : Py_NewRef(Py_None);
    PyObject *out = v && d && o ? Py_BuildValue("(OOOn)", v, d, o, nulls) : NULL;
    Py_XDECREF(v);
    Py_XDECREF(d);
    Py_XDECREF(o);
    return out;
}

/* record_column(items, slot, kind) -> (validity bytes or None, data bytes, offsets bytes or None,
 * null count), or None when it does not take them: an item not of the slot's class, an unset slot,
 * a value other than an exact int (in range), bool or str for its kind. `slot`: the member
 * descriptor of a __slots__ field (Class.__dict__[name]). kind: int64, int32, bool or utf8. */
static PyObject *record_column(PyObject *self, PyObject *args) {
    PyObject *items, *slot;
    int kind;
    if (!PyArg_ParseTuple(args, "O!Oi", &PyList_Type, &items, &slot, &kind)) return NULL;
    if (!Py_IS_TYPE(slot, &PyMemberDescr_Type) || !(kind == K_INT64 || kind == K_INT32 || kind == K_BOOL || kind == K_UTF8))
        Py_RETURN_NONE;
    PyMemberDef *member = ((PyMemberDescrObject *)slot)->d_member;
    PyTypeObject *owner = PyDescr_TYPE(slot);
    if (member->type != T_OBJECT_EX) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(items), nulls = 0, at = member->offset;
    Bytes validity = {0}, data = {0}, offsets = {0};
    int taken = 0;
    if (bytes_reserve(&validity, (n + 7) / 8) < 0) goto done;
    memset(validity.data, 0, (size_t)((n + 7) / 8));
    validity.len = (n + 7) / 8;
    if (kind == K_BOOL) {
        if (bytes_reserve(&data, (n + 7) / 8) < 0) goto done;
        memset(data.data, 0, (size_t)((n + 7) / 8));
        data.len = (n + 7) / 8;
    } else if (kind == K_UTF8) {
        if (bytes_reserve(&offsets, (n + 1) * 4) < 0) goto done;
        memset(offsets.data, 0, 4);
        offsets.len = (n + 1) * 4;
    } else if (bytes_reserve(&data, n * WIDTH[kind]) < 0) {
        goto done;
    } else {
        data.len = n * WIDTH[kind];
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (Py_TYPE(item) != owner) goto done;
        PyObject *value = *(PyObject **)((char *)item + at);
        if (!value) goto done;  /* an unset slot: the general path raises its AttributeError */
        int present = value != Py_None;
        if (present) validity.data[i >> 3] |= (char)(1 << (i & 7));
        else nulls++;
        if (kind == K_UTF8) {
            if (present) {
                Py_ssize_t len;
                const char *s;
                if (!PyUnicode_CheckExact(value) || !(s = PyUnicode_AsUTF8AndSize(value, &len))) {
                    PyErr_Clear();  /* not a str, or one that is not valid UTF-8 (surrogates) */
                    goto done;
                }
                if (len > INT32_MAX - data.len || bytes_reserve(&data, len) < 0) {
                    PyErr_Clear();  /* over 2 GiB of text: the general path knows what to do */
                    goto done;
                }
                memcpy(data.data + data.len, s, (size_t)len);
                data.len += len;
            }
            int32_t end = (int32_t)data.len;
            memcpy(offsets.data + (i + 1) * 4, &end, 4);
        } else if (kind == K_BOOL) {
            if (present && value != Py_True && value != Py_False) goto done;
            if (value == Py_True) data.data[i >> 3] |= (char)(1 << (i & 7));
        } else {
            long long v = 0;
            if (present) {
                int overflow;
                if (!PyLong_CheckExact(value)) goto done;
                v = PyLong_AsLongLongAndOverflow(value, &overflow);
                if (overflow || (kind == K_INT32 && (v < INT32_MIN || v > INT32_MAX))) goto done;
            }
            if (kind == K_INT64) {
                int64_t x = v;
                memcpy(data.data + i * 8, &x, 8);
            } else {
                int32_t x = (int32_t)v;
                memcpy(data.data + i * 4, &x, 4);
            }
        }
    }
    taken = 1;
done:;
    PyObject *out = NULL;
    if (taken && !PyErr_Occurred()) out = column_buffers(&validity, &data, kind == K_UTF8 ? &offsets : NULL, nulls);
    PyMem_Free(validity.data);
    PyMem_Free(data.data);
    PyMem_Free(offsets.data);
    if (out || PyErr_Occurred()) return out;
    Py_RETURN_NONE;
}

/* ---- records -> Arrow buffers, as they come ------------------------------------------------------ */

/* One column being built: the slot it reads, its kind, its buffers so far. */
typedef struct {
    Py_ssize_t at;                     /* the slot's offset in the record */
    int kind;                          /* K_INT64, K_INT32, K_BOOL or K_UTF8 */
    Bytes validity, data, offsets;
    Py_ssize_t nulls;
} Built;

/* The columns of one record class. */
typedef struct {
    PyTypeObject *type;
    Py_ssize_t width, rows;
    Built *columns;
} Layout;

/* RecordColumns(layouts, counted=None, predicate=None): see `append` and `take`. */
typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    Layout *layouts;
    PyObject *declined;                /* records it could not take, in their order: a list */
    PyObject *counted, *predicate;     /* records of class `counted` for which predicate(record) is true */
    Py_ssize_t count;
} RecordColumns;

static void built_free(Built *c) {
    PyMem_Free(c->validity.data);
    PyMem_Free(c->data.data);
    PyMem_Free(c->offsets.data);
    c->validity = c->data = c->offsets = (Bytes){0};
    c->nulls = 0;
}

/* A str's UTF-8 bytes, borrowed: 1, or 0 for another value or one that is not valid UTF-8 (surrogates).
 * An ASCII str is its own UTF-8 (most of a record's strings): no call for those. */
static inline int utf8_of(PyObject *value, const char **s, Py_ssize_t *len) {
    if (!PyUnicode_CheckExact(value)) return 0;
    if (PyUnicode_IS_COMPACT_ASCII(value)) {
        *s = PyUnicode_DATA(value);
        *len = PyUnicode_GET_LENGTH(value);
        return 1;
    }
    *s = PyUnicode_AsUTF8AndSize(value, len);
    if (!*s) PyErr_Clear();
    return *s != NULL;
}

/* An exact int's value: 1, or 0 for another value or one past 64 bits. Small ints (one digit: most
 * of a record's counters, tags and seqs) are read in place. */
static inline int int_of(PyObject *value, long long *v) {
    if (!PyLong_CheckExact(value)) return 0;
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)value)) {
        *v = (long long)PyUnstable_Long_CompactValue((PyLongObject *)value);
        return 1;
    }
#else
    Py_ssize_t size = Py_SIZE(value);
    if (size >= -1 && size <= 1) {
        *v = size * (long long)((PyLongObject *)value)->ob_digit[0];
        return 1;
    }
#endif
    int overflow;
    *v = PyLong_AsLongLongAndOverflow(value, &overflow);
    return !overflow;
}

/* A string column's first offset (0), before any row: 0, -1 error. */
static int offsets_started(Built *c) {
    if (c->offsets.len) return 0;
    if (bytes_reserve(&c->offsets, 4) < 0) return -1;
    memset(c->offsets.data, 0, 4);
    c->offsets.len = 4;
    return 0;
}

/* Room for 1024 more rows of every fixed-width part of the layout's columns (string columns
 * started): 0, -1 error. */
static int reserve_rows(Layout *layout) {
    for (Py_ssize_t k = 0; k < layout->width; k++) {
        Built *c = &layout->columns[k];
        if (bytes_reserve(&c->validity, 128) < 0) return -1;
        if (c->kind == K_UTF8 ? offsets_started(c) < 0 || bytes_reserve(&c->offsets, 4 * 1024) < 0 :
            bytes_reserve(&c->data, c->kind == K_BOOL ? 128 : 1024 * WIDTH[c->kind]) < 0)
            return -1;
    }
    return 0;
}

/* Row `i` of a column taken back (record_columns_append's undo): the buffers as before it. */
static void unappend(Built *c, Py_ssize_t i, PyObject *value) {
    int first_of_byte = (i & 7) == 0;
    c->validity.data[i >> 3] &= (char)~(1 << (i & 7));
    c->validity.len -= first_of_byte;
    c->nulls -= value == Py_None;
    if (c->kind == K_UTF8) {
        c->offsets.len -= 4;
        int32_t end;
        memcpy(&end, c->offsets.data + c->offsets.len - 4, 4);
        c->data.len = end;
    } else if (c->kind == K_BOOL) {
        c->data.data[i >> 3] &= (char)~(1 << (i & 7));
        c->data.len -= first_of_byte;
    } else {
        c->data.len -= WIDTH[c->kind];
    }
}

/* The record's values appended as row `layout->rows`, each as record_column would take it: 1; 0 when
 * one is not (an unset slot, a value its kind does not write as it is), the columns left as they
 * were; -1 error (MemoryError), the columns as they were too. */
static int append_row(Layout *layout, PyObject *record) {
    Py_ssize_t i = layout->rows, k;
    int failed = 0;
    if ((i & 1023) == 0 && reserve_rows(layout) < 0) return -1;
    int first_of_byte = (i & 7) == 0;
    char mask = (char)(1 << (i & 7));
    for (k = 0; k < layout->width; k++) {
        Built *c = &layout->columns[k];
        PyObject *value = *(PyObject **)((char *)record + c->at);
        if (!value) goto undo;  /* an unset slot: the general path raises its AttributeError */
        int present = value != Py_None;
        /* Read and checked before anything of this column is written: an undo covers columns 0..k-1. */
        const char *s = NULL;
        Py_ssize_t len = 0;
        long long v = 0;
        if (present) {
            switch (c->kind) {
            case K_UTF8:
                if (!utf8_of(value, &s, &len) || len > INT32_MAX - c->data.len) goto undo;
                if (bytes_reserve(&c->data, len) < 0) {
                    failed = 1;
                    goto undo;
                }
                break;
            case K_BOOL:
                if (value != Py_True && value != Py_False) goto undo;
                break;
            default:
                if (!int_of(value, &v) || (c->kind == K_INT32 && (v < INT32_MIN || v > INT32_MAX))) goto undo;
            }
        }
        if (first_of_byte) c->validity.data[c->validity.len++] = 0;
        if (present) c->validity.data[i >> 3] |= mask;
        else c->nulls++;
        switch (c->kind) {
        case K_UTF8: {
            memcpy(c->data.data + c->data.len, s, (size_t)len);
            c->data.len += len;
            int32_t end = (int32_t)c->data.len;
            memcpy(c->offsets.data + c->offsets.len, &end, 4);
            c->offsets.len += 4;
            break;
        }
        case K_BOOL:
            if (first_of_byte) c->data.data[c->data.len++] = 0;
            if (value == Py_True) c->data.data[i >> 3] |= mask;
            break;
        case K_INT64: {
            int64_t x = v;
            memcpy(c->data.data + c->data.len, &x, 8);
            c->data.len += 8;
            break;
        }
        default: {
            int32_t x = (int32_t)v;
            memcpy(c->data.data + c->data.len, &x, 4);
            c->data.len += 4;
        }
        }
    }
    layout->rows = i + 1;
    return 1;
undo:
    while (k-- > 0) unappend(&layout->columns[k], i, *(PyObject **)((char *)record + layout->columns[k].at));
    return failed ? -1 : 0;
}

/* append(record): its fields appended to its class's columns, or the record kept among the
 * declined (another class, or a value its column's kind does not write as it is); counted if it
 * is of the counted class and the predicate says so. The record itself is not kept. */
static PyObject *record_columns_append(RecordColumns *self, PyObject *record) {
    if (!self->declined) return PyErr_Format(PyExc_ValueError, "RecordColumns: cleared");
    Layout *layout = NULL;
    for (Py_ssize_t j = 0; j < self->n; j++)
        if (Py_TYPE(record) == self->layouts[j].type) {
            layout = &self->layouts[j];
            break;
        }
    int taken = layout ? append_row(layout, record) : 0;
    if (taken < 0 || (!taken && PyList_Append(self->declined, record) < 0)) return NULL;
    if (self->predicate != Py_None && (PyObject *)Py_TYPE(record) == self->counted) {
        PyObject *answer = PyObject_CallOneArg(self->predicate, record);
        if (!answer) return NULL;
        int yes = PyObject_IsTrue(answer);
        Py_DECREF(answer);
        if (yes < 0) return NULL;
        self->count += yes;
    }
    Py_RETURN_NONE;
}

/* One column's buffers (column_buffers), its rows then dropped. */
static PyObject *built_take(Built *c) {
    if (c->kind == K_UTF8 && offsets_started(c) < 0) return NULL;  /* no row yet: one offset, 0 */
    PyObject *out = column_buffers(&c->validity, &c->data, c->kind == K_UTF8 ? &c->offsets : NULL, c->nulls);
    /* The buffers are kept for the next rows: grown once, not again from nothing after every take
     * (and their pages touched again: most of the appends' time, measured with perf). */
    c->validity.len = c->data.len = c->offsets.len = 0;
    c->nulls = 0;
    return out;
}

/* take() -> (((rows, (column, ...)), ...) per layout, declined records, count): everything gathered
 * since the last take, handed over; the builder starts anew. */
static PyObject *record_columns_take(RecordColumns *self, PyObject *unused) {
    if (!self->declined) return PyErr_Format(PyExc_ValueError, "RecordColumns: cleared");
    PyObject *layouts = PyTuple_New(self->n), *declined = PyList_New(0), *out = NULL;
    if (!layouts || !declined) goto done;
    for (Py_ssize_t j = 0; j < self->n; j++) {
        Layout *layout = &self->layouts[j];
        PyObject *columns = PyTuple_New(layout->width);
        if (!columns) goto done;
        for (Py_ssize_t k = 0; k < layout->width; k++) {
            PyObject *column = built_take(&layout->columns[k]);
            if (!column) {
                Py_DECREF(columns);
                goto done;
            }
            PyTuple_SET_ITEM(columns, k, column);
        }
        PyObject *entry = Py_BuildValue("(nN)", layout->rows, columns);
        if (!entry) goto done;
        PyTuple_SET_ITEM(layouts, j, entry);
        layout->rows = 0;
    }
    out = Py_BuildValue("(NOn)", layouts, self->declined, self->count);
    layouts = NULL;
    if (out) {
        Py_SETREF(self->declined, declined);
        declined = NULL;
        self->count = 0;
    }
done:
    Py_XDECREF(layouts);
    Py_XDECREF(declined);
    return out;
}

static Py_ssize_t record_columns_len(RecordColumns *self) {
    Py_ssize_t n = self->declined ? PyList_GET_SIZE(self->declined) : 0;
    for (Py_ssize_t j = 0; j < self->n; j++) n += self->layouts[j].rows;
    return n;
}

static int record_columns_traverse(RecordColumns *self, visitproc visit, void *arg) {
    Py_VISIT(self->declined);
    Py_VISIT(self->counted);
    Py_VISIT(self->predicate);
    for (Py_ssize_t j = 0; j < self->n; j++) Py_VISIT(self->layouts[j].type);
    return 0;
}

static int record_columns_clear(RecordColumns *self) {
    Py_CLEAR(self->declined);
    Py_CLEAR(self->counted);
    Py_CLEAR(self->predicate);
    return 0;
}

static void record_columns_dealloc(RecordColumns *self) {
    PyObject_GC_UnTrack(self);
    record_columns_clear(self);
    for (Py_ssize_t j = 0; j < self->n; j++) {
        Layout *layout = &self->layouts[j];
        for (Py_ssize_t k = 0; k < layout->width; k++) built_free(&layout->columns[k]);
        PyMem_Free(layout->columns);
        Py_XDECREF(layout->type);
    }
    PyMem_Free(self->layouts);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* One layout from (class, ((slot, kind), ...)): each slot a __slots__ member of exactly that class. */
static int layout_open(Layout *layout, PyObject *spec) {
    PyObject *type, *fields;
    if (!PyArg_ParseTuple(spec, "O!O!", &PyType_Type, &type, &PyTuple_Type, &fields)) return -1;
    layout->type = (PyTypeObject *)Py_NewRef(type);
    layout->width = PyTuple_GET_SIZE(fields);
    layout->columns = PyMem_Calloc((size_t)(layout->width ? layout->width : 1), sizeof(Built));
    if (!layout->columns) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < layout->width; k++) {
        PyObject *slot;
        int kind;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(fields, k), "Oi", &slot, &kind)) return -1;
        if (!Py_IS_TYPE(slot, &PyMemberDescr_Type) || PyDescr_TYPE(slot) != layout->type ||
            ((PyMemberDescrObject *)slot)->d_member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "RecordColumns: field %zd of %s is not one of its __slots__", k,
                         layout->type->tp_name);
            return -1;
        }
        if (!(kind == K_INT64 || kind == K_INT32 || kind == K_BOOL || kind == K_UTF8)) {
            PyErr_Format(PyExc_ValueError, "RecordColumns: kind %d is not one it writes", kind);
            return -1;
        }
        layout->columns[k].at = ((PyMemberDescrObject *)slot)->d_member->offset;
        layout->columns[k].kind = kind;
    }
    return 0;
}

static PyObject *record_columns_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"layouts", "counted", "predicate", NULL};
    PyObject *layouts, *counted = Py_None, *predicate = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!|OO:RecordColumns", keywords, &PyTuple_Type, &layouts, &counted,
                                     &predicate))
        return NULL;
    RecordColumns *self = (RecordColumns *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->counted = Py_NewRef(counted);
    self->predicate = Py_NewRef(predicate);
    self->declined = PyList_New(0);
    Py_ssize_t n = PyTuple_GET_SIZE(layouts);
    self->layouts = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Layout));
    if (!self->declined || !self->layouts) {
        if (!self->layouts) PyErr_NoMemory();
        Py_DECREF(self);
        return NULL;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        self->n = j + 1;  /* what dealloc frees, this one's partial state included */
        if (layout_open(&self->layouts[j], PyTuple_GET_ITEM(layouts, j)) < 0) {
            Py_DECREF(self);
            return NULL;
        }
    }
    return (PyObject *)self;
}

static PyMethodDef record_columns_methods[] = {
    {"append", (PyCFunction)record_columns_append, METH_O,
     "append(record): its fields onto its class's columns (or kept among the declined); the record is not kept."},
    {"take", (PyCFunction)record_columns_take, METH_NOARGS,
     "take() -> (((rows, columns), ...) per layout, declined records, count), and start anew."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods record_columns_sequence = {.sq_length = (lenfunc)record_columns_len};

static PyTypeObject RecordColumnsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "analyzer._columns.RecordColumns",
    .tp_doc = "RecordColumns(layouts, counted=None, predicate=None): slotted records' fields appended to Arrow "
              "buffers as they come; layouts: ((class, ((member descriptor, kind), ...)), ...).",
    .tp_basicsize = sizeof(RecordColumns),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = record_columns_new,
    .tp_dealloc = (destructor)record_columns_dealloc,
    .tp_traverse = (traverseproc)record_columns_traverse,
    .tp_clear = (inquiry)record_columns_clear,
    .tp_methods = record_columns_methods,
    .tp_as_sequence = &record_columns_sequence,
};

static PyMethodDef methods[] = {
    {"rows", rows, METH_VARARGS, "rows(names, columns, length) -> a Row per row of an Arrow batch's columns."},
    {"record_column", record_column, METH_VARARGS,
     "record_column(items, slot, kind) -> one field of slotted records as Arrow buffers, or None if not taken."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_columns", NULL, -1, methods};

PyMODINIT_FUNC PyInit__columns(void) {
    if (PyType_Ready(&RowType) < 0 || PyType_Ready(&RecordColumnsType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Row", (PyObject *)&RowType) < 0 ||
        PyModule_AddObjectRef(m, "RecordColumns", (PyObject *)&RecordColumnsType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "INT64", K_INT64) < 0 || PyModule_AddIntConstant(m, "INT32", K_INT32) < 0 ||
        PyModule_AddIntConstant(m, "INT16", K_INT16) < 0 || PyModule_AddIntConstant(m, "INT8", K_INT8) < 0 ||
        PyModule_AddIntConstant(m, "BOOL", K_BOOL) < 0 || PyModule_AddIntConstant(m, "UTF8", K_UTF8) < 0 ||
        PyModule_AddIntConstant(m, "LARGE_UTF8", K_LARGE_UTF8) < 0 || PyModule_AddIntConstant(m, "NULL", K_NULL) < 0 ||
        PyModule_AddIntConstant(m, "BINARY", K_BINARY) < 0 ||
        PyModule_AddIntConstant(m, "LARGE_BINARY", K_LARGE_BINARY) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
