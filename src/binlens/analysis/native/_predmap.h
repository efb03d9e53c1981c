/* PredMap: the explorer's recorded predecessors, `{chunk: the chunk recorded before it}`, packed.
 *
 * A dict of ints costs ~40 bytes an entry (gcc's cc1: 1.10M fall-through predecessors, a 40 MiB dict;
 * 24 MiB as a PredMap).
 * Here an entry is the key's 8 bytes and the predecessor as a 32-bit distance from it, in an
 * open-addressing table at most three quarters full: 12 bytes a slot. Lookups hand out a new int.
 * What fits no slot (a key or value that is no int of 0..2**64-1, the key 2**64-1 that marks an
 * empty slot, a distance beyond 32 bits) goes to a side dict, so the map holds whatever a dict
 * held. Entries are never deleted (the explorer drops the whole map when discovery ends). It
 * behaves as the dict did for every use the engine makes of it: `get`, `[]`, `in`, `len`,
 * assignment, `setdefault`, `items`.
 *
 * The walk of `_descent.c` takes a dict or a PredMap (`pred_put`, `pred_setdefault`).
 */

#define PM_EMPTY (~0ULL)

typedef struct {
    PyObject_HEAD unsigned long long *keys;
    int *dist;
    size_t cap; /* slots: a power of two, or 0 */
    size_t n;   /* entries in the table */
    PyObject *other;
} PredMap;

static PyTypeObject PredMapType;
#define IS_PM(o) (Py_TYPE(o) == &PredMapType)

static size_t pm_slot(unsigned long long k, size_t cap) { return (size_t)((k * 0x9E3779B97F4A7C15ULL) >> 20) & (cap - 1); }

/* the slot holding k, or the empty slot where it would go */
static size_t pm_find(const PredMap *m, unsigned long long k) {
    size_t i = pm_slot(k, m->cap);
    while (m->keys[i] != PM_EMPTY && m->keys[i] != k)
        i = (i + 1) & (m->cap - 1);
    return i;
}

static int pm_grow(PredMap *m) {
    size_t cap = m->cap ? m->cap * 2 : 1024;
    unsigned long long *keys = PyMem_Malloc(cap * sizeof(*keys));
    int *dist = PyMem_Malloc(cap * sizeof(*dist));
    if (!keys || !dist) {
        PyMem_Free(keys);
        PyMem_Free(dist);
        PyErr_NoMemory();
        return -1;
    }
    memset(keys, 0xFF, cap * sizeof(*keys));
    for (size_t j = 0; j < m->cap; j++)
        if (m->keys[j] != PM_EMPTY) {
            size_t i = pm_slot(m->keys[j], cap);
            while (keys[i] != PM_EMPTY)
                i = (i + 1) & (cap - 1);
            keys[i] = m->keys[j], dist[i] = m->dist[j];
        }
    PyMem_Free(m->keys);
    PyMem_Free(m->dist);
    m->keys = keys, m->dist = dist, m->cap = cap;
    return 0;
}

/* an int of 0..2**64-1 as a word: 1, or 0 when it is none (no error left set) */
static int pm_word(PyObject *o, unsigned long long *v) {
    if (!PyLong_CheckExact(o))
        return 0;
    *v = PyLong_AsUnsignedLongLong(o);
    if (*v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* (key, value) as a slot's key and distance: 1, or 0 when they fit no slot */
static int pm_fits(PyObject *key, PyObject *value, unsigned long long *k, int *d) {
    unsigned long long v;
    if (!pm_word(key, k) || *k == PM_EMPTY || !pm_word(value, &v))
        return 0;
    long long delta = (long long)(v - *k); /* (two's complement: v = k + delta) */
    if (delta < INT_MIN || delta > INT_MAX)
        return 0;
    *d = (int)delta;
    return 1;
}

/* the value at `key` (a new reference); NULL and no error when there is none */
static PyObject *pm_get(PredMap *m, PyObject *key) {
    unsigned long long k;
    if (m->cap && pm_word(key, &k) && k != PM_EMPTY) {
        size_t i = pm_find(m, k);
        if (m->keys[i] == k)
            return PyLong_FromUnsignedLongLong(k + (unsigned long long)(long long)m->dist[i]);
    }
    return m->other ? Py_XNewRef(PyDict_GetItemWithError(m->other, key)) : NULL;
}

/* set (`keep`: only where `key` has no value yet); 0, or -1 on error */
static int pm_put(PredMap *m, PyObject *key, PyObject *value, int keep) {
    unsigned long long k;
    int d;
    if (pm_fits(key, value, &k, &d)) {
        if (m->other && PyDict_GET_SIZE(m->other)) { /* (a value that did not fit before: replace it) */
            PyObject *was = PyDict_GetItemWithError(m->other, key);
            if (!was && PyErr_Occurred())
                return -1;
            if (was) {
                if (keep)
                    return 0;
                if (PyDict_DelItem(m->other, key) < 0)
                    return -1;
            }
        }
        if ((m->n + 1) * 4 > m->cap * 3 && pm_grow(m) < 0)
            return -1;
        size_t i = pm_find(m, k);
        if (m->keys[i] == k) {
            if (!keep)
                m->dist[i] = d;
            return 0;
        }
        m->keys[i] = k, m->dist[i] = d, m->n++;
        return 0;
    }
    unsigned long long kk;
    if (m->cap && pm_word(key, &kk) && kk != PM_EMPTY) { /* in the table with a value that fitted */
        size_t i = pm_find(m, kk);
        if (m->keys[i] == kk) {
            if (keep)
                return 0;
            return -2; /* (a fitting value is replaced by one that does not: see pm_store) */
        }
    }
    if (!m->other && !(m->other = PyDict_New()))
        return -1;
    if (keep) {
        PyObject *r = PyDict_SetDefault(m->other, key, value);
        return r ? 0 : -1;
    }
    return PyDict_SetItem(m->other, key, value);
}

/* pm_put, moving an entry from the table to the side dict where its new value does not fit a slot */
static int pm_store(PredMap *m, PyObject *key, PyObject *value, int keep) {
    int r = pm_put(m, key, value, keep);
    if (r != -2)
        return r;
    /* rare: rebuild the table without the key, then keep the pair in the side dict */
    unsigned long long k = PyLong_AsUnsignedLongLong(key);
    size_t old_cap = m->cap;
    unsigned long long *keys = m->keys;
    int *dist = m->dist;
    m->keys = NULL, m->dist = NULL, m->cap = 0, m->n = 0;
    int err = 0;
    for (size_t j = 0; j < old_cap && !err; j++)
        if (keys[j] != PM_EMPTY && keys[j] != k) {
            if ((m->n + 1) * 4 > m->cap * 3 && pm_grow(m) < 0)
                err = 1;
            else {
                size_t i = pm_find(m, keys[j]);
                m->keys[i] = keys[j], m->dist[i] = dist[j], m->n++;
            }
        }
    PyMem_Free(keys);
    PyMem_Free(dist);
    if (err || (!m->other && !(m->other = PyDict_New())))
        return -1;
    return PyDict_SetItem(m->other, key, value);
}

/* ------------------------------------------------ what the walk uses: a dict or a PredMap */

static int pred_put(PyObject *pred, PyObject *key, PyObject *value) {
    return IS_PM(pred) ? pm_store((PredMap *)pred, key, value, 0) : PyDict_SetItem(pred, key, value);
}

static int pred_setdefault(PyObject *pred, PyObject *key, PyObject *value) {
    if (IS_PM(pred))
        return pm_store((PredMap *)pred, key, value, 1);
    return PyDict_SetDefault(pred, key, value) ? 0 : -1;
}

static int pred_ok(PyObject *pred) { return PyDict_Check(pred) || IS_PM(pred); }

/* ------------------------------------------------------------------------ the Python type */

static void pm_dealloc(PredMap *m) {
    PyMem_Free(m->keys);
    PyMem_Free(m->dist);
    Py_XDECREF(m->other);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static Py_ssize_t pm_len(PredMap *m) { return (Py_ssize_t)m->n + (m->other ? PyDict_GET_SIZE(m->other) : 0); }

static PyObject *pm_subscript(PredMap *m, PyObject *key) {
    PyObject *v = pm_get(m, key);
    if (!v && !PyErr_Occurred())
        PyErr_SetObject(PyExc_KeyError, key);
    return v;
}

static int pm_ass(PredMap *m, PyObject *key, PyObject *value) {
    if (!value) {
        PyErr_SetString(PyExc_TypeError, "a PredMap keeps its entries (no deletion)");
        return -1;
    }
    return pm_store(m, key, value, 0);
}

static int pm_contains(PredMap *m, PyObject *key) {
    PyObject *v = pm_get(m, key);
    if (!v)
        return PyErr_Occurred() ? -1 : 0;
    Py_DECREF(v);
    return 1;
}

static PyObject *pm_get_method(PredMap *m, PyObject *args) {
    PyObject *key, *dflt = Py_None;
    if (!PyArg_UnpackTuple(args, "get", 1, 2, &key, &dflt))
        return NULL;
    PyObject *v = pm_get(m, key);
    return v ? v : PyErr_Occurred() ? NULL : Py_NewRef(dflt);
}

static PyObject *pm_setdefault_method(PredMap *m, PyObject *args) {
    PyObject *key, *dflt = Py_None;
    if (!PyArg_UnpackTuple(args, "setdefault", 1, 2, &key, &dflt) || pm_store(m, key, dflt, 1) < 0)
        return NULL;
    return pm_subscript(m, key);
}

static PyObject *pm_items(PredMap *m, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyList_New(0);
    if (!out)
        return NULL;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->keys[i] == PM_EMPTY)
            continue;
        unsigned long long k = m->keys[i];
        if (append_new(out, Py_BuildValue("(KK)", k, k + (unsigned long long)(long long)m->dist[i])) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return m->other ? extend_new(out, PyDict_Items(m->other)) : out;
}

static PyObject *pm_nbytes(PredMap *m, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromSize_t(m->cap * (sizeof(*m->keys) + sizeof(*m->dist)));
}

static PyMethodDef pm_methods[] = {
    {"get", (PyCFunction)pm_get_method, METH_VARARGS, "The value at a key, or the default (None)."},
    {"setdefault", (PyCFunction)pm_setdefault_method, METH_VARARGS, "Set a key's value unless it has one; give it."},
    {"items", (PyCFunction)pm_items, METH_NOARGS, "A list of (key, value) pairs (table order, then the side dict's)."},
    {"nbytes", (PyCFunction)pm_nbytes, METH_NOARGS, "Bytes of the table (not the side dict)."},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods pm_mapping = {(lenfunc)pm_len, (binaryfunc)pm_subscript, (objobjargproc)pm_ass};
static PySequenceMethods pm_sequence = {.sq_contains = (objobjproc)pm_contains};

static PyTypeObject PredMapType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "binlens.analysis.native._descent.PredMap",
    .tp_basicsize = sizeof(PredMap),
    .tp_dealloc = (destructor)pm_dealloc,
    .tp_as_mapping = &pm_mapping,
    .tp_as_sequence = &pm_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The explorer's predecessors {chunk: chunk} in 12-byte slots (see _predmap.h).",
    .tp_methods = pm_methods,
    .tp_new = PyType_GenericNew,
};
