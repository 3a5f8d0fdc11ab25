// tessera._tessera: the binding module under the `tessera` package (python/tessera/). Its functions
// are the thin, typed layer over the C++ libraries; the package's Python files give them their
// public names, defaults and docstrings.
#include "common.h"

NB_MODULE(_tessera, m) {
  m.doc() = "tessera's C++ libraries (internal: use the `tessera` package)";
  tessera::python::register_errors(m);
  tessera::python::register_plan(m);
  tessera::python::register_comm(m);
  tessera::python::register_train(m);
  tessera::python::register_model(m);
  tessera::python::register_schedule(m);
}
