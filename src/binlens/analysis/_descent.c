/* binlens.analysis._descent: the loop of `discovery.Explorer.traverse`, in C.
 *
 * The same walk over the same Python containers (the chunk dict, the predecessor dicts, the
 * reached and call sets), in the same order: every push and pop, every first-seen predecessor and
 * every callback happens as in the Python loop it replaces, so the results are identical (the
 * explorer decodes chunks lazily, and the order in which they are first reached decides which of
 * two overlapping decodings wins). What it saves is the interpreter's per-chunk work: libc.so.6
 * reaches ~80k chunks per walk. New chunks come from `fast(va)` (the x86 scanner: a tuple, False
 * when the Python path must decide, None outside the code) and else from `chunk(va)`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static long T_FALL, T_JUMP, T_COND, T_CALL, T_ICALL, T_IJUMP;
static int configured;

static PyObject *configure(PyObject *self, PyObject *args) {
    (void)self;
    if (!PyArg_ParseTuple(args, "llllll", &T_FALL, &T_JUMP, &T_COND, &T_CALL, &T_ICALL, &T_IJUMP))
        return NULL;
    configured = 1;
    Py_RETURN_NONE;
}

/* pop the last item of a list (a new reference) */
static PyObject *pop(PyObject *list) {
    Py_ssize_t n = PyList_GET_SIZE(list);
    PyObject *item = PyList_GET_ITEM(list, n - 1);
    Py_INCREF(item);
    if (PyList_SetSlice(list, n - 1, n, NULL) < 0) {
        Py_DECREF(item);
        return NULL;
    }
    return item;
}

/* the chunk at `a` (a new reference), Py_None when there is none, NULL on error */
static PyObject *get_chunk(PyObject *chunks, PyObject *fast, PyObject *chunk, PyObject *a) {
    PyObject *c = PyDict_GetItemWithError(chunks, a);
    if (c != NULL)
        return Py_NewRef(c);
    if (PyErr_Occurred())
        return NULL;
    if (fast != Py_None) {
        c = PyObject_CallOneArg(fast, a);
        if (c == NULL)
            return NULL;
        if (PyTuple_Check(c)) {
            if (PyDict_SetItem(chunks, a, c) < 0) {
                Py_DECREF(c);
                return NULL;
            }
            return c;
        }
        if (c == Py_None)
            return c;
        Py_DECREF(c); /* False: the Python path decides */
    }
    return PyObject_CallOneArg(chunk, a);
}

static int set_pred(PyObject *pred, PyObject *x, PyObject *a, PyObject *stack) {
    if (PyDict_SetItem(pred, x, a) < 0)
        return -1;
    return PyList_Append(stack, x);
}

/* traverse(stack, reached, calls, noret, chunks, pred, jpred, cpred, fast, chunk, cases, fresh, progress)
 *
 * Walks from the addresses on `stack` (consumed) as `Explorer.traverse` does; `cpred`, `fresh`
 * and `progress` may be None, `fast` too. `cases(chunk_start, last)` gives an indirect jump's case
 * targets. Returns None. */
static PyObject *traverse(PyObject *self, PyObject *args) {
    PyObject *stack, *reached, *calls, *noret, *chunks, *pred, *jpred, *cpred, *fast, *chunk, *cases, *fresh, *progress;
    (void)self;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "_descent.configure() was not called");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!O!O!OO!O!O!OOOOOO", &PyList_Type, &stack, &PySet_Type, &reached, &PySet_Type, &calls,
                          &noret, &PyDict_Type, &chunks, &PyDict_Type, &pred, &PyDict_Type, &jpred, &cpred, &fast,
                          &chunk, &cases, &fresh, &progress))
        return NULL;
    if (!PyAnySet_Check(noret) || (cpred != Py_None && !PyDict_Check(cpred)) ||
        (fresh != Py_None && !PyList_Check(fresh))) {
        PyErr_SetString(PyExc_TypeError, "noret: a set; cpred: a dict or None; fresh: a list or None");
        return NULL;
    }
    unsigned long long covered = 0;
    unsigned long tick = 0;
    while (PyList_GET_SIZE(stack) > 0) {
        PyObject *a = pop(stack), *c = NULL;
        if (a == NULL)
            return NULL;
        int seen = PySet_Contains(reached, a);
        if (seen != 0) {
            Py_DECREF(a);
            if (seen < 0)
                return NULL;
            continue;
        }
        c = get_chunk(chunks, fast, chunk, a);
        if (c == NULL)
            goto fail;
        if (c == Py_None) {
            Py_DECREF(c);
            Py_DECREF(a);
            continue;
        }
        if (!PyTuple_Check(c) || PyTuple_GET_SIZE(c) != 4 || !PyTuple_Check(PyTuple_GET_ITEM(c, 2))) {
            PyErr_SetString(PyExc_TypeError, "a chunk is (end, terminator, targets, last)");
            goto fail;
        }
        if (PySet_Add(reached, a) < 0 || (fresh != Py_None && PyList_Append(fresh, a) < 0))
            goto fail;
        PyObject *end = PyTuple_GET_ITEM(c, 0), *t = PyTuple_GET_ITEM(c, 2), *last = PyTuple_GET_ITEM(c, 3);
        long term = PyLong_AsLong(PyTuple_GET_ITEM(c, 1));
        Py_ssize_t nt = PyTuple_GET_SIZE(t);
        if (term == -1 && PyErr_Occurred())
            goto fail;
        if (term == T_COND && nt >= 2) {
            if (set_pred(pred, PyTuple_GET_ITEM(t, 1), a, stack) < 0 || PyList_Append(stack, PyTuple_GET_ITEM(t, 0)) < 0)
                goto fail;
            if (cpred != Py_None) {
                PyObject *r = PyDict_SetDefault(cpred, PyTuple_GET_ITEM(t, 0), a);
                if (r == NULL)
                    goto fail;
            }
        } else if (term == T_FALL && nt >= 1) {
            if (set_pred(pred, PyTuple_GET_ITEM(t, 0), a, stack) < 0)
                goto fail;
        } else if (term == T_CALL && nt >= 2) {
            PyObject *x = PyTuple_GET_ITEM(t, 0);
            if (PySet_Add(calls, x) < 0 || PyList_Append(stack, x) < 0)
                goto fail;
            int nr = PySet_Contains(noret, x);
            if (nr < 0 || (!nr && set_pred(pred, PyTuple_GET_ITEM(t, 1), a, stack) < 0))
                goto fail;
        } else if (term == T_JUMP && nt >= 1) {
            PyObject *x = PyTuple_GET_ITEM(t, 0);
            if (PyDict_SetDefault(jpred, x, a) == NULL || PyList_Append(stack, x) < 0)
                goto fail;
        } else if (term == T_ICALL && nt >= 2) {
            int nr = PySet_Contains(noret, PyTuple_GET_ITEM(t, 0));
            if (nr < 0 || (!nr && set_pred(pred, PyTuple_GET_ITEM(t, 1), a, stack) < 0))
                goto fail;
        } else if (term == T_IJUMP) {
            PyObject *targets = PyObject_CallFunctionObjArgs(cases, a, last, NULL);
            if (targets == NULL)
                goto fail;
            Py_ssize_t n = PyList_GET_SIZE(stack);
            int rc = PyList_SetSlice(stack, n, n, targets); /* stack.extend(targets) */
            Py_DECREF(targets);
            if (rc < 0 || (nt > 1 && set_pred(pred, PyTuple_GET_ITEM(t, 1), a, stack) < 0))
                goto fail;
        }
        if (progress != Py_None) {
            covered += PyLong_AsUnsignedLongLong(end) - PyLong_AsUnsignedLongLong(a);
            if (PyErr_Occurred())
                goto fail;
            if (!(++tick & 4095)) {
                PyObject *r = PyObject_CallFunction(progress, "KOO", covered, Py_None, Py_None);
                if (r == NULL)
                    goto fail;
                Py_DECREF(r);
            }
        }
        Py_DECREF(c);
        Py_DECREF(a);
        continue;
    fail:
        Py_XDECREF(c);
        Py_DECREF(a);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "Set the engine's terminator codes: configure(T_FALL, T_JUMP, T_COND, T_CALL, T_ICALL, T_IJUMP)."},
    {"traverse", traverse, METH_VARARGS, "Explorer.traverse's walk (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_descent", "Explorer.traverse's walk in C (see discovery.py).", -1, methods, NULL, NULL,
    NULL, NULL,
};

PyMODINIT_FUNC PyInit__descent(void) { return PyModule_Create(&module); }
