/* AddrBits: a set of addresses inside the code regions, one bit per byte of code.
 *
 * The explorer's reached set holds the start of every chunk a walk reached: a Python set of ints
 * costs 16 bytes a slot at most 60% full (gcc's cc1: 1.33M chunks, a 64 MiB table; libc.so.6 4 MiB),
 * here it is a bit per code byte (cc1 2.5 MiB, libc 0.17 MiB). It behaves as the set did for the
 * uses the engine makes of it (`add`, `in`, `len`, iteration, `clear`); an address outside the
 * regions, or anything that is no int of 0..2**64-1, goes to a side set, so it holds anything the
 * set held. Iteration gives the region members in ascending order, then the side set's.
 *
 * The C walk of `_descent.c` takes either a set or an AddrBits (`reached_has`, `reached_add`).
 */

typedef struct {
    PyObject_HEAD Py_ssize_t nreg;
    unsigned long long *lo, *len; /* the regions [lo, lo + len), ascending, not overlapping (one may end at 2**64) */
    unsigned char **bits;        /* per region, a bit per byte */
    Py_ssize_t n;                /* members in the regions */
    Py_ssize_t last;             /* the region of the last look-up */
    PyObject *other;             /* set: the members outside the regions */
} AddrBits;

static PyTypeObject AddrBitsType;
#define IS_AB(o) (Py_TYPE(o) == &AddrBitsType)

static void ab_free(AddrBits *s) {
    for (Py_ssize_t k = 0; k < s->nreg; k++)
        if (s->bits)
            PyMem_Free(s->bits[k]);
    PyMem_Free(s->bits);
    PyMem_Free(s->lo);
    PyMem_Free(s->len);
    s->bits = NULL, s->lo = s->len = NULL, s->nreg = 0, s->n = 0;
}

static void ab_dealloc(AddrBits *s) {
    ab_free(s);
    Py_XDECREF(s->other);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* AddrBits(regions): `regions` an iterable of (start, size) pairs */
static int ab_init(AddrBits *s, PyObject *args, PyObject *kwds) {
    PyObject *regions, *seq = NULL;
    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "AddrBits takes no keyword arguments");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "O", &regions))
        return -1;
    ab_free(s);
    Py_CLEAR(s->other);
    if (!(seq = PySequence_Fast(regions, "regions: an iterable of (start, size) pairs")))
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    s->lo = PyMem_Calloc(n + 1, sizeof(*s->lo));
    s->len = PyMem_Calloc(n + 1, sizeof(*s->len));
    s->bits = PyMem_Calloc(n + 1, sizeof(*s->bits));
    if (!s->lo || !s->len || !s->bits) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        unsigned long long start, size;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, k), "KK;a region is (start, size)", &start, &size))
            goto fail;
        if ((size && start > ~0ULL - (size - 1)) ||
            (k && (start < s->lo[k - 1] || start - s->lo[k - 1] < s->len[k - 1]))) {
            PyErr_SetString(PyExc_ValueError, "regions: ascending, not overlapping, within 2**64");
            goto fail;
        }
        s->nreg = k + 1; /* (so that ab_free frees what is allocated) */
        s->lo[k] = start, s->len[k] = size;
        if (!(s->bits[k] = PyMem_Calloc((size_t)(size / 8 + 1), 1))) {
            PyErr_NoMemory();
            goto fail;
        }
    }
    s->nreg = n;
    Py_DECREF(seq);
    return 0;
fail:
    Py_XDECREF(seq);
    ab_free(s);
    return -1;
}

/* the region holding `a`, or -1 */
static Py_ssize_t ab_region(AddrBits *s, unsigned long long a) {
    Py_ssize_t k = s->last;
    if (k < s->nreg && s->lo[k] <= a && a - s->lo[k] < s->len[k])
        return k;
    Py_ssize_t lo = 0, hi = s->nreg; /* the last region starting at or below a */
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (s->lo[mid] <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    k = lo - 1;
    if (k < 0 || a - s->lo[k] >= s->len[k])
        return -1;
    s->last = k;
    return k;
}

/* where `a` has its bit: 1 (region *k, offset *off), 0 when it belongs to the side set (no error set) */
static int ab_where(AddrBits *s, PyObject *a, Py_ssize_t *k, unsigned long long *off) {
    if (!PyLong_CheckExact(a))
        return 0;
    unsigned long long v = PyLong_AsUnsignedLongLong(a);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *k = ab_region(s, v);
    if (*k < 0)
        return 0;
    *off = v - s->lo[*k];
    return 1;
}

static int ab_contains(AddrBits *s, PyObject *a) {
    Py_ssize_t k;
    unsigned long long off;
    if (ab_where(s, a, &k, &off))
        return (s->bits[k][off >> 3] >> (off & 7)) & 1;
    return s->other ? PySet_Contains(s->other, a) : 0;
}

static int ab_add_one(AddrBits *s, PyObject *a) {
    Py_ssize_t k;
    unsigned long long off;
    if (ab_where(s, a, &k, &off)) {
        unsigned char m = (unsigned char)(1u << (off & 7)), *b = &s->bits[k][off >> 3];
        if (!(*b & m))
            *b |= m, s->n++;
        return 0;
    }
    if (!s->other && !(s->other = PySet_New(NULL)))
        return -1;
    return PySet_Add(s->other, a);
}

static PyObject *ab_add(AddrBits *s, PyObject *a) {
    if (ab_add_one(s, a) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *ab_discard(AddrBits *s, PyObject *a) {
    Py_ssize_t k;
    unsigned long long off;
    if (ab_where(s, a, &k, &off)) {
        unsigned char m = (unsigned char)(1u << (off & 7)), *b = &s->bits[k][off >> 3];
        if (*b & m)
            *b &= (unsigned char)~m, s->n--;
        Py_RETURN_NONE;
    }
    if (s->other && PySet_Discard(s->other, a) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *ab_clear(AddrBits *s, PyObject *Py_UNUSED(ignored)) {
    for (Py_ssize_t k = 0; k < s->nreg; k++)
        memset(s->bits[k], 0, (size_t)(s->len[k] / 8 + 1));
    s->n = 0;
    Py_CLEAR(s->other);
    Py_RETURN_NONE;
}

static Py_ssize_t ab_len(AddrBits *s) { return s->n + (s->other ? PySet_GET_SIZE(s->other) : 0); }

/* ------------------------------------------ list building shared by the listings of AddrBits,
 * ChunkMap and PredMap */

/* out.append(x), taking x's reference (x NULL: an error is set): 0, or -1 */
static int append_new(PyObject *out, PyObject *x) {
    if (!x)
        return -1;
    int r = PyList_Append(out, x);
    Py_DECREF(x);
    return r;
}

/* `out` with the items of `rest` after them, taking both references (rest NULL: an error is set);
 * NULL when it fails, both released */
static PyObject *extend_new(PyObject *out, PyObject *rest) {
    Py_ssize_t n = PyList_GET_SIZE(out);
    if (!rest || PyList_SetSlice(out, n, n, rest) < 0) {
        Py_XDECREF(rest);
        Py_DECREF(out);
        return NULL;
    }
    Py_DECREF(rest);
    return out;
}

/* the members as a list: the regions' in ascending order, then the side set's */
static PyObject *ab_list(AddrBits *s) {
    PyObject *out = PyList_New(0);
    if (!out)
        return NULL;
    for (Py_ssize_t k = 0; k < s->nreg; k++) {
        unsigned long long size = s->len[k];
        for (unsigned long long i = 0; i < size; i += 8) {
            unsigned char b = s->bits[k][i >> 3];
            for (int j = 0; b; j++, b >>= 1) {
                if (!(b & 1))
                    continue;
                if (append_new(out, PyLong_FromUnsignedLongLong(s->lo[k] + i + (unsigned long long)j)) < 0) {
                    Py_DECREF(out);
                    return NULL;
                }
            }
        }
    }
    return s->other ? extend_new(out, PySequence_List(s->other)) : out;
}

static PyObject *ab_iter(AddrBits *s) {
    PyObject *members = ab_list(s), *it = members ? PyObject_GetIter(members) : NULL;
    Py_XDECREF(members);
    return it;
}

static PyObject *ab_nbytes(AddrBits *s, PyObject *Py_UNUSED(ignored)) {
    size_t n = 0;
    for (Py_ssize_t k = 0; k < s->nreg; k++)
        n += (size_t)(s->len[k] / 8 + 1);
    return PyLong_FromSize_t(n);
}

/* the walk's reached set: an AddrBits or a set (1, 0, -1 on error) */
static int reached_has(PyObject *r, PyObject *a) {
    return IS_AB(r) ? ab_contains((AddrBits *)r, a) : PySet_Contains(r, a);
}

static int reached_add(PyObject *r, PyObject *a) {
    return IS_AB(r) ? ab_add_one((AddrBits *)r, a) : PySet_Add(r, a);
}

static PyMethodDef ab_methods[] = {
    {"add", (PyCFunction)ab_add, METH_O, "Add an address."},
    {"discard", (PyCFunction)ab_discard, METH_O, "Remove an address if it is there."},
    {"clear", (PyCFunction)ab_clear, METH_NOARGS, "Remove every address."},
    {"nbytes", (PyCFunction)ab_nbytes, METH_NOARGS, "Bytes of the bit maps (not the side set)."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods ab_sequence = {.sq_length = (lenfunc)ab_len, .sq_contains = (objobjproc)ab_contains};

static PyTypeObject AddrBitsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "binlens.analysis.native._descent.AddrBits",
    .tp_basicsize = sizeof(AddrBits),
    .tp_dealloc = (destructor)ab_dealloc,
    .tp_as_sequence = &ab_sequence,
    .tp_iter = (getiterfunc)ab_iter,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A set of addresses in the code regions, a bit per byte of code (see _addrbits.h).",
    .tp_methods = ab_methods,
    .tp_init = (initproc)ab_init,
    .tp_new = PyType_GenericNew,
};
