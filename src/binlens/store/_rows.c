/* binlens.store._rows: the analysis rows' packers of `store/analysis_save.py`, in C.
 *
 * `pack_by_owner` groups and packs references by the function that owns their source
 * (`analysis_save._xref_packs`); `merge_spans` merges two runs of owner spans in place
 * (`analysis_save.merge_function_rows`). Each gives the results of the Python code beside it,
 * which runs where this extension was not built or when `BINLENS_PURE_PYTHON` is set.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../analysis/native/_packedrefs.h"

/* little-endian u64 at p */
static void put_u64(unsigned char *p, unsigned long long v) {
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* pack_by_owner(starts, ends, fns, xrefs, codes) -> [(owner | None, data, kinds)]
 *
 * store.analysis._xref_packs in one pass: each reference goes to the function owning its source
 * (`fns` of the last span start at or below it, if the source is below that span's end; None
 * otherwise), groups in the order of their first reference; per group, little-endian u64 (src, dst) pairs and
 * one byte of kind (`codes[kind]`) each. `starts` is sorted; `ends` and `fns` go with it. `xrefs` is a
 * list of `Xref`, or packed references: a tuple (src, dst, kind) of buffers (u64, u64 and one byte
 * each, the byte already the kind's code; `model.Refs`). `starts`, `ends` and `fns` are lists of ints or
 * arrays of u64 (`store.analysis_save.owner_spans` gives arrays). */
/* a span column: a list of ints, or a buffer of u64 (an array 'Q'); its length, -1 on error */
static Py_ssize_t span_column(PyObject *o, Py_buffer *view) {
    if (PyList_Check(o))
        return PyList_GET_SIZE(o);
    if (PyObject_GetBuffer(o, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->itemsize != 8 || !view->format || (strcmp(view->format, "Q") && strcmp(view->format, "L"))) {
        PyBuffer_Release(view);
        view->obj = NULL;
        PyErr_SetString(PyExc_TypeError, "starts, ends and fns: lists of ints or arrays of u64 ('Q')");
        return -1;
    }
    return view->len / 8;
}

/* item i of a span column (a new reference for an int object made from a buffer) */
static unsigned long long span_word(PyObject *o, const Py_buffer *view, Py_ssize_t i) {
    return view->obj ? ((const unsigned long long *)view->buf)[i] : PyLong_AsUnsignedLongLong(PyList_GET_ITEM(o, i));
}

static PyObject *span_item(PyObject *o, const Py_buffer *view, Py_ssize_t i) {
    return view->obj ? PyLong_FromUnsignedLongLong(((const unsigned long long *)view->buf)[i])
                     : Py_NewRef(PyList_GET_ITEM(o, i));
}

static PyObject *pack_by_owner(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *starts, *ends, *fns, *xrefs, *codes;
    if (!PyArg_ParseTuple(args, "OOOOO!", &starts, &ends, &fns, &xrefs, &PyDict_Type, &codes))
        return NULL;
    Py_buffer pb[3] = {{0}, {0}, {0}}, sv[3] = {{0}, {0}, {0}};
    int packed = PyTuple_Check(xrefs);
    if (!packed && !PyList_Check(xrefs)) {
        PyErr_SetString(PyExc_TypeError, "xrefs: a list of Xref or a tuple (src, dst, kind) of buffers");
        return NULL;
    }
    Py_ssize_t ns = span_column(starts, &sv[0]), ne = ns < 0 ? -1 : span_column(ends, &sv[1]),
               nf = ne < 0 ? -1 : span_column(fns, &sv[2]), nx = packed ? 0 : PyList_GET_SIZE(xrefs);
    if (nf < 0 || (packed && refs_buffers(xrefs, pb, 0) < 0)) {
        refs_release(sv);
        return NULL;
    }
    if (packed)
        nx = pb[2].len;
    if (ne != ns || nf != ns) {
        PyErr_SetString(PyExc_ValueError, "starts, ends and fns differ in length");
        refs_release(pb);
        refs_release(sv);
        return NULL;
    }
    PyObject *out = NULL, *s_src = PyUnicode_InternFromString("src"), *s_dst = PyUnicode_InternFromString("dst"),
             *s_kind = PyUnicode_InternFromString("kind");
    unsigned long long *st = PyMem_Malloc(sizeof(*st) * (ns + 1)), *en = PyMem_Malloc(sizeof(*en) * (ns + 1));
    /* packed: the buffers themselves (read only); else copies of the objects' fields */
    unsigned long long *src = packed ? pb[0].buf : PyMem_Malloc(sizeof(*src) * (nx + 1));
    unsigned long long *dst = packed ? pb[1].buf : PyMem_Malloc(sizeof(*dst) * (nx + 1));
    unsigned char *kind = packed ? pb[2].buf : PyMem_Malloc(nx + 1);
    Py_ssize_t *grp = PyMem_Malloc(sizeof(*grp) * (nx + 1));      /* each reference's group */
    Py_ssize_t *fid = PyMem_Malloc(sizeof(*fid) * (ns + 1));      /* span -> its function's first span + 1 */
    Py_ssize_t *gid = PyMem_Malloc(sizeof(*gid) * (ns + 2));      /* that + 1 (0: no function) -> group */
    Py_ssize_t *gspan = PyMem_Malloc(sizeof(*gspan) * (ns + 2));  /* group -> that + 1 */
    PyObject *first = PyDict_New();                                /* function -> its first span */
    Py_ssize_t *gcount = PyMem_Calloc(ns + 2, sizeof(*gcount));
    Py_ssize_t *gfill = PyMem_Calloc(ns + 2, sizeof(*gfill));
    PyObject **data = PyMem_Calloc(ns + 2, sizeof(*data)), **kinds = PyMem_Calloc(ns + 2, sizeof(*kinds));
    Py_ssize_t ngroups = 0;
    if (!s_src || !s_dst || !s_kind || !st || !en || (!packed && (!src || !dst || !kind)) || !grp || !fid || !gid || !gspan ||
        !first || !gcount || !gfill || !data || !kinds) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < ns; i++) {
        st[i] = span_word(starts, &sv[0], i);
        en[i] = span_word(ends, &sv[1], i);
        if (PyErr_Occurred())
            goto done;
        PyObject *at = PyLong_FromSsize_t(i), *fn = span_item(fns, &sv[2], i), *was = NULL;
        if (!at || !fn || !(was = PyDict_SetDefault(first, fn, at))) {
            Py_XDECREF(at);
            Py_XDECREF(fn);
            goto done;
        }
        fid[i] = PyLong_AsSsize_t(was) + 1;
        Py_DECREF(at);
        Py_DECREF(fn);
    }
    for (Py_ssize_t i = 0; i < ns + 2; i++)
        gid[i] = -1;
    for (Py_ssize_t i = 0; i < nx; i++) {
        if (!packed) { /* the fields of an Xref */
            PyObject *x = PyList_GET_ITEM(xrefs, i), *v;
            if (!(v = PyObject_GetAttr(x, s_src)))
                goto done;
            src[i] = PyLong_AsUnsignedLongLong(v);
            Py_DECREF(v);
            if (!(v = PyObject_GetAttr(x, s_dst)))
                goto done;
            dst[i] = PyLong_AsUnsignedLongLong(v);
            Py_DECREF(v);
            if (PyErr_Occurred() || !(v = PyObject_GetAttr(x, s_kind)))
                goto done;
            PyObject *code = PyDict_GetItemWithError(codes, v);
            Py_DECREF(v);
            if (!code) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_KeyError, "a reference kind without a code");
                goto done;
            }
            long c = PyLong_AsLong(code);
            if (c < 0 || c > 255) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "a kind code outside 0..255");
                goto done;
            }
            kind[i] = (unsigned char)c;
        }
        /* the last start <= src (bisect_right - 1) */
        Py_ssize_t lo = 0, hi = ns;
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (src[i] < st[mid])
                hi = mid;
            else
                lo = mid + 1;
        }
        Py_ssize_t span = lo - 1;
        Py_ssize_t key = (span >= 0 && src[i] < en[span]) ? fid[span] : 0;
        if (gid[key] < 0) {
            gid[key] = ngroups;
            gspan[ngroups++] = key;
        }
        grp[i] = gid[key];
        gcount[grp[i]]++;
    }
    for (Py_ssize_t g = 0; g < ngroups; g++) {
        data[g] = PyBytes_FromStringAndSize(NULL, 16 * gcount[g]);
        kinds[g] = PyBytes_FromStringAndSize(NULL, gcount[g]);
        if (!data[g] || !kinds[g])
            goto done;
    }
    for (Py_ssize_t i = 0; i < nx; i++) {
        Py_ssize_t g = grp[i], k = gfill[g]++;
        unsigned char *d = (unsigned char *)PyBytes_AS_STRING(data[g]) + 16 * k;
        put_u64(d, src[i]);
        put_u64(d + 8, dst[i]);
        ((unsigned char *)PyBytes_AS_STRING(kinds[g]))[k] = kind[i];
    }
    if (!(out = PyList_New(ngroups)))
        goto done;
    for (Py_ssize_t g = 0; g < ngroups; g++) {
        PyObject *owner = gspan[g] ? span_item(fns, &sv[2], gspan[g] - 1) : Py_NewRef(Py_None);
        PyObject *t = owner ? PyTuple_Pack(3, owner, data[g], kinds[g]) : NULL;
        Py_XDECREF(owner);
        if (!t) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, g, t);
    }
done:
    if (data && kinds)
        for (Py_ssize_t g = 0; g < ngroups; g++) {
            Py_XDECREF(data[g]);
            Py_XDECREF(kinds[g]);
        }
    Py_XDECREF(s_src);
    Py_XDECREF(s_dst);
    Py_XDECREF(s_kind);
    PyMem_Free(st);
    PyMem_Free(en);
    refs_release(sv);
    if (packed)
        refs_release(pb);
    else {
        PyMem_Free(src);
        PyMem_Free(dst);
        PyMem_Free(kind);
    }
    PyMem_Free(grp);
    PyMem_Free(fid);
    Py_XDECREF(first);
    PyMem_Free(gid);
    PyMem_Free(gspan);
    PyMem_Free(gcount);
    PyMem_Free(gfill);
    PyMem_Free(data);
    PyMem_Free(kinds);
    return out;
}

/* (s, e, f) at place i of three u64 buffers, against place j of three others: <0, 0, >0 */
static int span_cmp(const unsigned long long *const *a, Py_ssize_t i, const unsigned long long *const *b, Py_ssize_t j) {
    for (int k = 0; k < 3; k++)
        if (a[k][i] != b[k][j])
            return a[k][i] < b[k][j] ? -1 : 1;
    return 0;
}

/* merge_spans(s1, e1, f1, s2, e2, f2, n1) -> n: analysis_save.merge_function_rows's merge of owner
 * spans, in place. (s1, e1, f1) are u64 arrays whose first n1 places hold spans sorted by start, one
 * each, and which have room for all of (s2, e2, f2), sorted the same way; the two are merged in
 * (start, end, function) order from the back, then each start is kept once, with the least (end,
 * function), as `owner_spans` keeps it. Returns how many places hold spans (the caller cuts the
 * arrays there). No tuple per span: re-sorting the overlap of two runs as tuples would take ~40 MiB and
 * most of the time of building gcc's cc1's rows, where every batch's cold blocks lie below the
 * runs before it. */
static PyObject *merge_spans(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[6];
    Py_ssize_t n1;
    if (!PyArg_ParseTuple(args, "OOOOOOn", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &n1))
        return NULL;
    Py_buffer pb[6];
    int got = 0;
    PyObject *out = NULL;
    for (; got < 6; got++)
        if (PyObject_GetBuffer(o[got], &pb[got], got < 3 ? PyBUF_WRITABLE | PyBUF_FORMAT : PyBUF_FORMAT) < 0)
            goto done;
    for (int k = 0; k < 6; k++)
        if (pb[k].itemsize != 8 || pb[k].len != pb[k < 3 ? 0 : 3].len) {
            PyErr_SetString(PyExc_ValueError, "spans: three u64 arrays of one length, twice");
            goto done;
        }
    Py_ssize_t n2 = pb[3].len / 8, cap = pb[0].len / 8;
    if (n1 < 0 || n1 + n2 > cap) {
        PyErr_SetString(PyExc_ValueError, "spans: the first arrays have no room for the second");
        goto done;
    }
    unsigned long long *a[3] = {pb[0].buf, pb[1].buf, pb[2].buf};
    const unsigned long long *b[3] = {pb[3].buf, pb[4].buf, pb[5].buf};
    Py_ssize_t i = n1 - 1, j = n2 - 1, w = n1 + n2 - 1, lo = n1;
    while (j >= 0) {
        if (i >= 0 && span_cmp((const unsigned long long *const *)a, i, b, j) > 0) {
            for (int k = 0; k < 3; k++)
                a[k][w] = a[k][i];
            i--;
        } else {
            for (int k = 0; k < 3; k++)
                a[k][w] = b[k][j];
            j--;
        }
        lo = w--;
    }
    /* each start once, from the first place a span of the second run went to (before it, the first
     * run's starts are distinct already) */
    Py_ssize_t n = n1 + n2, keep = lo > 0 ? lo : 0;
    if (keep > 0)
        keep--; /* (the place before may hold the start the first merged span repeats) */
    Py_ssize_t put = keep + (n > 0 ? 1 : 0);
    for (Py_ssize_t r = keep + 1; r < n; r++) {
        if (a[0][r] == a[0][put - 1])
            continue;
        for (int k = 0; k < 3; k++)
            a[k][put] = a[k][r];
        put++;
    }
    out = PyLong_FromSsize_t(n > 0 ? put : 0);
done:
    for (int k = 0; k < got; k++)
        PyBuffer_Release(&pb[k]);
    return out;
}

static PyMethodDef methods[] = {
    {"pack_by_owner", pack_by_owner, METH_VARARGS,
     "analysis_save._xref_packs's grouping and packing of references (see the module source)."},
    {"merge_spans", merge_spans, METH_VARARGS, "analysis_save.merge_function_rows's merge of spans (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rows", "The analysis rows' packers in C (see store/analysis_save.py).", -1, methods, NULL,
    NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rows(void) { return PyModule_Create(&module); }
