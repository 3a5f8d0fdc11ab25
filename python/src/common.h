// Internal to the Python module (tessera._tessera): the pieces each file registers, and the
// conversions between Python objects and JSON values that the module's functions exchange.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <nlohmann/json.hpp>

namespace tessera::python {

namespace nb = nanobind;

// JSON -> Python: objects as dicts, arrays as lists, numbers as int or float.
nb::object to_python(const nlohmann::json& j);
// Python -> JSON: None, bool, int, float, str, dicts with str keys, lists and tuples (numpy
// scalars through __index__ / __float__, paths through __fspath__). TypeError otherwise.
nlohmann::json to_json(nb::handle h);

void register_errors(nb::module_& m);
void register_plan(nb::module_& m);
void register_comm(nb::module_& m);
void register_train(nb::module_& m);
void register_model(nb::module_& m);
void register_schedule(nb::module_& m);

}  // namespace tessera::python
