/* What the C twins of the Python state classes share (timeline/_plain.c, _folds.c): reading and
 * setting a slotted object's fields at the offsets resolved from its class by name, and the exact
 * value tests a twin makes before it takes a row or record (anything else goes the Python way). */
#ifndef ACKSCOPE_SLOTS_H
#define ACKSCOPE_SLOTS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* The offset of slot `name` of `cls` itself (a T_OBJECT_EX member), or -1 with an error. */
static Py_ssize_t slot_offset(PyTypeObject *cls, const char *name) {
    PyObject *slot = PyDict_GetItemString(cls->tp_dict, name);
    if (!slot || !Py_IS_TYPE(slot, &PyMemberDescr_Type) || PyDescr_TYPE(slot) != cls ||
        ((PyMemberDescrObject *)slot)->d_member->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_TypeError, "%s: %s is not one of its own __slots__", cls->tp_name, name);
        return -1;
    }
    return ((PyMemberDescrObject *)slot)->d_member->offset;
}

/* The field at `offset` of `obj` (borrowed; NULL if unset). */
static inline PyObject *slot_get(PyObject *obj, Py_ssize_t offset) { return *(PyObject **)((char *)obj + offset); }

/* Set the field at `offset` of `obj` to a new reference (stolen). */
static inline void slot_put(PyObject *obj, Py_ssize_t offset, PyObject *value) {
    PyObject **slot = (PyObject **)((char *)obj + offset);
    PyObject *old = *slot;
    *slot = value;
    Py_XDECREF(old);
}

/* An exact str equal to `b` (an exact str). */
static int same_str(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    if (!PyUnicode_CheckExact(a) || PyUnicode_GET_LENGTH(a) != PyUnicode_GET_LENGTH(b) ||
        PyUnicode_KIND(a) != PyUnicode_KIND(b))
        return 0;
    return memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)PyUnicode_GET_LENGTH(a) * PyUnicode_KIND(a)) == 0;
}

/* An exact int that fits 64 bits. */
static int as_i64(PyObject *value, long long *out) {
    if (!value || !PyLong_CheckExact(value)) return 0;
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(value, &overflow);
    return !overflow && !(*out == -1 && PyErr_Occurred());
}

/* `configure`'s constants: out[i] = given[names[i]] (borrowed), each an exact str; -1 with an error. */
static int named_strings(PyObject *given, const char *const *names, int n, PyObject **out) {
    for (int i = 0; i < n; i++) {
        PyObject *value = PyDict_GetItemString(given, names[i]);
        if (!value || !PyUnicode_CheckExact(value)) {
            PyErr_Format(PyExc_TypeError, "configure: no string %s", names[i]);
            return -1;
        }
        out[i] = value;
    }
    return 0;
}

#endif
