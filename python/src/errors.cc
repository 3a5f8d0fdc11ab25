// tessera's exceptions as Python exceptions of the same names and messages:
//   tessera.Error (RuntimeError)
//     ConfigError, ShapeError, IoError, NumericError, InternalError  (core/error.h)
//     CommError: TimeoutError, MismatchError, PeerFailedError, CommUsageError  (comm/errors.h)
// A ConfigError's configuration keys read as keys ("micro_batch"), as a JSON config or a keyword
// argument names them.
#include "tessera/comm/errors.h"

#include <exception>

#include "common.h"
#include "tessera/core/error.h"

namespace tessera::python {
namespace {

struct Types {
  PyObject *error, *config, *shape, *io, *numeric, *internal;
  PyObject *comm, *timeout, *mismatch, *peer_failed, *comm_usage;
};
Types types;

PyObject* add(nb::module_& m, const char* name, PyObject* base, const char* doc) {
  const std::string qualified = std::string("tessera.") + name;
  PyObject* t = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base, nullptr);
  if (!t) throw nb::python_error();
  m.attr(name) = nb::borrow(t);  // the module keeps a reference; `types` borrows it
  Py_DECREF(t);
  return t;
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const comm::TimeoutError& e) {
    PyErr_SetString(types.timeout, e.what());
  } catch (const comm::MismatchError& e) {
    PyErr_SetString(types.mismatch, e.what());
  } catch (const comm::PeerFailedError& e) {
    PyErr_SetString(types.peer_failed, e.what());
  } catch (const comm::CommUsageError& e) {
    PyErr_SetString(types.comm_usage, e.what());
  } catch (const comm::CommError& e) {
    PyErr_SetString(types.comm, e.what());
  } catch (const ConfigError& e) {
    PyErr_SetString(types.config, e.what());
  } catch (const ShapeError& e) {
    PyErr_SetString(types.shape, e.what());
  } catch (const IoError& e) {
    PyErr_SetString(types.io, e.what());
  } catch (const NumericError& e) {
    PyErr_SetString(types.numeric, e.what());
  } catch (const InternalError& e) {
    PyErr_SetString(types.internal, e.what());
  } catch (const Error& e) {
    PyErr_SetString(types.error, e.what());
  }
  // Anything else goes on to nanobind's own translators (std::exception -> RuntimeError, ...).
}

}  // namespace

void register_errors(nb::module_& m) {
  types.error = add(m, "Error", PyExc_RuntimeError, "Base of every error tessera raises.");
  types.config = add(m, "ConfigError", types.error,
                     "Bad input: a configuration key, a shape that does not divide, a layout "
                     "that cannot run. The message says what to change.");
  types.shape = add(m, "ShapeError", types.error, "A tensor of the wrong shape or dtype.");
  types.io =
      add(m, "IoError", types.error, "Reading or writing a file failed, or it is malformed.");
  types.numeric = add(m, "NumericError", types.error, "A loss or tensor became NaN or infinite.");
  types.internal = add(m, "InternalError", types.error, "A bug in tessera, not in the input.");
  types.comm = add(m, "CommError", types.error, "Base of a communicator's errors.");
  types.timeout =
      add(m, "TimeoutError", types.comm,
          "A wait passed its deadline; the message names the op and the missing peers.");
  types.mismatch = add(m, "MismatchError", types.comm,
                       "Ranks called different collectives, or with different arguments.");
  types.peer_failed =
      add(m, "PeerFailedError", types.comm, "Another rank failed while this one waited for it.");
  types.comm_usage = add(m, "CommUsageError", types.comm,
                         "Invalid arguments to a collective: a root or peer out of range, ...");
  nb::register_exception_translator(translate);
}

}  // namespace tessera::python
