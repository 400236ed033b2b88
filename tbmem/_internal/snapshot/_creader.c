/* tbmem._internal.snapshot._creader: the snapshot reader's optional compiled parts (what each does: _creader.h). */
#include "_creader.h"

static PyMethodDef methods[] = {
    {"new_runner", tbmem_runner_new, METH_NOARGS, "new_runner() -> capsule\n\nThe caches of run()."},
    {"forget", tbmem_runner_forget, METH_O, "forget(runner)\n\nDrop the stacks cached by reference bytes."},
    {"run", tbmem_runner_run, METH_VARARGS,
     "run(runner, (action, frames, meta, stack, string, meta_inline, refslot), buf, pos, hi, spec, memo_slots, base,"
     " outs) -> (events, end, cuts, memo entries)\n\nThe run of trace events from ``pos`` as rows "
     "(tbmem/_internal/snapshot/pickle_crun.py; _pickle_run.c says what each callback answers)."},
    {"pair", tbmem_pair, METH_VARARGS,
     "pair(act, addr, outs) -> (lone_done, lone_req, reused)\n\ncuda_replay.pair_allocations in one pass "
     "(tbmem/_internal/snapshot/_pair.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_creader",
                                    "The snapshot reader's compiled parts (tbmem/_internal/snapshot/_creader.h).", -1, methods};

PyMODINIT_FUNC PyInit__creader(void) {
    PyObject *m = PyModule_Create(&module);
    PyObject *all = m ? Py_BuildValue("[ssss]", "new_runner", "forget", "run", "pair") : NULL;
    if (all == NULL || PyModule_AddObject(m, "__all__", all) < 0) { /* the project's rule: every module has __all__ */
        Py_XDECREF(all);
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
