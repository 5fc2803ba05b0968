/* Records of plain values kept out of the cyclic collector's walks (timeline/_records.c, _plain.c).
 *
 * A record whose fields are all plain values (ints, strs, None: nearly every record) can be in no
 * reference cycle, so the collector need not walk it, as CPython untracks such tuples and dicts
 * itself. The records a pass keeps till its flush were nearly all the collector walked: 7-11% of
 * a pass's CPU (bench/README.md, session 40). Records are frozen: no other value is put in them
 * afterwards, so a record untracked stays one that needs no tracking.
 */
#ifndef ACKSCOPE_UNTRACK_H
#define ACKSCOPE_UNTRACK_H

#include <Python.h>

/* As CPython's own _PyObject_GC_MAY_BE_TRACKED: could `v` be a link of a cycle, now or later? */
static inline int may_be_tracked(PyObject *v) {
    return PyObject_IS_GC(v) && (!PyTuple_CheckExact(v) || PyObject_GC_IsTracked(v));
}

/* Untracks `record` (just made, its n fields `values`) when none of them may be tracked. */
static inline void untrack_if_plain(PyObject *record, PyObject *const *values, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (may_be_tracked(values[i])) return;
    PyObject_GC_UnTrack(record);
}

#endif
