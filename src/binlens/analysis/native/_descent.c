/* binlens.analysis.native._descent: the loop of `discovery.Explorer.traverse`, in C.
 *
 * The same walk over the same Python containers (the chunk dict or ChunkMap, the predecessor dicts,
 * the reached set or AddrBits, the call set), in the same order: every push and pop, every first-seen predecessor and
 * every callback happens as in the Python loop it replaces, so the results are identical (the
 * explorer decodes chunks lazily, and the order in which they are first reached decides which of
 * two overlapping decodings wins). What it saves is the interpreter's per-chunk work: libc.so.6
 * reaches ~80k chunks per walk. New chunks come from `fast(va)` (the x86 scanner: a tuple, False
 * when the Python path must decide, None outside the code) and else from `chunk(va)`.
 *
 * `body` is `Explorer.walk_body`, the walk of one function that the partition runs for every function.
 * `cover` and `body_spans` are the gap heuristic's coverage map and entry runs (`heuristics/gapmap.py`),
 * `covered` the engine's count of covered bytes.
 * `merge` is the chunk merge of `functions._blocks`; `sort_refs` sorts, de-duplicates and re-tags
 * packed references (`xrefs.collect_refs`). The store's row packers are `store/_rows.c`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_addrbits.h"
#include "_chunkmap.h"
#include "_packedrefs.h"
#include "_predmap.h"

static long T_FALL, T_JUMP, T_COND, T_CALL, T_ICALL, T_IJUMP, T_RET = -1, T_BAD = -1;
static int configured;
/* the edge kinds `body` writes itself */
static PyObject *K_TAKEN, *K_CFALL, *K_FALL, *K_CALLRET, *K_JUMP, *ZERO;

static PyObject *configure(PyObject *self, PyObject *args) {
    (void)self;
    if (!PyArg_ParseTuple(args, "llllll|ll", &T_FALL, &T_JUMP, &T_COND, &T_CALL, &T_ICALL, &T_IJUMP, &T_RET, &T_BAD))
        return NULL;
    if (!K_TAKEN) {
        K_TAKEN = PyUnicode_InternFromString("conditional_taken");
        K_CFALL = PyUnicode_InternFromString("conditional_fallthrough");
        K_FALL = PyUnicode_InternFromString("fallthrough");
        K_CALLRET = PyUnicode_InternFromString("call_return");
        K_JUMP = PyUnicode_InternFromString("jump");
        ZERO = PyLong_FromLong(0);
        if (!K_TAKEN || !K_CFALL || !K_FALL || !K_CALLRET || !K_JUMP || !ZERO)
            return NULL;
    }
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

/* `chunks` is a dict or a ChunkMap (else a TypeError) */
static int chunks_ok(PyObject *chunks) {
    if (PyDict_Check(chunks) || IS_CM(chunks))
        return 1;
    PyErr_SetString(PyExc_TypeError, "chunks: a dict or a ChunkMap");
    return 0;
}

/* the chunk at `a` (a new reference), Py_None when there is none, NULL on error */
static PyObject *get_chunk(PyObject *chunks, PyObject *fast, PyObject *chunk, PyObject *a) {
    PyObject *c = chunk_at(chunks, a);
    if (c != NULL)
        return c;
    if (PyErr_Occurred())
        return NULL;
    if (fast != Py_None) {
        c = PyObject_CallOneArg(fast, a);
        if (c == NULL)
            return NULL;
        if (PyTuple_Check(c)) {
            if (chunk_put(chunks, a, c) < 0) {
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
    if (pred_put(pred, x, a) < 0)
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
    if (!PyArg_ParseTuple(args, "O!OO!OOOOOOOOOO", &PyList_Type, &stack, &reached, &PySet_Type, &calls, &noret,
                          &chunks, &pred, &jpred, &cpred, &fast, &chunk, &cases, &fresh, &progress))
        return NULL;
    if (!pred_ok(pred) || !pred_ok(jpred)) {
        PyErr_SetString(PyExc_TypeError, "pred, jpred: a dict or a PredMap");
        return NULL;
    }
    if (!chunks_ok(chunks))
        return NULL;
    if (!PySet_Check(reached) && !IS_AB(reached)) {
        PyErr_SetString(PyExc_TypeError, "reached: a set or an AddrBits");
        return NULL;
    }
    if (!PyAnySet_Check(noret) || (cpred != Py_None && !pred_ok(cpred)) || (fresh != Py_None && !PyList_Check(fresh))) {
        PyErr_SetString(PyExc_TypeError, "noret: a set; cpred: a dict, a PredMap or None; fresh: a list or None");
        return NULL;
    }
    unsigned long long covered = 0;
    unsigned long tick = 0;
    while (PyList_GET_SIZE(stack) > 0) {
        PyObject *a = pop(stack), *c = NULL;
        if (a == NULL)
            return NULL;
        int seen = reached_has(reached, a);
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
        if (reached_add(reached, a) < 0 || (fresh != Py_None && PyList_Append(fresh, a) < 0))
            goto fail;
        PyObject *end = PyTuple_GET_ITEM(c, 0), *t = PyTuple_GET_ITEM(c, 2), *last = PyTuple_GET_ITEM(c, 3);
        long term = PyLong_AsLong(PyTuple_GET_ITEM(c, 1));
        Py_ssize_t nt = PyTuple_GET_SIZE(t);
        if (term == -1 && PyErr_Occurred())
            goto fail;
        if (term == T_COND && nt >= 2) {
            if (set_pred(pred, PyTuple_GET_ITEM(t, 1), a, stack) < 0 || PyList_Append(stack, PyTuple_GET_ITEM(t, 0)) < 0)
                goto fail;
            if (cpred != Py_None && pred_setdefault(cpred, PyTuple_GET_ITEM(t, 0), a) < 0)
                goto fail;
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
            if (pred_setdefault(jpred, x, a) < 0 || PyList_Append(stack, x) < 0)
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

/* dict[key] += 1 (a count) */
static int count(PyObject *d, PyObject *key) {
    PyObject *n = PyDict_GetItemWithError(d, key);
    if (n == NULL && PyErr_Occurred())
        return -1;
    PyObject *m = PyLong_FromLong(n == NULL ? 1 : PyLong_AsLong(n) + 1);
    if (m == NULL)
        return -1;
    int rc = PyDict_SetItem(d, key, m);
    Py_DECREF(m);
    return rc;
}

static long count_of(PyObject *d, PyObject *key) {
    PyObject *n = PyDict_GetItemWithError(d, key);
    return n == NULL ? 0 : PyLong_AsLong(n);
}

/* merge(chunks, f, body_chunks, edges) -> (blocks, edges)
 *
 * `functions._blocks` without the objects: a function's chunks merged into basic blocks across
 * a single fall-through or call-return edge (the one edge into a chunk, from a chunk with that one
 * successor that ends where it starts), as (start, end, terminator) in address order, and the
 * edges between blocks as (src block, dst, kind), each once, in the body's order (the caller
 * sorts them). `edges` is the body's flat [src, dst, kind, ...] list. */
static PyObject *merge(PyObject *self, PyObject *args) {
    PyObject *chunks, *f, *body, *edges;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOO!O!", &chunks, &f, &PyList_Type, &body, &PyList_Type, &edges) || !chunks_ok(chunks))
        return NULL;
    Py_ssize_t ne = PyList_GET_SIZE(edges) / 3;
    PyObject *npred = PyDict_New(), *succ = PyDict_New(), *via = PyDict_New(), *via_kind = PyDict_New();
    PyObject *owner = PyDict_New(), *index = PyDict_New(), *order = PySequence_List(body);
    PyObject *blocks = PyList_New(0), *keys = NULL, *seen = NULL, *out = NULL;
    if (!npred || !succ || !via || !via_kind || !owner || !index || !order || !blocks)
        goto done;
    for (Py_ssize_t i = 0; i < ne; i++) {
        PyObject *s = PyList_GET_ITEM(edges, 3 * i), *d = PyList_GET_ITEM(edges, 3 * i + 1);
        if (count(npred, d) < 0 || count(succ, s) < 0 || PyDict_SetItem(via, d, s) < 0 ||
            PyDict_SetItem(via_kind, d, PyList_GET_ITEM(edges, 3 * i + 2)) < 0)
            goto done;
    }
    if (PyList_Sort(order) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(order); i++) {
        PyObject *a = PyList_GET_ITEM(order, i), *c = chunk_at(chunks, a), *blk = a;
        if (c == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, a);
            goto done;
        }
        int is_f = PyObject_RichCompareBool(a, f, Py_EQ);
        if (is_f < 0)
            goto done_c;
        if (!is_f && count_of(npred, a) == 1) {
            PyObject *src = PyDict_GetItem(via, a), *kind = PyDict_GetItem(via_kind, a);
            if (src && kind && PyUnicode_Check(kind) &&
                (!PyUnicode_CompareWithASCIIString(kind, "fallthrough") ||
                 !PyUnicode_CompareWithASCIIString(kind, "call_return")) &&
                count_of(succ, src) == 1) { /* a lone edge in from a chunk that ends here: one block */
                unsigned long long sv = PyLong_AsUnsignedLongLong(src), av = PyLong_AsUnsignedLongLong(a), se = 0;
                int has = PyErr_Occurred() ? -1 : chunk_end(chunks, src, sv, &se);
                PyObject *b = has > 0 && se == av ? PyDict_GetItem(owner, src) : NULL;
                if (has < 0)
                    goto done_c;
                if (b != NULL)
                    blk = b;
            }
            if (PyErr_Occurred())
                goto done_c;
        }
        if (PyDict_SetItem(owner, a, blk) < 0)
            goto done_c;
        if (blk == a) { /* a new block */
            PyObject *at = PyLong_FromSsize_t(PyList_GET_SIZE(blocks));
            PyObject *row = at ? PyList_New(3) : NULL;
            if (row == NULL || PyDict_SetItem(index, a, at) < 0 || PyList_Append(blocks, row) < 0) {
                Py_XDECREF(at);
                Py_XDECREF(row);
                goto done_c;
            }
            Py_DECREF(at);
            Py_DECREF(row);
            PyList_SET_ITEM(row, 0, Py_NewRef(a));
            PyList_SET_ITEM(row, 1, Py_NewRef(Py_None));
            PyList_SET_ITEM(row, 2, Py_NewRef(Py_None));
        }
        PyObject *row = PyList_GET_ITEM(blocks, PyLong_AsSsize_t(PyDict_GetItem(index, blk)));
        if (PyList_SetItem(row, 1, Py_NewRef(PyTuple_GET_ITEM(c, 0))) < 0 ||
            PyList_SetItem(row, 2, Py_NewRef(PyTuple_GET_ITEM(c, 1))) < 0)
            goto done_c;
        Py_DECREF(c);
        continue;
    done_c:
        Py_DECREF(c);
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(blocks); i++) { /* [start, end, term] -> (start, end, term) */
        PyObject *t = PyList_AsTuple(PyList_GET_ITEM(blocks, i));
        if (t == NULL)
            goto done;
        PyList_SetItem(blocks, i, t);
    }
    keys = PyList_New(0);
    seen = PySet_New(NULL);
    if (keys == NULL || seen == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < ne; i++) { /* edges into merged chunks go; repeats keep their first place */
        PyObject *s = PyList_GET_ITEM(edges, 3 * i), *d = PyList_GET_ITEM(edges, 3 * i + 1);
        PyObject *od = PyDict_GetItem(owner, d);
        if (od == NULL || PyObject_RichCompareBool(od, d, Py_EQ) != 1)
            continue;
        PyObject *os = PyDict_GetItem(owner, s);
        if (os == NULL) {
            PyErr_SetObject(PyExc_KeyError, s);
            goto done;
        }
        PyObject *key = PyTuple_Pack(3, os, d, PyList_GET_ITEM(edges, 3 * i + 2));
        if (key == NULL)
            goto done;
        int dup = PySet_Contains(seen, key);
        if (dup < 0 || (!dup && (PySet_Add(seen, key) < 0 || PyList_Append(keys, key) < 0))) {
            Py_DECREF(key);
            goto done;
        }
        Py_DECREF(key);
    }
    out = Py_BuildValue("(OO)", blocks, keys);
done:
    Py_XDECREF(npred);
    Py_XDECREF(succ);
    Py_XDECREF(via);
    Py_XDECREF(via_kind);
    Py_XDECREF(owner);
    Py_XDECREF(index);
    Py_XDECREF(order);
    Py_XDECREF(blocks);
    Py_XDECREF(keys);
    Py_XDECREF(seen);
    return out;
}

/* x in container (a set, or anything with `in`): 1, 0, -1 on error */
static int contains(PyObject *container, PyObject *x) {
    return PyAnySet_Check(container) ? PySet_Contains(container, x) : PySequence_Contains(container, x);
}

/* is s a start other than f: 1, 0, -1 */
static int other_start(PyObject *s, PyObject *f, PyObject *starts) {
    if (s == f)
        return 0;
    int ne = PyObject_RichCompareBool(s, f, Py_NE);
    if (ne <= 0)
        return ne;
    return contains(starts, s);
}

static int append_pair(PyObject *list, PyObject *a, PyObject *b) {
    PyObject *t = PyTuple_Pack(2, a, b);
    if (!t)
        return -1;
    int r = PyList_Append(list, t);
    Py_DECREF(t);
    return r;
}

/* edges.extend((a, s, kind)) (unless edges is None: not recorded); then s onto the stack unless seen */
static int edge_and_push(PyObject *edges, PyObject *a, PyObject *s, PyObject *kind, PyObject *seen, PyObject *stack) {
    if (edges != Py_None &&
        (PyList_Append(edges, a) < 0 || PyList_Append(edges, s) < 0 || PyList_Append(edges, kind) < 0))
        return -1;
    int in = PySet_Contains(seen, s);
    if (in < 0)
        return -1;
    if (!in && (PySet_Add(seen, s) < 0 || PyList_Append(stack, s) < 0))
        return -1;
    return 0;
}

/* body(chunks, f, nxt, ext, starts, fragments, noret, b, indirect, leaves) -> (seen, hits, new)
 *
 * `Explorer.walk_body`'s walk of one function from `f`, into the Body `b` (its lists and flags), in
 * the same order. `indirect` is `Explorer._indirect` (an indirect jump's successors) and `leaves`
 * the tail-call test of `discovery/leaves.py`; both are called as the Python walk calls them. */
static PyObject *body(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *chunks, *f, *nxt, *ext, *starts, *fragments, *noret, *b, *indirect, *leaves;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOO", &chunks, &f, &nxt, &ext, &starts, &fragments, &noret, &b, &indirect,
                          &leaves) ||
        !chunks_ok(chunks))
        return NULL;
    if (!configured || T_RET < 0) {
        PyErr_SetString(PyExc_RuntimeError, "_descent.configure was not given T_RET and T_BAD");
        return NULL;
    }
    PyObject *out = NULL, *seen = NULL, *hits = NULL, *new = NULL, *stack = NULL, *case_hi = NULL;
    PyObject *b_chunks = NULL, *edges = NULL, *calls = NULL, *tails = NULL, *cond_tails = NULL;
    int has_ret = 0, open_end = 0, no_ext = !PyObject_IsTrue(ext);
    if (!(seen = PySet_New(NULL)) || !(hits = PySet_New(NULL)) || !(new = PySet_New(NULL)) ||
        !(stack = PyList_New(0)) || !(case_hi = Py_NewRef(ZERO)) || PySet_Add(seen, f) < 0 ||
        PyList_Append(stack, f) < 0 || !(b_chunks = PyObject_GetAttrString(b, "chunks")) ||
        !(edges = PyObject_GetAttrString(b, "edges")) || !(calls = PyObject_GetAttrString(b, "calls")) ||
        !(tails = PyObject_GetAttrString(b, "tails")) || !(cond_tails = PyObject_GetAttrString(b, "cond_tails")))
        goto done;
    while (PyList_GET_SIZE(stack)) {
        PyObject *a = pop(stack), *succ = NULL;
        if (!a)
            goto done;
        PyObject *c = chunk_at(chunks, a); /* (a new reference: the chunks may change in callbacks) */
        if (!c) {
            Py_DECREF(a);
            if (PyErr_Occurred())
                goto done;
            open_end = 1;
            continue;
        }
        if (PyList_Append(b_chunks, a) < 0 || !PyTuple_Check(c) || PyTuple_GET_SIZE(c) != 4) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "a chunk is not an (end, terminator, targets, last) tuple");
            Py_DECREF(c);
            Py_DECREF(a);
            goto done;
        }
        long term = PyLong_AsLong(PyTuple_GET_ITEM(c, 1));
        PyObject *t = PyTuple_GET_ITEM(c, 2), *last = PyTuple_GET_ITEM(c, 3);
        int err = 0;
        if (term == -1 && PyErr_Occurred())
            err = 1;
        else if (!PyTuple_Check(t))
            err = 1, PyErr_SetString(PyExc_TypeError, "a chunk's targets are not a tuple");
        else if (term == T_COND || term == T_FALL) {
            Py_ssize_t n = term == T_COND ? 2 : 1;
            if (PyTuple_GET_SIZE(t) < n) {
                PyErr_SetString(PyExc_ValueError, "a chunk has too few targets");
                err = 1;
            }
            for (Py_ssize_t i = 0; i < n && !err; i++) {
                PyObject *s = PyTuple_GET_ITEM(t, i);
                int st = other_start(s, f, starts);
                if (st < 0)
                    err = 1;
                else if (st) {
                    err = PySet_Add(hits, s) < 0 || append_pair(tails, last, s) < 0 ||
                          (term == T_COND && i == 0 && PyList_Append(cond_tails, s) < 0);
                } else {
                    PyObject *kind = term == T_FALL ? K_FALL : i == 0 ? K_TAKEN : K_CFALL;
                    err = edge_and_push(edges, a, s, kind, seen, stack) < 0;
                }
            }
        } else if (term == T_CALL || term == T_ICALL) {
            if (PyTuple_GET_SIZE(t) < 2) {
                PyErr_SetString(PyExc_ValueError, "a call chunk has too few targets");
                err = 1;
            } else {
                PyObject *x = PyTuple_GET_ITEM(t, 0), *s = PyTuple_GET_ITEM(t, 1);
                int direct = term == T_CALL ? 1 : PyObject_RichCompareBool(x, ZERO, Py_GE);
                int nr = direct < 0 || (direct && (PyList_Append(calls, last) < 0 || PyList_Append(calls, x) < 0))
                             ? -1
                             : contains(noret, x);
                if (nr < 0)
                    err = 1;
                else if (!nr) {
                    int st = other_start(s, f, starts);
                    if (st < 0)
                        err = 1;
                    else if (st)
                        err = PySet_Add(hits, s) < 0;
                    else
                        err = edge_and_push(edges, a, s, K_CALLRET, seen, stack) < 0;
                }
            }
        } else if (term == T_JUMP) {
            if (PyTuple_GET_SIZE(t) < 1) {
                PyErr_SetString(PyExc_ValueError, "a jump chunk has no target");
                err = 1;
            } else if (!(succ = Py_BuildValue("((OO))", PyTuple_GET_ITEM(t, 0), K_JUMP)))
                err = 1;
        } else if (term == T_RET)
            has_ret = 1;
        else if (term == T_IJUMP) {
            PyObject *r = PyObject_CallFunctionObjArgs(indirect, b, f, nxt, ext, starts, fragments, last, t, new, hits,
                                                       case_hi, NULL);
            if (!r || !PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 2) {
                if (r || !PyErr_Occurred())
                    PyErr_SetString(PyExc_TypeError, "indirect() did not give (successors, case_hi)");
                Py_XDECREF(r);
                err = 1;
            } else {
                succ = PySequence_Fast(PyTuple_GET_ITEM(r, 0), "indirect() successors are not a sequence");
                Py_SETREF(case_hi, Py_NewRef(PyTuple_GET_ITEM(r, 1)));
                Py_DECREF(r);
                err = succ == NULL;
            }
        } else if (term == T_BAD)
            open_end = 1;
        /* the general successor loop (a jump's target, an indirect jump's cases) */
        if (!err && succ) {
            PyObject *seq = PySequence_Fast(succ, "successors are not a sequence");
            err = seq == NULL;
            for (Py_ssize_t i = 0; !err && i < PySequence_Fast_GET_SIZE(seq); i++) {
                PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
                if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
                    PyErr_SetString(PyExc_TypeError, "a successor is not an (address, kind) pair");
                    err = 1;
                    break;
                }
                PyObject *s = PyTuple_GET_ITEM(item, 0), *kind = PyTuple_GET_ITEM(item, 1);
                int st = other_start(s, f, starts);
                if (st < 0) {
                    err = 1;
                    break;
                }
                if (st) {
                    if (PySet_Add(hits, s) < 0) {
                        err = 1;
                        break;
                    }
                    if (PyUnicode_CompareWithASCIIString(kind, "call_return") &&
                        PyUnicode_CompareWithASCIIString(kind, "jump_table")) {
                        if (append_pair(tails, last, s) < 0 ||
                            (!PyUnicode_CompareWithASCIIString(kind, "conditional_taken") &&
                             PyList_Append(cond_tails, s) < 0)) {
                            err = 1;
                            break;
                        }
                    }
                    continue;
                }
                int inside = 0;
                if (no_ext) {
                    inside = PyObject_RichCompareBool(f, s, Py_LT);
                    if (inside > 0)
                        inside = PyObject_RichCompareBool(s, case_hi, Py_LE);
                    if (inside < 0) {
                        err = 1;
                        break;
                    }
                }
                if (!PyUnicode_CompareWithASCIIString(kind, "jump") && !inside) {
                    int in = PySet_Contains(seen, s);
                    if (in < 0) {
                        err = 1;
                        break;
                    }
                    if (!in) {
                        PyObject *r = PyObject_CallFunctionObjArgs(leaves, chunks, f, nxt, ext, s, fragments, NULL);
                        int leave = r ? PyObject_IsTrue(r) : -1;
                        Py_XDECREF(r);
                        if (leave < 0) {
                            err = 1;
                            break;
                        }
                        if (leave) {
                            if (append_pair(tails, last, s) < 0 || PySet_Add(new, s) < 0) {
                                err = 1;
                                break;
                            }
                            continue;
                        }
                    }
                }
                if (edge_and_push(edges, a, s, kind, seen, stack) < 0) {
                    err = 1;
                    break;
                }
            }
            Py_XDECREF(seq);
        }
        Py_XDECREF(succ);
        Py_DECREF(c);
        Py_DECREF(a);
        if (err)
            goto done;
    }
    if ((has_ret && PyObject_SetAttrString(b, "has_ret", Py_True) < 0) ||
        (open_end && PyObject_SetAttrString(b, "open_end", Py_True) < 0))
        goto done;
    out = PyTuple_Pack(3, seen, hits, new);
done:
    Py_XDECREF(seen);
    Py_XDECREF(hits);
    Py_XDECREF(new);
    Py_XDECREF(stack);
    Py_XDECREF(case_hi);
    Py_XDECREF(b_chunks);
    Py_XDECREF(edges);
    Py_XDECREF(calls);
    Py_XDECREF(tails);
    Py_XDECREF(cond_tails);
    return out;
}

/* the bytes [va, end), cut at the end of the region holding `va`, set to 1 in that region's map;
 * `last` is the region of the previous span (-1 at first); nothing when no region holds `va` */
static void mark_span(unsigned long long va, unsigned long long end, const unsigned long long *st,
                      const unsigned long long *en, Py_ssize_t nr, PyObject *maps, Py_ssize_t *last) {
    Py_ssize_t k = *last;
    if (k < 0 || va < st[k] || va >= en[k]) {
        Py_ssize_t lo = 0, hi = nr;
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (va < st[mid])
                hi = mid;
            else
                lo = mid + 1;
        }
        if (lo == 0 || va >= en[lo - 1])
            return;
        *last = k = lo - 1;
    }
    if (end > en[k])
        end = en[k];
    if (end > va)
        memset(PyByteArray_AS_STRING(PyList_GET_ITEM(maps, k)) + (va - st[k]), 1, end - va);
}

/* the bytes of the chunk at `va` (`a` its int, or NULL) marked (`mark_span`): -1 on an error */
static int cover_at(PyObject *chunks, PyObject *a, unsigned long long va, const unsigned long long *st,
                    const unsigned long long *en, Py_ssize_t nr, PyObject *maps, Py_ssize_t *last) {
    unsigned long long end = 0;
    int has = chunk_end(chunks, a, va, &end);
    if (has > 0)
        mark_span(va, end, st, en, nr, maps, last);
    return has < 0 ? -1 : 0;
}

/* the chunks of the ChunkMap `m` whose start is a member of the AddrBits `s` covered: the records
 * read in the order they sit, each start's bit tested (no hash look-up per chunk, as reading the
 * bits would need), then the chunks of the map's side dict */
static int cover_records(ChunkMap *m, AddrBits *s, const unsigned long long *st, const unsigned long long *en,
                         Py_ssize_t nr, PyObject *maps) {
    Py_ssize_t last = -1;
    for (size_t q = 0; q < m->rn; q++) {
        const CMRec *r = &m->recs[q];
        if (r->used != 1)
            continue;
        Py_ssize_t k = ab_region(s, r->va);
        if (k < 0) {
            if (!s->other)
                continue;
            PyObject *a = PyLong_FromUnsignedLongLong(r->va);
            int in = a ? PySet_Contains(s->other, a) : -1;
            Py_XDECREF(a);
            if (in < 0)
                return -1;
            if (!in)
                continue;
        } else {
            unsigned long long off = r->va - s->lo[k];
            if (!((s->bits[k][off >> 3] >> (off & 7)) & 1))
                continue;
        }
        mark_span(r->va, r->va + r->end, st, en, nr, maps, &last);
    }
    if (!m->other)
        return 0;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(m->other, &pos, &key, &value)) {
        int in = ab_contains(s, key);
        if (in <= 0) {
            if (in < 0)
                return -1;
            continue;
        }
        unsigned long long va = PyLong_AsUnsignedLongLong(key);
        if ((va == (unsigned long long)-1 && PyErr_Occurred()) || cover_at((PyObject *)m, key, va, st, en, nr, maps, &last) < 0)
            return -1;
    }
    return 0;
}

/* cover(chunks, addrs, starts, ends, maps): gapmap.cover's marking of each chunk's bytes.
 *
 * For each address in `addrs` (any iterable; an AddrBits with a ChunkMap: the map's records are
 * read in order, each tested against the bits) with a chunk in
 * `chunks`, the bytes from it to the chunk's end (cut at its region's end) are set to 1 in the
 * bytearray `maps[i]` of the region i ([starts[i], ends[i]), sorted) that holds the address;
 * addresses outside every region, or without a chunk, are skipped. */
static PyObject *cover(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *chunks, *addrs, *starts, *ends, *maps;
    if (!PyArg_ParseTuple(args, "OOO!O!O!", &chunks, &addrs, &PyList_Type, &starts, &PyList_Type, &ends, &PyList_Type,
                          &maps) ||
        !chunks_ok(chunks))
        return NULL;
    Py_ssize_t nr = PyList_GET_SIZE(starts);
    if (PyList_GET_SIZE(ends) != nr || PyList_GET_SIZE(maps) != nr) {
        PyErr_SetString(PyExc_ValueError, "starts, ends and maps differ in length");
        return NULL;
    }
    unsigned long long *st = PyMem_Malloc(sizeof(*st) * (nr + 1)), *en = PyMem_Malloc(sizeof(*en) * (nr + 1));
    PyObject *it = NULL, *a = NULL, *out = NULL;
    if (!st || !en) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < nr; i++) {
        PyObject *m = PyList_GET_ITEM(maps, i);
        st[i] = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(starts, i));
        en[i] = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(ends, i));
        if (PyErr_Occurred())
            goto done;
        if (!PyByteArray_Check(m) || (unsigned long long)PyByteArray_GET_SIZE(m) != en[i] - st[i]) {
            PyErr_SetString(PyExc_ValueError, "a map is not a bytearray of its region's size");
            goto done;
        }
    }
    if (IS_AB(addrs) && IS_CM(chunks)) {
        if (cover_records((ChunkMap *)chunks, (AddrBits *)addrs, st, en, nr, maps) < 0)
            goto done;
    } else {
        if (!(it = PyObject_GetIter(addrs)))
            goto done;
        Py_ssize_t last = -1;
        while ((a = PyIter_Next(it))) {
            unsigned long long va = PyLong_AsUnsignedLongLong(a);
            if (va == (unsigned long long)-1 && PyErr_Occurred())
                goto done;
            if (cover_at(chunks, a, va, st, en, nr, maps, &last) < 0)
                goto done;
            Py_CLEAR(a);
        }
    }
    if (!PyErr_Occurred())
        out = Py_NewRef(Py_None);
done:
    Py_XDECREF(a);
    Py_XDECREF(it);
    PyMem_Free(st);
    PyMem_Free(en);
    return out;
}

static int cmp_u64(const void *x, const void *y) {
    unsigned long long a = *(const unsigned long long *)x, b = *(const unsigned long long *)y;
    return a < b ? -1 : a > b;
}

/* body_spans(chunks, bodies) -> [(entry, size)]: gapmap.body_spans, the contiguous run of chunks
 * (gaps of at most 16 bytes) from each body's entry, for the bodies of the dict `bodies`. */
static PyObject *body_spans(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *chunks, *bodies;
    if (!PyArg_ParseTuple(args, "OO!", &chunks, &PyDict_Type, &bodies) || !chunks_ok(chunks))
        return NULL;
    PyObject *out = PyList_New(0), *f, *b, *list = NULL;
    unsigned long long *buf = NULL;
    Py_ssize_t cap = 0, pos = 0;
    if (!out)
        return NULL;
    while (PyDict_Next(bodies, &pos, &f, &b)) {
        unsigned long long fv = PyLong_AsUnsignedLongLong(f);
        if (PyErr_Occurred() || !(list = PyObject_GetAttrString(b, "chunks")))
            goto fail;
        if (!PyList_Check(list)) {
            PyErr_SetString(PyExc_TypeError, "a body's chunks are not a list");
            goto fail;
        }
        Py_ssize_t n = PyList_GET_SIZE(list), k = 0;
        if (n > cap) {
            unsigned long long *nb = PyMem_Realloc(buf, sizeof(*buf) * n);
            if (!nb) {
                PyErr_NoMemory();
                goto fail;
            }
            buf = nb, cap = n;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *a = PyList_GET_ITEM(list, i);
            unsigned long long av = PyLong_AsUnsignedLongLong(a);
            if (PyErr_Occurred())
                goto fail;
            if (av < fv)
                continue;
            unsigned long long e;
            int in = chunk_end(chunks, a, av, &e);
            if (in < 0)
                goto fail;
            if (in)
                buf[k++] = av;
        }
        Py_CLEAR(list);
        qsort(buf, k, sizeof(*buf), cmp_u64);
        unsigned long long end = fv;
        for (Py_ssize_t i = 0; i < k; i++) {
            if (buf[i] > end + 16)
                break;
            unsigned long long e = 0;
            int in = chunk_end(chunks, NULL, buf[i], &e);
            if (in <= 0) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_KeyError, "a chunk went while its body was read");
                goto fail;
            }
            if (e > end)
                end = e;
        }
        if (end > fv) {
            PyObject *t = Py_BuildValue("(OK)", f, end - fv);
            if (!t || PyList_Append(out, t) < 0) {
                Py_XDECREF(t);
                goto fail;
            }
            Py_DECREF(t);
        }
    }
    PyMem_Free(buf);
    return out;
fail:
    Py_XDECREF(list);
    PyMem_Free(buf);
    Py_DECREF(out);
    return NULL;
}

/* covered(chunks, bodies[, seen]) -> int: engine._covered, the bytes in the chunks of all the bodies
 * of the dict `bodies`, each chunk once (chunks no longer in `chunks` count nothing); `seen` (empty:
 * a set or an AddrBits) tells the chunks counted already, a new set without it. */
static PyObject *covered(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *chunks, *bodies, *f, *b, *list = NULL, *seen = NULL;
    if (!PyArg_ParseTuple(args, "OO!|O", &chunks, &PyDict_Type, &bodies, &seen) || !chunks_ok(chunks))
        return NULL;
    if (seen && !PySet_Check(seen) && !IS_AB(seen)) {
        PyErr_SetString(PyExc_TypeError, "seen: a set or an AddrBits");
        return NULL;
    }
    seen = seen ? Py_NewRef(seen) : PySet_New(NULL); /* (an AddrBits: a bit a code byte, not a set of ints) */
    unsigned long long total = 0;
    Py_ssize_t pos = 0;
    if (!seen)
        return NULL;
    while (PyDict_Next(bodies, &pos, &f, &b)) {
        if (!(list = PyObject_GetAttrString(b, "chunks")))
            goto fail;
        if (!PyList_Check(list)) {
            PyErr_SetString(PyExc_TypeError, "a body's chunks are not a list");
            goto fail;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++) {
            PyObject *a = PyList_GET_ITEM(list, i);
            int was = reached_has(seen, a);
            if (was < 0 || (!was && reached_add(seen, a) < 0))
                goto fail;
            if (was)
                continue;
            unsigned long long end = 0, va = PyLong_AsUnsignedLongLong(a);
            if (va == (unsigned long long)-1 && PyErr_Occurred())
                goto fail;
            int has = chunk_end(chunks, a, va, &end);
            if (has < 0)
                goto fail;
            if (has)
                total += end - va;
        }
        Py_CLEAR(list);
    }
    Py_DECREF(seen);
    return PyLong_FromUnsignedLongLong(total);
fail:
    Py_XDECREF(list);
    Py_DECREF(seen);
    return NULL;
}

/* the arrays `ref_cmp` compares places of (set by sort_refs, which holds the GIL throughout) */
static const unsigned long long *rs_src, *rs_dst;
static const unsigned char *rs_kind, *rs_rank;

static int ref_cmp(const void *a, const void *b) {
    unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
    if (rs_src[x] != rs_src[y])
        return rs_src[x] < rs_src[y] ? -1 : 1;
    if (rs_dst[x] != rs_dst[y])
        return rs_dst[x] < rs_dst[y] ? -1 : 1;
    return (int)rs_rank[rs_kind[x]] - (int)rs_rank[rs_kind[y]]; /* (equal: the same reference) */
}

/* sort the first n references by (src, dst, rank[kind]), in place: a permutation of 4-byte places is
 * sorted, then applied cycle by cycle (its top bit marks a place done). A record per reference was 24
 * bytes (gcc's cc1: 1.92M references before de-duplication, 44 MiB beside the arrays); the places are 4. */
static void sort_places(unsigned *perm, Py_ssize_t n, unsigned long long *src, unsigned long long *dst,
                        unsigned char *kind, const unsigned char *rank) {
    for (Py_ssize_t i = 0; i < n; i++)
        perm[i] = (unsigned)i;
    rs_src = src, rs_dst = dst, rs_kind = kind, rs_rank = rank;
    qsort(perm, (size_t)n, sizeof(*perm), ref_cmp);
    const unsigned done = 1u << 31;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (perm[i] & done)
            continue;
        unsigned long long s0 = src[i], d0 = dst[i];
        unsigned char k0 = kind[i];
        Py_ssize_t j = i;
        while ((Py_ssize_t)perm[j] != i) { /* place j takes what stood at perm[j] */
            Py_ssize_t from = (Py_ssize_t)perm[j];
            src[j] = src[from], dst[j] = dst[from], kind[j] = kind[from];
            perm[j] |= done;
            j = from;
        }
        src[j] = s0, dst[j] = d0, kind[j] = k0;
        perm[j] |= done;
    }
}

static PyObject *sort_refs(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *refs;
    Py_buffer rank, retag, strs, pb[3] = {{0}, {0}, {0}};
    if (!PyArg_ParseTuple(args, "Oy*y*y*", &refs, &rank, &retag, &strs))
        return NULL;
    PyObject *out = NULL;
    unsigned *perm = NULL;
    if (rank.len != 256 || retag.len != 256 || strs.len % 8) {
        PyErr_SetString(PyExc_ValueError, "rank and retag: 256 bytes each; strings: u64 words");
        goto done;
    }
    if (refs_buffers(refs, pb, 1) < 0)
        goto done;
    Py_ssize_t n = pb[2].len, ns = strs.len / 8;
    unsigned long long *src = pb[0].buf, *dst = pb[1].buf, *sv = strs.buf;
    unsigned char *kind = pb[2].buf, *rk = rank.buf, *rt = retag.buf;
    if (n >= (Py_ssize_t)1 << 31) {
        PyErr_SetString(PyExc_ValueError, "more than 2**31 references");
        goto done;
    }
    if (!(perm = PyMem_Malloc(sizeof(*perm) * (size_t)(n + 1)))) {
        PyErr_NoMemory();
        goto done;
    }
    sort_places(perm, n, src, dst, kind, rk);
    Py_ssize_t m = 0;
    int retagged = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (m && src[m - 1] == src[i] && dst[m - 1] == dst[i] && kind[m - 1] == kind[i])
            continue;
        src[m] = src[i], dst[m] = dst[i], kind[m] = kind[i];
        m++;
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        unsigned char to = rt[kind[i]];
        if (to == 255)
            continue;
        Py_ssize_t lo = 0, hi = ns; /* is dst a string's start? */
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (sv[mid] < dst[i])
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < ns && sv[lo] == dst[i]) {
            kind[i] = to;
            retagged = 1;
        }
    }
    if (retagged)
        sort_places(perm, m, src, dst, kind, rk);
    out = PyLong_FromSsize_t(m);
done:
    PyMem_Free(perm);
    refs_release(pb);
    PyBuffer_Release(&rank);
    PyBuffer_Release(&retag);
    PyBuffer_Release(&strs);
    return out;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "Set the engine's terminator codes: configure(T_FALL, T_JUMP, T_COND, T_CALL, T_ICALL, T_IJUMP[, T_RET, T_BAD])."},
    {"traverse", traverse, METH_VARARGS, "Explorer.traverse's walk (see the module source)."},
    {"merge", merge, METH_VARARGS, "functions._blocks's merge of chunks into blocks (see the module source)."},
    {"body", body, METH_VARARGS, "Explorer.walk_body's walk of one function (see the module source)."},
    {"cover", cover, METH_VARARGS, "gapmap.cover's marking of chunk bytes (see the module source)."},
    {"body_spans", body_spans, METH_VARARGS, "gapmap.body_spans (see the module source)."},
    {"covered", covered, METH_VARARGS, "engine._covered (see the module source)."},
    {"sort_refs", sort_refs, METH_VARARGS, "xrefs.collect_refs's sort of packed references (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_descent", "Explorer.traverse's walk in C (see discovery/explorer.py).", -1, methods, NULL, NULL,
    NULL, NULL,
};

PyMODINIT_FUNC PyInit__descent(void) {
    if (PyType_Ready(&ChunkMapType) < 0 || PyType_Ready(&AddrBitsType) < 0 || PyType_Ready(&PredMapType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddObjectRef(m, "ChunkMap", (PyObject *)&ChunkMapType) < 0 ||
              PyModule_AddObjectRef(m, "AddrBits", (PyObject *)&AddrBitsType) < 0 ||
              PyModule_AddObjectRef(m, "PredMap", (PyObject *)&PredMapType) < 0))
        Py_CLEAR(m);
    return m;
}
