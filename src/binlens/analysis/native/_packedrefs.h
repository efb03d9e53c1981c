/* The packed references of `analysis.model.Refs` as C sees them: a tuple (src, dst, kind) of three
 * buffers, u64, u64 and one byte each, of one length. Shared by `analysis/native/_descent.c` (sort_refs)
 * and `store/_rows.c` (pack_by_owner). */
#ifndef BINLENS_PACKEDREFS_H
#define BINLENS_PACKEDREFS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

static void refs_release(Py_buffer *pb) {
    for (int i = 0; i < 3; i++)
        if (pb[i].obj)
            PyBuffer_Release(&pb[i]);
}

static int refs_buffers(PyObject *t, Py_buffer *pb, int writable) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3) {
        PyErr_SetString(PyExc_TypeError, "packed references: a tuple (src, dst, kind) of buffers");
        return -1;
    }
    int flags = writable ? PyBUF_WRITABLE | PyBUF_FORMAT : PyBUF_FORMAT;
    for (int i = 0; i < 3; i++)
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(t, i), &pb[i], flags) < 0) {
            refs_release(pb);
            return -1;
        }
    if (pb[0].itemsize != 8 || pb[1].itemsize != 8 || pb[2].itemsize != 1 || pb[0].len != pb[1].len ||
        pb[0].len / 8 != pb[2].len) {
        PyErr_SetString(PyExc_ValueError, "packed references: src and dst of u64, kind of bytes, one length");
        refs_release(pb);
        return -1;
    }
    return 0;
}

#endif
