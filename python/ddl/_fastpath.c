/* ddl._fastpath: the per-op calls of ddl's Python faces, compiled (docs/python-overhead.md).
 *
 * ctypes converts each argument of a call through Python-level machinery: submitting one allreduce
 * through ddl_allreduce_ex's eight arguments costs about 1 µs that way, more than libddl takes to
 * queue the op. This module makes the same calls for a small fraction of that.
 *
 * It links against nothing. ddl/_lib.py loads libddl with ctypes either way, and hands this module
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
typedef ddl_status (*test_fn)(ddl_handle, int*);

static allreduce_ex_fn allreduce_ex;
static wait_fn wait_op;
static test_fn test_op;
static PyObject* refused; /* _fastpath.Refused(status): libddl refused the op; ddl_last_error() says why */

/* bind(ddl_allreduce_ex, ddl_wait, ddl_test): the addresses of libddl's functions, as ints. */
static PyObject* bind(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "bind(allreduce_ex, wait, test) takes 3 addresses");
    return NULL;
  }
  void* allreduce = PyLong_AsVoidPtr(args[0]);
  void* wait = PyLong_AsVoidPtr(args[1]);
  void* test = PyLong_AsVoidPtr(args[2]);
  if (PyErr_Occurred()) return NULL;
  if (allreduce == NULL || wait == NULL || test == NULL) {
    PyErr_SetString(PyExc_ValueError, "bind: a function address is NULL");
    return NULL;
  }
  allreduce_ex = (allreduce_ex_fn)allreduce;
  wait_op = (wait_fn)wait;
  test_op = (test_fn)test;
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
  const char* name = args[0] == Py_None ? NULL : PyBytes_AsString(args[0]); /* None: unnamed, libddl numbers it */
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

/* ddl_wait(handle), with the GIL released only where the op is still running: after a step's
 * first wait most of its ops are done, and releasing and taking the GIL would cost more than the wait. */
static ddl_status wait_for(ddl_handle handle) {
  int done = 0;
  if (test_op(handle, &done) == DDL_SUCCESS && done) return wait_op(handle);
  PyThreadState* released = PyEval_SaveThread(); /* what Py_BEGIN_ALLOW_THREADS does */
  ddl_status status = wait_op(handle);
  PyEval_RestoreThread(released);
  return status;
}

/* wait(handle: int) -> int: ddl_wait, without the GIL while it waits; returns its status. */
static PyObject* wait(PyObject* self, PyObject* handle_object) {
  (void)self;
  if (wait_op == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "ddl._fastpath: bind() was not called");
    return NULL;
  }
  ddl_handle handle = handle_object == Py_None ? NULL : PyLong_AsVoidPtr(handle_object); /* None: ctypes' NULL */
  if (PyErr_Occurred()) return NULL;
  return PyLong_FromLong(wait_for(handle));
}

/* ---- a whole allreduce_async_ of a tensor, for the common case ----
 *
 * A training step's gradients are contiguous host tensors of a dtype libddl reduces, named, in the
 * world's set, without scaling. For those, allreduce_tensor does in C what ddl.torch's Python path
 * does: read the tensor, find the options of its shape, name the op, submit it and register its
 * handle. It reads the tensor through its public Python API (dtype, is_cpu, is_contiguous(), shape,
 * data_ptr()), so it is built against no framework. Any other case returns None before it
 * changes anything, and the caller takes its general path, which also raises every error (an op
 * libddl refuses is refused there again, with its message). */

static struct {
  PyObject* dtypes;         /* tensor dtype -> ddl_dtype */
  PyObject* ops;            /* Horovod's op (None: the default) -> ddl_reduce_op */
  PyObject* world_options;  /* shape -> (address, object) of the world's plain options (filled by the caller) */
  PyObject* world_set;      /* the global process set object */
  PyObject* taken;          /* the set of op names in flight in the world's set (ddl/common/names.py) */
  PyObject* handle_map;     /* handle -> (c handle, output, input, full name): what synchronize() finds */
  PyObject* handle_numbers; /* an iterator of handle numbers, shared with the general path */
  PyObject* full_names;     /* name -> "allreduce." + name: a step names the same gradients again (made here) */
} tensor_path;

/* Names kept in full_names at most: a program that names each op anew (a step counter in the name)
 * would otherwise grow it without end; past this, new names are made per op. */
#define FULL_NAMES_KEPT 65536

static PyObject *s_handle, *s_dtype, *s_is_cpu, *s_is_contiguous, *s_shape, *s_data_ptr, *s_allreduce_prefix, *s_c_handles;

/* Each *slots[i] = values[i], holding a reference to the new value and dropping the old one's. */
static void hold_all(PyObject** const* slots, PyObject* const* values, Py_ssize_t count) {
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject* old = *slots[i];
    Py_INCREF(values[i]);
    *slots[i] = values[i];
    Py_XDECREF(old);
  }
}

/* bind_tensor_path(dtypes, ops, world_options, world_set, taken, handle_map, handle_numbers) */
static PyObject* bind_tensor_path(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 7 || !PyDict_Check(args[0]) || !PyDict_Check(args[1]) || !PyDict_Check(args[2]) || !PySet_Check(args[4]) ||
      !PyDict_Check(args[5]) || !PyIter_Check(args[6])) {
    PyErr_SetString(PyExc_TypeError,
                    "bind_tensor_path(dtypes: dict, ops: dict, world_options: dict, world_set, taken: set, handle_map: dict, "
                    "handle_numbers: iterator)");
    return NULL;
  }
  PyObject** slots[] = {&tensor_path.dtypes, &tensor_path.ops,        &tensor_path.world_options, &tensor_path.world_set,
                        &tensor_path.taken,  &tensor_path.handle_map, &tensor_path.handle_numbers};
  PyObject* full_names = PyDict_New();
  if (full_names == NULL) return NULL;
  hold_all(slots, args, 7);
  PyObject* old_names = tensor_path.full_names;
  tensor_path.full_names = full_names;
  Py_XDECREF(old_names);
  Py_RETURN_NONE;
}

/* The int a dict maps `key` to, or -1 (no error set) when it maps it to nothing, to no int, or `key` is unhashable. */
static long mapped(PyObject* dict, PyObject* key) {
  PyObject* value = PyDict_GetItemWithError(dict, key); /* borrowed */
  long result = value == NULL ? -1 : PyLong_AsLong(value);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return -1;
  }
  return result;
}

static int attribute_is_true(PyObject* object, PyObject* name) {
  PyObject* value = PyObject_GetAttr(object, name);
  if (value == NULL) return -1;
  int is_true = value == Py_True;
  Py_DECREF(value);
  return is_true;
}

static int is_contiguous_host_tensor(PyObject* tensor) {
  int cpu = attribute_is_true(tensor, s_is_cpu);
  if (cpu != 1) return cpu;
  PyObject* contiguous = PyObject_CallMethodObjArgs(tensor, s_is_contiguous, NULL);
  if (contiguous == NULL) return -1;
  int is_true = contiguous == Py_True;
  Py_DECREF(contiguous);
  return is_true;
}

static int is_one(PyObject* factor) { return PyFloat_Check(factor) && PyFloat_AsDouble(factor) == 1.0; }

/* An int method of the tensor with no argument (data_ptr()) as a size_t; (size_t)-1 with an error set on failure. */
static size_t call_for_size(PyObject* tensor, PyObject* method) {
  PyObject* value = PyObject_CallMethodObjArgs(tensor, method, NULL);
  if (value == NULL) return (size_t)-1;
  size_t result = PyLong_AsSize_t(value);
  Py_DECREF(value);
  return result;
}

/* The number of elements of a tensor of this shape (a tuple of ints, as torch.Size is): numel()
 * without another call into the framework. (size_t)-1 for anything else. */
static size_t elements_of(PyObject* shape) {
  if (!PyTuple_Check(shape)) return (size_t)-1;
  size_t count = 1;
  for (Py_ssize_t i = 0, n = PyTuple_Size(shape); i < n; ++i) {
    Py_ssize_t dim = PyLong_AsSsize_t(PyTuple_GetItem(shape, i));
    if (dim < 0) { /* an error (set), or no dimension at all */
      PyErr_Clear();
      return (size_t)-1;
    }
    count *= (size_t)dim;
  }
  return count;
}

/* "allreduce." + name (a new reference), NULL with an error set, or NULL without one where the name
 * holds a NUL (the general path refuses it). Kept in full_names: the next step finds it there, with
 * its hash already computed, and its UTF-8 form (the string's own bytes when it is ASCII). */
static PyObject* full_name_of(PyObject* name) {
  PyObject* full = PyDict_GetItemWithError(tensor_path.full_names, name); /* borrowed */
  if (full != NULL) {
    Py_INCREF(full);
    return full;
  }
  if (PyErr_Occurred()) return NULL;
  full = PyUnicode_Concat(s_allreduce_prefix, name);
  if (full == NULL) return NULL;
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(full, &size);
  if (utf8 == NULL || strlen(utf8) != (size_t)size) {
    Py_DECREF(full);
    return NULL;
  }
  if (PyDict_Size(tensor_path.full_names) < FULL_NAMES_KEPT && PyDict_SetItem(tensor_path.full_names, name, full) < 0) {
    Py_DECREF(full);
    return NULL;
  }
  return full;
}

/* "allreduce." + name, claimed in the world's taken names as the Python path claims it (a name stays
 * taken until its op is synchronized); NULL where it is taken already, or on an error. */
static PyObject* claim_name(PyObject* name) {
  PyObject* full = full_name_of(name);
  if (full == NULL) return NULL;
  int taken = PySet_Contains(tensor_path.taken, full);
  if (taken != 0 || PySet_Add(tensor_path.taken, full) < 0) {
    Py_DECREF(full);
    return NULL;
  }
  return full;
}

static void release_name(PyObject* full) {
  if (PySet_Discard(tensor_path.taken, full) < 0) PyErr_Clear();
}

/* The record of an op of the tensor path in the face's handle map: TensorRecord(handle, output, input,
 * name), a named tuple type that Python knows as ddl._fastpath.TensorRecord. */
enum { kRecordHandle, kRecordOutput, kRecordInput, kRecordName, kRecordFields };
static PyStructSequence_Field record_fields[] = {
    {"handle", "libddl's handle of the op, as an int"},
    {"output", "the tensor the result goes into"},
    {"input", "the tensor reduced, kept alive until the op is done"},
    {"name", "the op's full name, released from the names in flight when it is done"},
    {NULL, NULL},
};
static PyStructSequence_Desc record_description = {
    "ddl._fastpath.TensorRecord",
    "An op of the compiled tensor path, as the face's handle map holds it (see ddl/common/fastpath.py).",
    record_fields,
    kRecordFields,
};
static PyTypeObject* record_type = NULL;

/* The handle number under which the op's record went into handle_map, or NULL with an error set. */
static PyObject* register_op(ddl_handle handle, PyObject* output, PyObject* input, PyObject* full_name) {
  PyObject* number = PyIter_Next(tensor_path.handle_numbers);
  if (number == NULL) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "ddl._fastpath: handle numbers ran out");
    return NULL;
  }
  PyObject* c_handle = PyLong_FromVoidPtr(handle);
  PyObject* record = c_handle ? PyStructSequence_New(record_type) : NULL;
  if (record != NULL) {
    PyStructSequence_SetItem(record, kRecordHandle, c_handle); /* steals the reference */
    PyObject* items[] = {output, input, full_name};
    for (int i = 0; i < 3; ++i) {
      Py_INCREF(items[i]);
      PyStructSequence_SetItem(record, kRecordOutput + i, items[i]);
    }
  } else {
    Py_XDECREF(c_handle);
  }
  if (record == NULL || PyDict_SetItem(tensor_path.handle_map, number, record) < 0) {
    Py_XDECREF(record);
    Py_DECREF(number);
    return NULL;
  }
  Py_DECREF(record);
  return number;
}

/* allreduce_tensor(tensor, output, average, name, op, prescale, postscale, process_set) -> handle or None
 *
 * Horovod's allreduce_async(_) arguments. Returns the handle number of the submitted op, or None when
 * this is not the common case (or libddl refused the op): the caller then takes its general path.
 * Once libddl has taken the op, only running out of memory can raise here; the op is then waited
 * for, so nothing stays in flight without a handle. */
static PyObject* allreduce_tensor(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 8) {
    PyErr_SetString(PyExc_TypeError, "allreduce_tensor(tensor, output, average, name, op, prescale, postscale, process_set)");
    return NULL;
  }
  PyObject *tensor = args[0], *output = args[1], *name = args[3];
  if (allreduce_ex == NULL || tensor_path.handle_map == NULL || args[2] != Py_None || !PyUnicode_CheckExact(name) ||
      args[7] != tensor_path.world_set || !is_one(args[5]) || !is_one(args[6]))
    Py_RETURN_NONE;
  long op = mapped(tensor_path.ops, args[4]);
  PyObject* dtype_object = PyObject_GetAttr(tensor, s_dtype);
  if (dtype_object == NULL) goto not_common;
  long dtype = mapped(tensor_path.dtypes, dtype_object);
  Py_DECREF(dtype_object);
  if (op < 0 || dtype < 0) goto not_common;
  int plain = is_contiguous_host_tensor(tensor);
  if (plain == 1 && output != tensor) plain = is_contiguous_host_tensor(output);
  if (plain != 1) goto not_common;
  void* send = (void*)call_for_size(tensor, s_data_ptr);
  if (PyErr_Occurred()) goto not_common;
  void* recv = output == tensor ? send : (void*)call_for_size(output, s_data_ptr);
  if (PyErr_Occurred()) goto not_common;
  PyObject* shape = PyObject_GetAttr(tensor, s_shape);
  if (shape == NULL) goto not_common;
  size_t count = elements_of(shape);
  if (count == (size_t)-1) {
    Py_DECREF(shape);
    goto not_common;
  }
  /* (address, the options object): held until the submit, so that the options stay alive whatever
   * Python code runs meanwhile (a collection's finalizers could empty the cache). */
  PyObject* options_entry = PyDict_GetItemWithError(tensor_path.world_options, shape); /* borrowed */
  Py_XINCREF(options_entry); /* before the shape goes: its finalizer could be Python code that empties the cache */
  Py_DECREF(shape);
  if (options_entry != NULL && (!PyTuple_Check(options_entry) || PyTuple_Size(options_entry) != 2)) Py_CLEAR(options_entry);
  if (options_entry == NULL) goto not_common; /* the general path makes the options and keeps them */
  void* options = PyLong_AsVoidPtr(PyTuple_GetItem(options_entry, 0));
  if (PyErr_Occurred()) {
    Py_DECREF(options_entry);
    goto not_common;
  }

  PyObject* full_name = claim_name(name); /* a name with a NUL inside is none: the general path refuses it */
  const char* utf8 = full_name == NULL ? NULL : PyUnicode_AsUTF8AndSize(full_name, NULL);
  ddl_handle handle = NULL;
  ddl_status status =
      utf8 == NULL ? DDL_ERROR_INVALID_ARGUMENT
                   : allreduce_ex(utf8, send, recv, count, (ddl_dtype)dtype, (ddl_reduce_op)op, (const ddl_op_options*)options, &handle);
  Py_DECREF(options_entry); /* libddl has copied the options */
  if (full_name == NULL) goto not_common;
  if (status != DDL_SUCCESS) {
    release_name(full_name);
    Py_DECREF(full_name);
    goto not_common;
  }
  PyObject* number = register_op(handle, output, tensor, full_name);
  if (number == NULL) { /* out of memory: no op stays in flight without a handle, no name stays taken */
    wait_op(handle);
    release_name(full_name);
  }
  Py_DECREF(full_name);
  return number;

not_common:
  PyErr_Clear(); /* the general path meets the same problem and says it in its own words */
  Py_RETURN_NONE;
}

/* allreduce_tensor's record under handle `number` (borrowed), or NULL (no error set) where there is
 * none: another kind of op's handle, or none at all (the caller's lookup says so in its words). */
static PyObject* tensor_record(PyObject* number) {
  if (tensor_path.handle_map == NULL) return NULL;
  PyObject* record = PyDict_GetItemWithError(tensor_path.handle_map, number); /* borrowed */
  if (record == NULL) PyErr_Clear();                                          /* an unhashable handle */
  return record != NULL && Py_IS_TYPE(record, record_type) ? record : NULL;
}

/* Waits for the op of `record` (under handle `number`), forgets its handle and releases its name.
 * Returns its output, or NULL: with an error set (out of memory), or without one and `*status` the
 * op's failure (ddl_last_error() says why). */
static PyObject* finish_record(PyObject* number, PyObject* record, ddl_status* status) {
  Py_INCREF(record);
  ddl_handle handle = PyLong_AsVoidPtr(PyStructSequence_GetItem(record, kRecordHandle));
  if (PyDict_DelItem(tensor_path.handle_map, number) < 0 || PyErr_Occurred()) {
    Py_DECREF(record);
    return NULL;
  }
  *status = wait_for(handle);
  release_name(PyStructSequence_GetItem(record, kRecordName));
  PyObject* output = *status == DDL_SUCCESS ? PyStructSequence_GetItem(record, kRecordOutput) : NULL;
  Py_XINCREF(output);
  Py_DECREF(record);
  return output;
}

/* ---- allreduce_async_ and synchronize themselves ----
 *
 * A Python function around allreduce_tensor and the finishing of its ops costs a frame and its argument binding
 * per op, a fifth of what is left of a gradient's path. So the face's allreduce_async_ and
 * synchronize are these two compiled functions: each takes the common case itself and hands every
 * other call, with its arguments as given, to the face's Python function of the same name (its
 * "general" path), which binds them, raises for what is wrong, and runs everything else. */

static struct {
  PyObject* allreduce_async_; /* the face's Python allreduce_async_, for what is not the common case */
  PyObject* synchronize;      /* the face's Python synchronize, for the handles of other ops */
  PyObject* raise_for;        /* raise_for(status): raises the face's exception for a failed op */
  PyObject* one;              /* 1.0: the scale factors' default */
} general;

/* allreduce_async_'s parameters, in order (Horovod's). */
enum { kTensor, kAverage, kName, kOp, kPrescale, kPostscale, kProcessSet, kParameters };
static PyObject* s_parameters[kParameters];

/* Calls `fn` with a vectorcall's arguments (the stable ABI of 3.10 has no PyObject_Vectorcall). */
static PyObject* call_with(PyObject* fn, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  Py_ssize_t keywords = kwnames == NULL ? 0 : PyTuple_Size(kwnames);
  PyObject* positional = PyTuple_New(nargs);
  if (positional == NULL) return NULL;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    Py_INCREF(args[i]);
    PyTuple_SetItem(positional, i, args[i]); /* steals the reference */
  }
  PyObject* named = keywords > 0 ? PyDict_New() : NULL;
  for (Py_ssize_t i = 0; named != NULL && i < keywords; ++i)
    if (PyDict_SetItem(named, PyTuple_GetItem(kwnames, i), args[nargs + i]) < 0) Py_CLEAR(named);
  PyObject* result = keywords > 0 && named == NULL ? NULL : PyObject_Call(fn, positional, named);
  Py_DECREF(positional);
  Py_XDECREF(named);
  return result;
}

/* The index of parameter `keyword`, or -1. */
static int parameter_index(PyObject* keyword) {
  for (int i = 0; i < kParameters; ++i)
    if (keyword == s_parameters[i]) return i; /* interned: how a call's keywords usually arrive */
  for (int i = 0; i < kParameters; ++i) {
    int equal = PyUnicode_Compare(keyword, s_parameters[i]) == 0;
    if (PyErr_Occurred()) PyErr_Clear();
    if (equal) return i;
  }
  return -1;
}

/* allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
 * process_set=global_process_set) -> handle */
static PyObject* allreduce_async_inplace(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  (void)self;
  if (general.allreduce_async_ == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "ddl._fastpath: bind_entries() was not called");
    return NULL;
  }
  PyObject* given[kParameters] = {NULL};
  Py_ssize_t keywords = kwnames == NULL ? 0 : PyTuple_Size(kwnames);
  int plain = nargs <= kParameters;
  for (Py_ssize_t i = 0; plain && i < nargs; ++i) given[i] = args[i];
  for (Py_ssize_t i = 0; plain && i < keywords; ++i) {
    int index = parameter_index(PyTuple_GetItem(kwnames, i));
    plain = index >= 0 && given[index] == NULL; /* else: unknown or twice, which the general path says */
    if (plain) given[index] = args[nargs + i];
  }
  if (plain && given[kTensor] != NULL) {
    PyObject* tensor = given[kTensor];
    PyObject* call[8] = {tensor,
                         tensor,
                         given[kAverage] ? given[kAverage] : Py_None,
                         given[kName] ? given[kName] : Py_None,
                         given[kOp] ? given[kOp] : Py_None,
                         given[kPrescale] ? given[kPrescale] : general.one,
                         given[kPostscale] ? given[kPostscale] : general.one,
                         given[kProcessSet] ? given[kProcessSet] : tensor_path.world_set};
    PyObject* handle = allreduce_tensor(NULL, call, 8); /* None too where bind_tensor_path was not called */
    if (handle != Py_None) return handle;               /* the op's handle, or NULL: out of memory */
    Py_DECREF(handle);
  }
  return call_with(general.allreduce_async_, args, nargs, kwnames);
}

/* synchronize(handle) -> the op's output */
static PyObject* synchronize(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  (void)self;
  if (general.synchronize == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "ddl._fastpath: bind_entries() was not called");
    return NULL;
  }
  /* synchronize(h) or synchronize(handle=h); anything else goes as given, and the general path says what is wrong. */
  Py_ssize_t keywords = kwnames == NULL ? 0 : PyTuple_Size(kwnames);
  int bound = nargs + keywords == 1 && (keywords == 0 || PyUnicode_Compare(PyTuple_GetItem(kwnames, 0), s_handle) == 0);
  if (PyErr_Occurred()) PyErr_Clear();
  PyObject* number = bound ? args[0] : NULL;
  PyObject* record = number == NULL ? NULL : tensor_record(number);
  if (record == NULL) return call_with(general.synchronize, args, nargs, kwnames);
  ddl_status status = DDL_SUCCESS;
  PyObject* output = finish_record(number, record, &status);
  if (output != NULL || PyErr_Occurred()) return output;
  PyObject* code = PyLong_FromLong(status);
  PyObject* raised = code == NULL ? NULL : PyObject_CallFunctionObjArgs(general.raise_for, code, NULL);
  Py_XDECREF(code);
  if (raised != NULL) { /* raise_for raises for every failure: this is a mistake of the caller's */
    Py_DECREF(raised);
    PyErr_Format(PyExc_RuntimeError, "ddl._fastpath: raise_for(%d) did not raise", (int)status);
  }
  return NULL;
}

/* bind_entries(allreduce_async_, synchronize, raise_for): the face's Python functions they fall back on. */
static PyObject* bind_entries(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 3 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[1]) || !PyCallable_Check(args[2])) {
    PyErr_SetString(PyExc_TypeError, "bind_entries(allreduce_async_, synchronize, raise_for) takes 3 callables");
    return NULL;
  }
  PyObject** slots[] = {&general.allreduce_async_, &general.synchronize, &general.raise_for};
  hold_all(slots, args, 3);
  Py_RETURN_NONE;
}

/* 1 when the libddl handle behind `handle_object` (an int) has finished, 0 when not, -1 on an error. */
static int handle_done(PyObject* handle_object) {
  ddl_handle handle = PyLong_AsVoidPtr(handle_object);
  if (PyErr_Occurred()) return -1;
  int done = 0;
  return test_op(handle, &done) == DDL_SUCCESS && done ? 1 : 0;
}

/* poll(handle_map, number) -> True or False, or None when `number` has no record: whether every
 * libddl handle of the record has finished. The record is a TensorRecord (the tensor path's), or an
 * object whose c_handles lists them. The lookup and the tests run in this one
 * call with the GIL held throughout: synchronize() on another thread takes a record out (under the
 * GIL) before it frees its handles, so no handle is tested once freed. */
static PyObject* poll(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 2 || !PyDict_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "poll(handle_map: dict, number)");
    return NULL;
  }
  if (test_op == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "ddl._fastpath: bind() was not called");
    return NULL;
  }
  PyObject* record = PyDict_GetItemWithError(args[0], args[1]); /* borrowed */
  if (record == NULL) {
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
  }
  if (Py_IS_TYPE(record, record_type)) {
    int done = handle_done(PyStructSequence_GetItem(record, kRecordHandle));
    return done < 0 ? NULL : PyBool_FromLong(done);
  }
  PyObject* handles = PyObject_GetAttr(record, s_c_handles);
  if (handles == NULL) return NULL;
  int is_list = PyList_Check(handles);
  if (!is_list && !PyTuple_Check(handles)) {
    Py_DECREF(handles);
    PyErr_SetString(PyExc_TypeError, "poll: a record's c_handles is not a list or tuple");
    return NULL;
  }
  Py_ssize_t count = is_list ? PyList_Size(handles) : PyTuple_Size(handles);
  int all_done = 1;
  for (Py_ssize_t i = 0; i < count && all_done == 1; ++i)
    all_done = handle_done(is_list ? PyList_GetItem(handles, i) : PyTuple_GetItem(handles, i));
  Py_DECREF(handles);
  if (all_done < 0) return NULL;
  return PyBool_FromLong(all_done);
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL, "bind(ddl_allreduce_ex, ddl_wait): libddl's function addresses"},
    {"allreduce", (PyCFunction)(void (*)(void))allreduce, METH_FASTCALL,
     "allreduce(name, send, recv, count, dtype, op, options) -> handle: ddl_allreduce_ex"},
    {"wait", wait, METH_O, "wait(handle) -> status: ddl_wait, without the GIL"},
    {"bind_tensor_path", (PyCFunction)(void (*)(void))bind_tensor_path, METH_FASTCALL,
     "bind_tensor_path(dtypes, ops, world_options, world_set, taken, handle_map, handle_numbers): what allreduce_tensor uses"},
    {"allreduce_tensor", (PyCFunction)(void (*)(void))allreduce_tensor, METH_FASTCALL,
     "allreduce_tensor(tensor, output, average, name, op, prescale, postscale, process_set) -> handle or None"},
    /* No text signature for inspect: its defaults may only be constants, and process_set's is an object. */
    {"allreduce_async_", (PyCFunction)(void (*)(void))allreduce_async_inplace, METH_FASTCALL | METH_KEYWORDS,
     "allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0, "
     "process_set=global_process_set)\n\nStarts an in-place allreduce of `tensor`; returns a handle for poll()/synchronize()."},
    {"synchronize", (PyCFunction)(void (*)(void))synchronize, METH_FASTCALL | METH_KEYWORDS,
     "synchronize($module, /, handle)\n--\n\nWaits for the operation behind `handle` and returns its output."},
    {"bind_entries", (PyCFunction)(void (*)(void))bind_entries, METH_FASTCALL,
     "bind_entries(allreduce_async_, synchronize, raise_for): the face's Python functions for all but the common case"},
    {"poll", (PyCFunction)(void (*)(void))poll, METH_FASTCALL,
     "poll(handle_map, number) -> True, False, or None for no record: the record's handles tested under the GIL"},
    {NULL, NULL, 0, NULL},
};

static int intern_names(void) {
  struct {
    PyObject** slot;
    const char* text;
  } names[] = {{&s_handle, "handle"},
               {&s_dtype, "dtype"},
               {&s_is_cpu, "is_cpu"},
               {&s_is_contiguous, "is_contiguous"},
               {&s_shape, "shape"},
               {&s_data_ptr, "data_ptr"},
               {&s_allreduce_prefix, "allreduce."},
               {&s_c_handles, "c_handles"}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i)
    if (*names[i].slot == NULL && (*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL) return -1;
  return 0;
}

static int exec_module(PyObject* module) {
  if (intern_names() < 0) return -1;
  static const char* parameters[kParameters] = {"tensor", "average", "name", "op", "prescale_factor", "postscale_factor", "process_set"};
  for (int i = 0; i < kParameters; ++i)
    if (s_parameters[i] == NULL && (s_parameters[i] = PyUnicode_InternFromString(parameters[i])) == NULL) return -1;
  if (general.one == NULL && (general.one = PyFloat_FromDouble(1.0)) == NULL) return -1;
  if (record_type == NULL && (record_type = PyStructSequence_NewType(&record_description)) == NULL) return -1;
  Py_INCREF(record_type);
  if (PyModule_AddObject(module, "TensorRecord", (PyObject*)record_type) < 0) {
    Py_DECREF(record_type);
    return -1;
  }
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
