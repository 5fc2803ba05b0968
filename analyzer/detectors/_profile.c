/* The C twin of Profile.fold (profile.py): one prefetch scope's unacked profile folded in one pass.
 *
 *   fold(keys, times, horizon, floor, running, peak, last_time, stack, closed)
 *       -> (keys, times, running, peak, last_time, stack, closed), or None
 *
 * The arguments are the profile's fields (floor: the level every limit at or below the scope's
 * largest prefetch counts as, profile.py's `_floor`); the result is what they are after folding
 * every waiting event of key below `horizon` (None: all). It changes nothing it is given: the
 * caller stores the result, or, for None, folds the Python way, which stays the one statement of
 * the rules (None for anything but plain values: exact ints within 2**62, None where the Python
 * allows it, stack and closed entries of three; and for what the Python refuses or computes with
 * wrapped int64s). tests/test_detector_folds.py holds the two to the same state after every fold.
 *
 * Why: the Python finds the runs of every limit at once as the nodes of a Cartesian tree with
 * numpy's range-minimum tables (O(n log n) plus a dozen array calls per fold); folded every 4,096
 * rows of every connection, that was a tenth of the connection pass's Python (bench/README.md,
 * session 43). Here the same runs come off one stack pass over the rows in order, O(n): the stack
 * holds the runs still open, levels rising from the bottom; a row of level v closes every run above
 * v (the band of limits between the run below and the higher of v and that run's level), and opens
 * one at v when it is higher than the top, starting at the row a closed run started at if it
 * closed one (its rows are the new run's rows too), else at its own. A run's latest following
 * time is kept on the top entry only and handed down when the entry closes, so each row costs O(1)
 * amortised; the open runs take theirs top down at the end.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>

#define BOUND (1LL << 62)                  /* the values taken: their sums and differences fit int64 */
#define NO_TIME (-0x7fffffffffffffffLL - 1) /* profile.py's NO_TIME, int64's least */
#define MAX_TIME_SPAN (1LL << 62)          /* profile.py's MAX_TIME_SPAN */
#define MAX_BAND_LEVELS (1LL << 22)        /* compaction by level: more levels between band edges go the Python way */

/* An exact int in (-2**62, 2**62). */
static int bounded(PyObject *value, long long *out) {
    if (!value || !PyLong_CheckExact(value)) return 0;
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (*out == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return !overflow && *out > -BOUND && *out < BOUND;
}

/* None or a bounded int: 1 (NO_TIME for None), 0 for anything else. */
static int optional_time(PyObject *value, long long *out) {
    if (value == Py_None) {
        *out = NO_TIME;
        return 1;
    }
    return bounded(value, out);
}

/* [a, b, c] of bounded ints (c may be None where `optional_last`): 1, 0 for anything else. */
static int triple(PyObject *item, long long out[3], int optional_last) {
    if (!PyList_CheckExact(item) || PyList_GET_SIZE(item) != 3) return 0;
    return bounded(PyList_GET_ITEM(item, 0), &out[0]) && bounded(PyList_GET_ITEM(item, 1), &out[1]) &&
           (optional_last ? optional_time(PyList_GET_ITEM(item, 2), &out[2]) : bounded(PyList_GET_ITEM(item, 2), &out[2]));
}

typedef struct { long long key, time; } Event;

static int by_key_then_time(const void *a, const void *b) {
    const Event *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return x->time < y->time ? -1 : x->time > y->time;
}

typedef struct { long long lo, hi, stall; } Band;

static int by_stall_descending(const void *a, const void *b) {
    const Band *x = a, *y = b;
    return x->stall > y->stall ? -1 : x->stall < y->stall;
}

typedef struct { long long level, since, latest; } Run;

static PyObject *int_list(long long a, long long b, long long c, int c_none) {
    PyObject *out = PyList_New(3);
    if (!out) return NULL;
    PyObject *values[3] = {PyLong_FromLongLong(a), PyLong_FromLongLong(b), c_none ? Py_NewRef(Py_None) : PyLong_FromLongLong(c)};
    for (int i = 0; i < 3; i++) {
        if (!values[i]) {
            for (int j = i + 1; j < 3; j++) Py_XDECREF(values[j]);
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, values[i]);
    }
    return out;
}

/* The paint of profile.py's `_compacted`: each level in (lo, hi] of a band takes the largest stall
 * of the bands over it (bands in descending stall, each level painted once: `next` skips painted
 * ones); then each stretch of covered levels of one stall is one band. `bands` clipped at the floor
 * and of lo < hi. A new list, or NULL with `*declined` (too many levels) or an error. */
static PyObject *compacted(Band *bands, Py_ssize_t n, int *declined) {
    if (!n) return PyList_New(0);
    long long base = bands[0].lo, top = bands[0].hi;
    for (Py_ssize_t i = 1; i < n; i++) {
        if (bands[i].lo < base) base = bands[i].lo;
        if (bands[i].hi > top) top = bands[i].hi;
    }
    if (top - base > MAX_BAND_LEVELS) {
        *declined = 1;
        return NULL;
    }
    Py_ssize_t levels = (Py_ssize_t)(top - base);  /* level base + 1 + i at i */
    long long *stall = malloc(sizeof(long long) * (size_t)levels);
    Py_ssize_t *next = malloc(sizeof(Py_ssize_t) * (size_t)(levels + 1));
    char *painted = calloc((size_t)levels, 1);
    PyObject *out = NULL;
    if (!stall || !next || !painted) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i <= levels; i++) next[i] = i;   /* the first unpainted level at or after i */
    qsort(bands, (size_t)n, sizeof(Band), by_stall_descending);
    for (Py_ssize_t b = 0; b < n; b++) {
        Py_ssize_t at = (Py_ssize_t)(bands[b].lo - base), end = (Py_ssize_t)(bands[b].hi - base);
        for (;;) {
            Py_ssize_t root = at;
            while (next[root] != root) root = next[root];
            while (next[at] != root) {   /* path compression */
                Py_ssize_t up = next[at];
                next[at] = root;
                at = up;
            }
            at = root;
            if (at >= end) break;
            stall[at] = bands[b].stall;
            painted[at] = 1;
            next[at] = at + 1;
        }
    }
    out = PyList_New(0);
    for (Py_ssize_t i = 0; out && i < levels;) {
        if (!painted[i]) {
            i++;
            continue;
        }
        Py_ssize_t j = i + 1;
        while (j < levels && painted[j] && stall[j] == stall[i]) j++;
        PyObject *band = int_list(base + i, base + j, stall[i], 0);
        if (!band || PyList_Append(out, band) < 0) Py_CLEAR(out);
        Py_XDECREF(band);
        i = j;
    }
done:
    free(stall);
    free(next);
    free(painted);
    return out;
}

/* The waiting events of key below the horizon into `events` (*ready of them), the others into
 * new lists (*later_keys, *later_times; all folded: empty). 1; 0 to decline; -1 with an error. */
static int ready_events(PyObject *keys, PyObject *times, int has_horizon, long long horizon, Event *events,
                        Py_ssize_t *ready, PyObject **later_keys, PyObject **later_times) {
    Py_ssize_t waiting = PyList_GET_SIZE(keys);
    *ready = 0;
    for (Py_ssize_t i = 0; i < waiting; i++) {
        long long key, time;
        if (!bounded(PyList_GET_ITEM(keys, i), &key) || !bounded(PyList_GET_ITEM(times, i), &time)) return 0;
        if (!has_horizon || key < horizon) events[(*ready)++] = (Event){key, time};
    }
    if (!(*later_keys = PyList_New(0)) || !(*later_times = PyList_New(0))) return -1;
    for (Py_ssize_t i = 0; *ready < waiting && i < waiting; i++) {
        long long key;
        bounded(PyList_GET_ITEM(keys, i), &key);
        if (key >= horizon && (PyList_Append(*later_keys, PyList_GET_ITEM(keys, i)) < 0 ||
                               PyList_Append(*later_times, PyList_GET_ITEM(times, i)) < 0))
            return -1;
    }
    return 1;
}

/* The runs carried open and the closed bands, as given: 1; 0 to decline. */
static int carried_state(PyObject *stack, PyObject *closed, long long (*out)[3]) {
    Py_ssize_t carried = PyList_GET_SIZE(stack);
    for (Py_ssize_t j = 0; j < carried; j++)
        if (!triple(PyList_GET_ITEM(stack, j), out[j], 1)) return 0;
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(closed); j++)
        if (!triple(PyList_GET_ITEM(closed, j), out[carried + j], 0)) return 0;
    return 1;
}

/* Each ready row's unacked level (the running count after the last event of its key) into
 * `level`, from `running`; the highest of them. */
static long long row_levels(const Event *events, Py_ssize_t n, long long *running, long long *level) {
    long long highest = 0;
    for (Py_ssize_t i = 0; i < n;) {
        Py_ssize_t j = i;
        long long after = *running;
        for (; j < n && events[j].key == events[i].key; j++) after += (events[j].key & 1) ? -1 : 1;
        for (Py_ssize_t k = i; k < j; k++) level[k] = after;
        if (i == 0 || after > highest) highest = after;
        *running = after;
        i = j;
    }
    return highest;
}

/* The stack pass over rows 1..rows-1 (row 0: the floor): the runs that close into `bands`
 * (*n_bands), those still open left in `runs` (*depth, runs[0] the floor; each run's latest its own
 * rows' only, those above it not counted). 1; 0 to decline. */
static int stack_pass(const long long *level, const long long *start, const long long *following, Py_ssize_t rows,
                      Run *runs, Py_ssize_t *depth_out, Band *bands, Py_ssize_t *n_bands) {
    Py_ssize_t depth = 1;
    runs[0] = (Run){level[0], 0, NO_TIME};
    *n_bands = 0;
    for (Py_ssize_t p = 1; p < rows; p++) {
        long long v = level[p];
        int closed_one = 0;
        Run last_closed = {0, 0, 0};
        while (runs[depth - 1].level > v) {
            Run *run = &runs[--depth], *below = &runs[depth - 1];
            if (run->latest == NO_TIME) return 0;   /* a carried run that never lasted: the Python wraps it */
            bands[(*n_bands)++] = (Band){below->level > v ? below->level : v, run->level, run->latest - run->since};
            if (below->latest < run->latest) below->latest = run->latest;
            last_closed = *run;
            closed_one = 1;
        }
        if (runs[depth - 1].level < v)
            runs[depth++] = closed_one ? (Run){v, last_closed.since, last_closed.latest} : (Run){v, start[p], NO_TIME};
        if (runs[depth - 1].latest < following[p]) runs[depth - 1].latest = following[p];
    }
    *depth_out = depth;
    return 1;
}

/* The open runs as the Python's stack: [level, since, latest following or None], bottom up, each
 * latest taken over the runs above it too (their rows are its rows). */
static PyObject *open_stack(const Run *runs, Py_ssize_t depth) {
    PyObject *out = PyList_New(depth - 1);
    long long latest = NO_TIME;
    for (Py_ssize_t at = depth - 1; out && at >= 1; at--) {
        if (latest < runs[at].latest) latest = runs[at].latest;
        PyObject *entry = int_list(runs[at].level, runs[at].since, latest, latest == NO_TIME);
        if (!entry) Py_CLEAR(out);
        else PyList_SET_ITEM(out, at - 1, entry);
    }
    return out;
}

typedef struct {   /* what one fold allocates */
    Event *events;
    long long (*given)[3];
    long long *level, *start, *following;
    Run *runs;
    Band *bands;
    PyObject *later_keys, *later_times, *stack, *closed;
} Work;

static void release(Work *w) {
    free(w->events), free(w->given), free(w->level), free(w->start), free(w->following), free(w->runs), free(w->bands);
    Py_XDECREF(w->later_keys), Py_XDECREF(w->later_times), Py_XDECREF(w->stack), Py_XDECREF(w->closed);
}

/* The fold into w->stack and w->closed (and the rest of `w`): 1; 0 to decline; -1 with an error. */
static int fold_into(Work *w, PyObject *const *args, long long *running, long long *peak, long long *last_time) {
    PyObject *keys = args[0], *times = args[1], *stack = args[7], *closed = args[8];
    long long horizon = 0, floor, peak_given = 0;
    int has_horizon = args[2] != Py_None, has_peak = args[5] != Py_None;
    if (!PyList_CheckExact(keys) || !PyList_CheckExact(times) || PyList_GET_SIZE(keys) != PyList_GET_SIZE(times) ||
        !PyList_CheckExact(stack) || !PyList_CheckExact(closed) || (has_horizon && !bounded(args[2], &horizon)) ||
        !bounded(args[3], &floor) || floor < 0 || !bounded(args[4], running) ||
        (has_peak && !bounded(args[5], &peak_given)) || !optional_time(args[6], last_time))
        return 0;
    Py_ssize_t waiting = PyList_GET_SIZE(keys), carried = PyList_GET_SIZE(stack), n_closed = PyList_GET_SIZE(closed);
    Py_ssize_t ready, rows = 1 + carried + waiting;
    if (!(w->events = malloc(sizeof(Event) * (size_t)(waiting + 1))) ||
        !(w->given = malloc(sizeof(long long[3]) * (size_t)(carried + n_closed + 1))) ||
        !(w->level = malloc(sizeof(long long) * (size_t)rows)) || !(w->start = malloc(sizeof(long long) * (size_t)rows)) ||
        !(w->following = malloc(sizeof(long long) * (size_t)rows)) || !(w->runs = malloc(sizeof(Run) * (size_t)rows)) ||
        !(w->bands = malloc(sizeof(Band) * (size_t)(rows + n_closed)))) {
        PyErr_NoMemory();
        return -1;
    }
    int ok = ready_events(keys, times, has_horizon, horizon, w->events, &ready, &w->later_keys, &w->later_times);
    if (ok <= 0) return ok;
    if (!carried_state(stack, closed, w->given)) return 0;
    if (!ready) {   /* nothing to fold yet: as it was */
        Py_SETREF(w->later_keys, Py_NewRef(keys));
        Py_SETREF(w->later_times, Py_NewRef(times));
        *peak = peak_given;
        w->stack = Py_NewRef(stack);
        w->closed = Py_NewRef(closed);
        return 2;
    }
    qsort(w->events, (size_t)ready, sizeof(Event), by_key_then_time);
    long long *level = w->level, *start = w->start, *following = w->following;
    long long highest = row_levels(w->events, ready, running, level + 1 + carried);
    *last_time = w->events[ready - 1].time;
    *peak = has_peak && peak_given > highest ? peak_given : highest;
    if (!carried && highest <= floor) {   /* no run above the floor goes on or begins */
        w->stack = Py_NewRef(stack);
        w->closed = Py_NewRef(closed);
        return 1;
    }

    /* The rows as the Python lays them out: the floor, the runs carried open, then the events;
     * each row lasts until the next one's time. */
    rows = 1 + carried + ready;
    level[0] = floor;
    start[0] = 0;
    following[0] = NO_TIME;
    for (Py_ssize_t j = 0; j < carried; j++) {
        level[1 + j] = w->given[j][0];
        start[1 + j] = w->given[j][1];
        following[1 + j] = w->given[j][2];
    }
    if (carried && following[carried] < w->events[0].time) following[carried] = w->events[0].time;
    for (Py_ssize_t i = 0; i < ready; i++) {
        start[1 + carried + i] = w->events[i].time;
        following[1 + carried + i] = i + 1 < ready ? w->events[i + 1].time : NO_TIME;
    }
    long long least = start[1], most = start[1];
    for (Py_ssize_t p = 1; p < rows; p++) {
        if (level[p] < floor) level[p] = floor;
        if (start[p] < least) least = start[p];
        if (start[p] > most) most = start[p];
        if (following[p] != NO_TIME && following[p] < least) least = following[p];
        if (following[p] > most) most = following[p];
    }
    if (most - least >= MAX_TIME_SPAN) return 0;   /* the Python raises */

    Py_ssize_t depth, n_bands;
    if (!stack_pass(level, start, following, rows, w->runs, &depth, w->bands, &n_bands)) return 0;
    if (!(w->stack = open_stack(w->runs, depth))) return -1;
    if (!n_bands) {
        w->closed = Py_NewRef(closed);
        return 1;
    }
    for (Py_ssize_t j = 0; j < n_closed; j++) {   /* the closed bands before, clipped at the floor */
        long long lo = w->given[carried + j][0] > floor ? w->given[carried + j][0] : floor;
        if (lo < w->given[carried + j][1]) w->bands[n_bands++] = (Band){lo, w->given[carried + j][1], w->given[carried + j][2]};
    }
    for (Py_ssize_t b = 0; b < n_bands; b++)
        if (w->bands[b].stall == NO_TIME) return 0;   /* the Python reads it as no stall */
    int too_many = 0;
    if (!(w->closed = compacted(w->bands, n_bands, &too_many))) return too_many ? 0 : -1;
    return 1;
}

static PyObject *fold(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) return PyErr_Format(PyExc_TypeError, "fold: 9 arguments, got %zd", nargs);
    Work w = {0};
    long long running = 0, peak = 0, last_time = NO_TIME;
    int status = fold_into(&w, args, &running, &peak, &last_time);
    PyObject *result = NULL;
    if (status == 2)   /* unchanged */
        result = PyTuple_Pack(7, w.later_keys, w.later_times, args[4], args[5], args[6], w.stack, w.closed);
    else if (status == 1)
        result = Py_BuildValue("(OOLLLOO)", w.later_keys, w.later_times, running, peak, last_time, w.stack, w.closed);
    else if (status == 0)
        result = Py_NewRef(Py_None);
    release(&w);
    return result;
}

static PyMethodDef methods[] = {
    {"fold", (PyCFunction)(void (*)(void))fold, METH_FASTCALL,
     "fold(keys, times, horizon, floor, running, peak, last_time, stack, closed) -> the same fields "
     "folded (a tuple), or None: fold the Python way."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_profile", NULL, -1, methods};

PyMODINIT_FUNC PyInit__profile(void) { return PyModule_Create(&module); }
