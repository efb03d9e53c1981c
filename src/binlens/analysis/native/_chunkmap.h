/* ChunkMap: the explorer's chunk cache, `{va: (end, terminator, targets, last)}`, in flat records.
 *
 * A dict of chunk tuples costs ~250 bytes a chunk: the dict slot, the 4-tuple, the targets tuple
 * and three or four int objects (libc.so.6: 16.7 MiB traced for its 80k chunks, the largest single
 * thing the analysis holds). Here a chunk is one 32-byte record in a dense array, found through an
 * open-addressing table of 4-byte places (at most three quarters full; with the records in the slots
 * themselves, the table's empty slots cost 32 bytes each: 4 MiB for libc's 80k chunks, where these
 * are 2.9 MiB), plus its targets in a shared array of 8-byte words, and its address's int
 * object, which every tuple handed out uses for that address (as a target, or as a fall-through
 * end), so the walks' sets, dicts and lists share one int per chunk as they would with a dict. The map behaves as a dict
 * does for every use the engine makes of it (`get`, `[]`, `in`, `len`, assignment, `del`, `pop`,
 * `items`, iteration); reads hand out a fresh tuple equal to the one stored. Values that do not fit
 * a record (not a 4-tuple of ints, a chunk over 4 GiB, a target outside 64-bit signed range, ...)
 * are kept as they are in a side dict, so the map holds anything a dict holds.
 *
 * The C walks of `_descent.c` take either a dict or a ChunkMap (`chunk_at`, `chunk_put`,
 * `chunk_end`), so the tests can run them on plain dicts too.
 */

typedef struct {
    unsigned long long va;
    PyObject *key;          /* the int object of va (a reference): shared by every tuple handed out */
    unsigned int end, last; /* offsets from va */
    unsigned int t;         /* the first target's place in the pool */
    unsigned short nt;
    unsigned char kind;
    unsigned char used; /* 0 empty, 1 a chunk, 2 deleted */
} CMRec;

typedef struct {
    PyObject_HEAD CMRec *recs; /* the records, in the order they came (deleted ones marked, `used` 2) */
    size_t rn, rcap;           /* records used (deleted ones too) and allocated */
    unsigned int *idx;         /* slots: 0 empty, CM_DEL deleted, else a record's place + 1 */
    size_t cap;                /* slots: a power of two, or 0 */
    size_t n;                  /* chunks in the table */
    size_t filled;             /* slots used or deleted */
    long long *pool;
    size_t pn, pcap;
    PyObject *other; /* dict: the chunks that do not fit a record */
} ChunkMap;

static PyTypeObject ChunkMapType;
#define IS_CM(o) (Py_TYPE(o) == &ChunkMapType)

#define CM_DEL 0xFFFFFFFFu
#define CM_MAX_RECS 0xFFFFFFF0u /* (more chunks than this go to the side dict) */

static size_t cm_slot(unsigned long long va, size_t cap) {
    return (size_t)((va * 0x9E3779B97F4A7C15ULL) >> 17) & (cap - 1);
}

/* the slot of the chunk at `va`, or -1 */
static Py_ssize_t cm_find_slot(ChunkMap *m, unsigned long long va) {
    if (!m->cap)
        return -1;
    for (size_t i = cm_slot(va, m->cap);; i = (i + 1) & (m->cap - 1)) {
        unsigned int x = m->idx[i];
        if (!x)
            return -1;
        if (x != CM_DEL && m->recs[x - 1].va == va)
            return (Py_ssize_t)i;
    }
}

static CMRec *cm_find(ChunkMap *m, unsigned long long va) {
    Py_ssize_t i = cm_find_slot(m, va);
    return i < 0 ? NULL : &m->recs[m->idx[i] - 1];
}

/* a key as a record key: 1, or 0 when it is no int of 0..2**64-1 (no error left set) */
static int cm_key(PyObject *a, unsigned long long *va) {
    if (!PyLong_CheckExact(a))
        return 0;
    *va = PyLong_AsUnsignedLongLong(a);
    if (*va == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* the target pool without the targets of deleted or replaced chunks, once they are most of it
 * (building functions consumes the chunks: on libc.so.6 2 MiB of pool outlived the chunks) */
static int cm_compact_pool(ChunkMap *m) {
    size_t live = 0;
    for (size_t k = 0; k < m->rn; k++)
        if (m->recs[k].used == 1)
            live += m->recs[k].nt;
    if (live * 2 > m->pn || m->pcap <= 1024)
        return 0;
    size_t pcap = 1024;
    while (pcap < live)
        pcap *= 2;
    long long *pool = PyMem_Malloc(pcap * sizeof(*pool));
    if (!pool) {
        PyErr_NoMemory();
        return -1;
    }
    size_t pn = 0;
    for (size_t k = 0; k < m->rn; k++) {
        CMRec *r = &m->recs[k];
        if (r->used != 1)
            continue;
        memcpy(pool + pn, m->pool + r->t, r->nt * sizeof(*pool));
        r->t = (unsigned int)pn;
        pn += r->nt;
    }
    PyMem_Free(m->pool);
    m->pool = pool, m->pn = pn, m->pcap = pcap;
    return 0;
}

/* a new table for the chunks there are, at most half full: when it is three quarters full, and when
 * deletions left it less than an eighth full (building functions consumes the chunks) */
static int cm_resize(ChunkMap *m) {
    size_t cap = 1024;
    while (m->n * 2 >= cap)
        cap *= 2;
    unsigned int *idx = PyMem_Calloc(cap, sizeof(*idx));
    if (!idx) {
        PyErr_NoMemory();
        return -1;
    }
    size_t rn = 0; /* the live records moved down over the deleted ones, in their order */
    for (size_t k = 0; k < m->rn; k++)
        if (m->recs[k].used == 1)
            m->recs[rn++] = m->recs[k];
    for (size_t k = 0; k < rn; k++) {
        size_t i = cm_slot(m->recs[k].va, cap);
        while (idx[i])
            i = (i + 1) & (cap - 1);
        idx[i] = (unsigned int)k + 1;
    }
    PyMem_Free(m->idx);
    m->idx = idx, m->cap = cap, m->filled = m->n, m->rn = rn;
    if (m->rcap > 1024 && rn * 4 < m->rcap) { /* (a table emptied by building functions) */
        size_t rcap = 1024;
        while (rcap < rn * 2)
            rcap *= 2;
        CMRec *recs = PyMem_Realloc(m->recs, rcap * sizeof(*recs));
        if (recs)
            m->recs = recs, m->rcap = rcap;
    }
    return cm_compact_pool(m);
}

/* the record a value encodes to: 1, or 0 when it does not fit one (no error left set), -1 on error */
static int cm_encode(ChunkMap *m, unsigned long long va, PyObject *c, CMRec *r) {
    if (!PyTuple_CheckExact(c) || PyTuple_GET_SIZE(c) != 4)
        return 0;
    PyObject *end = PyTuple_GET_ITEM(c, 0), *kind = PyTuple_GET_ITEM(c, 1), *t = PyTuple_GET_ITEM(c, 2),
             *last = PyTuple_GET_ITEM(c, 3);
    if (!PyLong_CheckExact(end) || !PyLong_CheckExact(kind) || !PyTuple_CheckExact(t) || !PyLong_CheckExact(last) ||
        PyTuple_GET_SIZE(t) > 0xFFFF)
        return 0;
    unsigned long long e = PyLong_AsUnsignedLongLong(end), l = PyLong_AsUnsignedLongLong(last);
    long k = PyLong_AsLong(kind);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (e < va || e - va > 0xFFFFFFFFULL || l < va || l - va > 0xFFFFFFFFULL || k < 0 || k > 255)
        return 0;
    Py_ssize_t nt = PyTuple_GET_SIZE(t);
    if (m->pn + (size_t)nt > 0xFFFFFFFFULL)
        return 0;
    if (m->pn + (size_t)nt > m->pcap) {
        size_t pcap = m->pcap ? m->pcap : 1024;
        while (m->pn + (size_t)nt > pcap)
            pcap *= 2;
        long long *pool = PyMem_Realloc(m->pool, pcap * sizeof(*pool));
        if (!pool) {
            PyErr_NoMemory();
            return -1;
        }
        m->pool = pool, m->pcap = pcap;
    }
    for (Py_ssize_t i = 0; i < nt; i++) {
        PyObject *x = PyTuple_GET_ITEM(t, i);
        int over = 0;
        long long v = PyLong_CheckExact(x) ? PyLong_AsLongLongAndOverflow(x, &over) : 0;
        if (!PyLong_CheckExact(x) || over || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        m->pool[m->pn + (size_t)i] = v;
    }
    r->va = va, r->key = NULL, r->end = (unsigned int)(e - va), r->last = (unsigned int)(l - va);
    r->t = (unsigned int)m->pn, r->nt = (unsigned short)nt, r->kind = (unsigned char)k, r->used = 1;
    m->pn += (size_t)nt;
    return 1;
}

/* an address as an int object: the key object of the chunk starting there if there is one (so the
 * walks' sets, dicts and lists share one int per chunk, as they would with a dict), else a new int */
static PyObject *cm_addr(ChunkMap *m, long long v) {
    CMRec *r = v >= 0 ? cm_find(m, (unsigned long long)v) : NULL;
    return r ? Py_NewRef(r->key) : PyLong_FromLongLong(v);
}

/* the chunk of a record, as the tuple stored (a new reference) */
static PyObject *cm_tuple(ChunkMap *m, const CMRec *r) {
    PyObject *t = PyTuple_New(r->nt), *end = NULL;
    if (!t)
        return NULL;
    for (unsigned i = 0; i < r->nt; i++) {
        PyObject *x = cm_addr(m, m->pool[r->t + i]);
        if (!x) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, x);
    }
    /* the end is mostly the fall-through target just made: the same object */
    for (unsigned i = 0; i < r->nt && !end; i++)
        if ((unsigned long long)m->pool[r->t + i] == r->va + r->end)
            end = Py_NewRef(PyTuple_GET_ITEM(t, i));
    if (!end && !(end = PyLong_FromUnsignedLongLong(r->va + r->end))) {
        Py_DECREF(t);
        return NULL;
    }
    return Py_BuildValue("(NiNK)", end, (int)r->kind, t, r->va + r->last);
}

/* the chunk at `a` (a new reference); NULL and no error when there is none */
static PyObject *cm_get(ChunkMap *m, PyObject *a) {
    unsigned long long va;
    if (cm_key(a, &va)) {
        CMRec *r = cm_find(m, va);
        if (r)
            return cm_tuple(m, r);
    }
    if (!m->other)
        return NULL;
    return Py_XNewRef(PyDict_GetItemWithError(m->other, a));
}

/* delete `a`: 1 when it was there, 0 when not, -1 on error */
static int cm_del(ChunkMap *m, PyObject *a) {
    unsigned long long va;
    if (cm_key(a, &va)) {
        Py_ssize_t i = cm_find_slot(m, va);
        if (i >= 0) {
            CMRec *r = &m->recs[m->idx[i] - 1];
            r->used = 2;
            Py_CLEAR(r->key);
            m->idx[i] = CM_DEL;
            m->n--;
            return m->cap > 1024 && m->n * 8 < m->cap && cm_resize(m) < 0 ? -1 : 1;
        }
    }
    if (!m->other)
        return 0;
    PyObject *was = PyDict_GetItemWithError(m->other, a);
    if (!was)
        return PyErr_Occurred() ? -1 : 0;
    return PyDict_DelItem(m->other, a) < 0 ? -1 : 1;
}

/* room for one more record and its slot: made before a value's targets go into the pool, as a
 * resize compacts the pool (the targets of a record not yet in the table would be lost) */
static int cm_reserve(ChunkMap *m) {
    if ((m->filled + 1) * 4 > m->cap * 3 && cm_resize(m) < 0)
        return -1;
    if (m->rn < m->rcap)
        return 0;
    if (m->n * 2 < m->rn) /* mostly deleted: close the gaps rather than grow */
        return cm_resize(m);
    size_t rcap = m->rcap ? m->rcap * 2 : 1024;
    CMRec *recs = PyMem_Realloc(m->recs, rcap * sizeof(*recs));
    if (!recs) {
        PyErr_NoMemory();
        return -1;
    }
    m->recs = recs, m->rcap = rcap;
    return 0;
}

static int cm_put(ChunkMap *m, PyObject *a, PyObject *c) {
    unsigned long long va;
    CMRec rec;
    int is_key = cm_key(a, &va);
    if (is_key && cm_reserve(m) < 0)
        return -1;
    int fits = is_key ? cm_encode(m, va, c, &rec) : 0;
    if (fits < 0)
        return -1;
    if (fits && m->rn >= CM_MAX_RECS && !cm_find(m, va))
        fits = 0;
    if (fits) {
        CMRec *r = cm_find(m, va);
        if (r) {
            rec.key = r->key;
            *r = rec;
            return 0;
        }
        if (m->other && PyDict_GET_SIZE(m->other)) {
            PyObject *was = PyDict_GetItemWithError(m->other, a);
            if ((!was && PyErr_Occurred()) || (was && PyDict_DelItem(m->other, a) < 0))
                return -1;
        }
        size_t i = cm_slot(va, m->cap);
        while (m->idx[i] && m->idx[i] != CM_DEL)
            i = (i + 1) & (m->cap - 1);
        if (!m->idx[i])
            m->filled++;
        rec.key = Py_NewRef(a);
        m->recs[m->rn] = rec;
        m->idx[i] = (unsigned int)++m->rn;
        m->n++;
        return 0;
    }
    if (cm_del(m, a) < 0)
        return -1;
    if (!m->other && !(m->other = PyDict_New()))
        return -1;
    return PyDict_SetItem(m->other, a, c);
}

/* ------------------------------------------------ what the walks use: a dict or a ChunkMap */

/* the chunk at `a` (a new reference); NULL and no error when there is none */
static PyObject *chunk_at(PyObject *chunks, PyObject *a) {
    if (IS_CM(chunks))
        return cm_get((ChunkMap *)chunks, a);
    return Py_XNewRef(PyDict_GetItemWithError(chunks, a));
}

static int chunk_put(PyObject *chunks, PyObject *a, PyObject *c) {
    return IS_CM(chunks) ? cm_put((ChunkMap *)chunks, a, c) : PyDict_SetItem(chunks, a, c);
}

static int chunk_has(PyObject *chunks, PyObject *a) {
    if (!IS_CM(chunks))
        return PyDict_Contains(chunks, a);
    ChunkMap *m = (ChunkMap *)chunks;
    unsigned long long va;
    if (cm_key(a, &va) && cm_find(m, va))
        return 1; /* (no tuple made to answer `in`) */
    return m->other ? PyDict_Contains(m->other, a) : 0;
}

/* the end of the chunk at address `va` (its int `a`, or NULL: made only if a dict must be asked):
 * 1 when there is one, 0 when not, -1 on error; no tuple is made for a record */
static int chunk_end(PyObject *chunks, PyObject *a, unsigned long long va, unsigned long long *end) {
    if (IS_CM(chunks)) {
        CMRec *r = cm_find((ChunkMap *)chunks, va);
        if (r) {
            *end = r->va + r->end;
            return 1;
        }
        if (!((ChunkMap *)chunks)->other)
            return 0;
    }
    PyObject *key = a ? Py_NewRef(a) : PyLong_FromUnsignedLongLong(va);
    PyObject *c = key ? chunk_at(chunks, key) : NULL;
    Py_XDECREF(key);
    if (!c)
        return PyErr_Occurred() ? -1 : 0;
    int ok = PyTuple_Check(c) && PyTuple_GET_SIZE(c) >= 1;
    if (ok)
        *end = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(c, 0));
    else
        PyErr_SetString(PyExc_TypeError, "a chunk is not a tuple");
    Py_DECREF(c);
    return ok && !PyErr_Occurred() ? 1 : -1;
}

/* ------------------------------------------------------------------------ the Python type */

static void cm_dealloc(ChunkMap *m) {
    for (size_t k = 0; k < m->rn; k++)
        if (m->recs[k].used == 1)
            Py_DECREF(m->recs[k].key);
    PyMem_Free(m->recs);
    PyMem_Free(m->idx);
    PyMem_Free(m->pool);
    Py_XDECREF(m->other);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static Py_ssize_t cm_len(ChunkMap *m) { return (Py_ssize_t)m->n + (m->other ? PyDict_GET_SIZE(m->other) : 0); }

static PyObject *cm_subscript(ChunkMap *m, PyObject *a) {
    PyObject *c = cm_get(m, a);
    if (!c && !PyErr_Occurred())
        PyErr_SetObject(PyExc_KeyError, a);
    return c;
}

static int cm_ass(ChunkMap *m, PyObject *a, PyObject *c) {
    if (c)
        return cm_put(m, a, c);
    int r = cm_del(m, a);
    if (r == 0)
        PyErr_SetObject(PyExc_KeyError, a);
    return r > 0 ? 0 : -1;
}

static int cm_contains(ChunkMap *m, PyObject *a) { return chunk_has((PyObject *)m, a); }

static PyObject *cm_get_method(ChunkMap *m, PyObject *args) {
    PyObject *a, *dflt = Py_None;
    if (!PyArg_UnpackTuple(args, "get", 1, 2, &a, &dflt))
        return NULL;
    PyObject *c = cm_get(m, a);
    return c ? c : PyErr_Occurred() ? NULL : Py_NewRef(dflt);
}

static PyObject *cm_pop(ChunkMap *m, PyObject *args) {
    PyObject *a, *dflt = NULL;
    if (!PyArg_UnpackTuple(args, "pop", 1, 2, &a, &dflt))
        return NULL;
    PyObject *c = cm_get(m, a);
    if (!c) {
        if (PyErr_Occurred())
            return NULL;
        if (dflt)
            return Py_NewRef(dflt);
        PyErr_SetObject(PyExc_KeyError, a);
        return NULL;
    }
    if (cm_del(m, a) < 0) {
        Py_DECREF(c);
        return NULL;
    }
    return c;
}

/* [(va, chunk)] or [va]: the records first (in table order), then the side dict's */
static PyObject *cm_list(ChunkMap *m, int items) {
    PyObject *out = PyList_New(0);
    if (!out)
        return NULL;
    for (size_t k = 0; k < m->rn; k++) {
        if (m->recs[k].used != 1)
            continue;
        PyObject *key = Py_NewRef(m->recs[k].key), *c = items ? cm_tuple(m, &m->recs[k]) : NULL;
        PyObject *x = items ? (c ? PyTuple_Pack(2, key, c) : NULL) : Py_NewRef(key);
        Py_DECREF(key);
        Py_XDECREF(c);
        if (append_new(out, x) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    if (!m->other)
        return out;
    return extend_new(out, items ? PyDict_Items(m->other) : PyDict_Keys(m->other));
}

static PyObject *cm_items(ChunkMap *m, PyObject *Py_UNUSED(ignored)) { return cm_list(m, 1); }
static PyObject *cm_keys(ChunkMap *m, PyObject *Py_UNUSED(ignored)) { return cm_list(m, 0); }

static PyObject *cm_iter(ChunkMap *m) {
    PyObject *keys = cm_list(m, 0), *it = keys ? PyObject_GetIter(keys) : NULL;
    Py_XDECREF(keys);
    return it;
}

static PyObject *cm_nbytes(ChunkMap *m, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromSize_t(m->rcap * sizeof(CMRec) + m->cap * sizeof(unsigned int) + m->pcap * sizeof(long long));
}

static PyMethodDef cm_methods[] = {
    {"get", (PyCFunction)cm_get_method, METH_VARARGS, "The chunk at an address, or the default (None)."},
    {"pop", (PyCFunction)cm_pop, METH_VARARGS, "Remove and give the chunk at an address (or the default)."},
    {"items", (PyCFunction)cm_items, METH_NOARGS, "A list of (address, chunk) pairs."},
    {"keys", (PyCFunction)cm_keys, METH_NOARGS, "A list of the chunk addresses."},
    {"nbytes", (PyCFunction)cm_nbytes, METH_NOARGS, "Bytes of the record table and target pool (not the side dict)."},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods cm_mapping = {(lenfunc)cm_len, (binaryfunc)cm_subscript, (objobjargproc)cm_ass};
static PySequenceMethods cm_sequence = {.sq_contains = (objobjproc)cm_contains};

static PyTypeObject ChunkMapType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "binlens.analysis.native._descent.ChunkMap",
    .tp_basicsize = sizeof(ChunkMap),
    .tp_dealloc = (destructor)cm_dealloc,
    .tp_as_mapping = &cm_mapping,
    .tp_as_sequence = &cm_sequence,
    .tp_iter = (getiterfunc)cm_iter,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The explorer's chunks {va: (end, terminator, targets, last)} in flat records (see _chunkmap.h).",
    .tp_methods = cm_methods,
    .tp_new = PyType_GenericNew,
};
