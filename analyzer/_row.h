/* A frame row as _columns.c makes it out of an Arrow batch (analyzer/_columns.c's `Row`), read in
 * place by the C twins that take rows (timeline/_plain.c).
 *
 * Why not a dict: a dict of the pass's 31 columns is a 64-slot table copied and filled per frame,
 * tracked by the cyclic GC, and freed again; a Row is one small untracked block of values that
 * shares its batch's column names. To Python it is a read-only Mapping with every column as a key
 * (a null is None), equal to the dict `pa.RecordBatch.to_pylist` gives, which stays the reference.
 */
#ifndef ACKSCOPE_ROW_H
#define ACKSCOPE_ROW_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct {
    PyObject_VAR_HEAD          /* ob_size: the number of columns */
    PyObject *names;           /* tuple of interned str, the columns in order (shared by a batch's rows) */
    PyObject *index;           /* dict: name -> its position in `names` (shared likewise) */
    PyObject *values[1];       /* ob_size of them: exact int, bool or str, or NULL for a null */
} Row;

/* The value at column `i` (borrowed; Py_None for a null). */
static inline PyObject *row_at(PyObject *row, Py_ssize_t i) {
    PyObject *value = ((Row *)row)->values[i];
    return value ? value : Py_None;
}

#endif
