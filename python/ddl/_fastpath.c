/* ddl._fastpath: the per-op calls of ddl's Python faces, compiled (issue 21).
 *
 * ctypes converts each argument of a call through Python-level machinery: submitting one allreduce
 * through ddl_allreduce_ex's eight arguments costs about 1 µs that way, more than libddl takes to
 * queue the op. This module makes the same calls for a small fraction of that.
 *
 * It links against nothing. ddl/_lib.py loads libddl with ctypes, as before, and hands this module
 * the addresses of the functions it calls (bind()), so both always talk to the same library. It is
 * built against CPython's stable ABI (abi3, 3.10 and later) and against no framework, so one build
 * serves every Python and every PyTorch or TensorFlow version. Where it is missing or does not load,
 * the faces make the same calls through ctypes (ddl/common/fastpath.py). */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "ddl/ddl.h"

typedef ddl_status (*allreduce_ex_fn)(const char*, const void*, void*, size_t, ddl_dtype, ddl_reduce_op, const ddl_op_options*,
                                      ddl_handle*);
typedef ddl_status (*wait_fn)(ddl_handle);

static allreduce_ex_fn allreduce_ex;
static wait_fn wait_op;
static PyObject* refused; /* _fastpath.Refused(status): libddl refused the op; ddl_last_error() says why */

/* bind(ddl_allreduce_ex, ddl_wait): the addresses of libddl's functions, as ints. */
static PyObject* bind(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "bind(allreduce_ex, wait) takes 2 addresses");
    return NULL;
  }
  void* allreduce = PyLong_AsVoidPtr(args[0]);
  void* wait = PyLong_AsVoidPtr(args[1]);
  if (PyErr_Occurred()) return NULL;
  if (allreduce == NULL || wait == NULL) {
    PyErr_SetString(PyExc_ValueError, "bind: a function address is NULL");
    return NULL;
  }
  allreduce_ex = (allreduce_ex_fn)allreduce;
  wait_op = (wait_fn)wait;
  Py_RETURN_NONE;
}

static PyObject* raise_refused(ddl_status status) {
  PyObject* code = PyLong_FromLong(status);
  if (code != NULL) {
    PyErr_SetObject(refused, code);
    Py_DECREF(code);
  }
  return NULL;
}

/* allreduce(name: bytes, send: int, recv: int, count: int, dtype: int, op: int, options: int) -> int
 *
 * ddl_allreduce_ex with the options structure at address `options` (kept alive by the caller until
 * this returns; libddl copies it). Returns the op's handle as an int, for wait(); raises Refused(status)
 * when libddl refuses the op. The GIL stays held: queueing an op takes libddl a lock held for
 * microseconds at most, and libddl never calls back into Python. */
static PyObject* allreduce(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 7) {
    PyErr_SetString(PyExc_TypeError, "allreduce(name, send, recv, count, dtype, op, options) takes 7 arguments");
    return NULL;
  }
  if (allreduce_ex == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "ddl._fastpath: bind() was not called");
    return NULL;
  }
  const char* name = PyBytes_AsString(args[0]);
  void* send = PyLong_AsVoidPtr(args[1]);
  void* recv = PyLong_AsVoidPtr(args[2]);
  size_t count = PyLong_AsSize_t(args[3]);
  long dtype = PyLong_AsLong(args[4]);
  long op = PyLong_AsLong(args[5]);
  void* options = PyLong_AsVoidPtr(args[6]);
  if (PyErr_Occurred()) return NULL;
  ddl_handle handle = NULL;
  ddl_status status = allreduce_ex(name, send, recv, count, (ddl_dtype)dtype, (ddl_reduce_op)op, (const ddl_op_options*)options, &handle);
  if (status != DDL_SUCCESS) return raise_refused(status);
  return PyLong_FromVoidPtr(handle);
}

/* wait(handle: int) -> int: ddl_wait, with the GIL released while it waits; returns its status. */
static PyObject* wait(PyObject* self, PyObject* handle_object) {
  (void)self;
  if (wait_op == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "ddl._fastpath: bind() was not called");
    return NULL;
  }
  ddl_handle handle = handle_object == Py_None ? NULL : PyLong_AsVoidPtr(handle_object); /* None: ctypes' NULL */
  if (PyErr_Occurred()) return NULL;
  PyThreadState* released = PyEval_SaveThread(); /* what Py_BEGIN_ALLOW_THREADS does */
  ddl_status status = wait_op(handle);
  PyEval_RestoreThread(released);
  return PyLong_FromLong(status);
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL, "bind(ddl_allreduce_ex, ddl_wait): libddl's function addresses"},
    {"allreduce", (PyCFunction)(void (*)(void))allreduce, METH_FASTCALL,
     "allreduce(name, send, recv, count, dtype, op, options) -> handle: ddl_allreduce_ex"},
    {"wait", wait, METH_O, "wait(handle) -> status: ddl_wait, without the GIL"},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject* module) {
  refused = PyErr_NewException("ddl._fastpath.Refused", NULL, NULL);
  if (refused == NULL) return -1;
  Py_INCREF(refused);
  if (PyModule_AddObject(module, "Refused", refused) < 0) {
    Py_DECREF(refused);
    return -1;
  }
  return 0;
}

static PyModuleDef_Slot slots[] = {{Py_mod_exec, exec_module}, {0, NULL}};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT,
    "ddl._fastpath",
    "libddl's per-op calls without ctypes (see ddl/common/fastpath.py)",
    0,
    methods,
    slots,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__fastpath(void) { return PyModuleDef_Init(&module_definition); }
