/* Records made in C (see records.py, `record`): `maker(cls, names)` returns a callable that makes an
 * instance of the slotted record class `cls` from its fields, as `cls(...)` does, binding the same
 * arguments (positional or keyword, every field required, none twice, no other) to the same slots.
 *
 * Why: calling a Python class with 30 keywords packs them into a dict and unpacks them again in
 * `__init__` (~1.7 µs for a Delivery); this binds the caller's keyword names to the slots directly
 * (vectorcall), which is what most of the machine's per-frame allocation is. It sets the slots as
 * the record's own `__init__` does, without `__setattr__` (frozen records refuse it), and calls no
 * `__new__`, `__init__` or `__post_init__`: records.py hands it only classes that have none of their
 * own. tests/test_records.py compares it with the class call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_untrack.h"

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyTypeObject *cls;
    Py_ssize_t n;
    PyObject **names;      /* interned field names, in field order */
    Py_ssize_t *offsets;   /* each field's slot offset in an instance */
} Maker;

static PyTypeObject MakerType;

/* The field index of keyword `key`, looked for first where the caller's order suggests. */
static Py_ssize_t field_index(Maker *m, PyObject *key, Py_ssize_t guess) {
    if (guess < m->n && m->names[guess] == key) return guess;
    for (Py_ssize_t j = 0; j < m->n; j++)
        if (m->names[j] == key) return j;
    for (Py_ssize_t j = 0; j < m->n; j++) {
        int equal = PyUnicode_Compare(m->names[j], key) == 0;
        if (equal) return j;
        if (PyErr_Occurred()) return -2;
    }
    return -1;
}

static PyObject *maker_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Maker *m = (Maker *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    const char *name = m->cls->tp_name;
    if (nargs > m->n) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd positional arguments but %zd were given", name, m->n, nargs);
        return NULL;
    }
    PyObject *small[64], **values = m->n <= 64 ? small : PyMem_Calloc((size_t)m->n, sizeof(PyObject *));
    if (!values) return PyErr_NoMemory();
    if (values == small) memset(small, 0, sizeof(PyObject *) * (size_t)m->n);
    PyObject *out = NULL;
    for (Py_ssize_t i = 0; i < nargs; i++) values[i] = args[i];
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        Py_ssize_t j = field_index(m, key, nargs + k);
        if (j == -2) goto done;
        if (j < 0) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", name, key);
            goto done;
        }
        if (values[j]) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%U'", name, m->names[j]);
            goto done;
        }
        values[j] = args[nargs + k];
    }
    for (Py_ssize_t j = 0; j < m->n; j++)
        if (!values[j]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument: '%U'", name, m->names[j]);
            goto done;
        }
    out = m->cls->tp_alloc(m->cls, 0);
    if (!out) goto done;
    for (Py_ssize_t j = 0; j < m->n; j++) *(PyObject **)((char *)out + m->offsets[j]) = Py_NewRef(values[j]);
    untrack_if_plain(out, values, m->n);
done:
    if (values != small) PyMem_Free(values);
    return out;
}

static void maker_dealloc(Maker *m) {
    PyObject_GC_UnTrack(m);
    Py_CLEAR(m->cls);
    if (m->names)
        for (Py_ssize_t j = 0; j < m->n; j++) Py_XDECREF(m->names[j]);
    PyMem_Free(m->names);
    PyMem_Free(m->offsets);
    PyObject_GC_Del(m);
}

static int maker_traverse(Maker *m, visitproc visit, void *arg) {
    Py_VISIT(m->cls);
    return 0;
}

static PyObject *maker_repr(Maker *m) { return PyUnicode_FromFormat("<record maker of %s>", m->cls->tp_name); }

static PyTypeObject MakerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "analyzer.timeline._records.Maker",
    .tp_basicsize = sizeof(Maker),
    .tp_dealloc = (destructor)maker_dealloc,
    .tp_vectorcall_offset = offsetof(Maker, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_repr = (reprfunc)maker_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_traverse = (traverseproc)maker_traverse,
};

/* maker(cls, names): `names` are the fields, in order, each a __slots__ member of `cls` itself. */
static PyObject *maker(PyObject *module, PyObject *args) {
    PyObject *cls, *names;
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &cls, &PyTuple_Type, &names)) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    Maker *m = PyObject_GC_New(Maker, &MakerType);
    if (!m) return NULL;
    m->vectorcall = maker_call;
    m->cls = (PyTypeObject *)Py_NewRef(cls);
    m->n = n;
    m->names = PyMem_Calloc((size_t)(n ? n : 1), sizeof(PyObject *));
    m->offsets = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_ssize_t));
    PyObject_GC_Track(m);
    if (!m->names || !m->offsets) {
        Py_DECREF(m);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *key = PyTuple_GET_ITEM(names, j);
        PyObject *slot = PyUnicode_CheckExact(key) ? PyDict_GetItemWithError(m->cls->tp_dict, key) : NULL;
        if (!slot || !Py_IS_TYPE(slot, &PyMemberDescr_Type) || PyDescr_TYPE(slot) != m->cls ||
            ((PyMemberDescrObject *)slot)->d_member->type != T_OBJECT_EX) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "%s: field %R is not one of its own __slots__", m->cls->tp_name, key);
            Py_DECREF(m);
            return NULL;
        }
        Py_INCREF(key);
        PyUnicode_InternInPlace(&key);  /* the callers' keyword names are interned: found by identity */
        m->names[j] = key;
        m->offsets[j] = ((PyMemberDescrObject *)slot)->d_member->offset;
    }
    return (PyObject *)m;
}

static PyMethodDef methods[] = {
    {"maker", maker, METH_VARARGS, "maker(cls, names) -> a callable making cls's records from their fields."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_records", NULL, -1, methods};

PyMODINIT_FUNC PyInit__records(void) {
    if (PyType_Ready(&MakerType) < 0) return NULL;
    return PyModule_Create(&module);
}
