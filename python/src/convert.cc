#include <cstdint>
#include <string>

#include "common.h"

namespace tessera::python {

nb::object to_python(const nlohmann::json& j) {
  using T = nlohmann::json::value_t;
  switch (j.type()) {
    case T::boolean:
      return nb::bool_(j.get<bool>());
    case T::number_integer:
      return nb::int_(j.get<int64_t>());
    case T::number_unsigned:
      return nb::int_(j.get<uint64_t>());
    case T::number_float:
      return nb::float_(j.get<double>());
    case T::string: {  // bytes that are not UTF-8 (a tiny model's sample) as U+FFFD
      const std::string& s = j.get_ref<const std::string&>();
      PyObject* text = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
      if (!text) throw nb::python_error();
      return nb::steal(text);
    }
    case T::array: {
      nb::list l;
      for (const nlohmann::json& e : j) l.append(to_python(e));
      return l;
    }
    case T::object: {
      nb::dict d;
      for (const auto& [k, v] : j.items()) d[to_python(k)] = to_python(v);
      return d;
    }
    default:  // null, and the binary and discarded values no reader here produces
      return nb::none();
  }
}

nlohmann::json to_json(nb::handle h) {
  if (h.is_none()) return nullptr;
  if (nb::isinstance<nb::bool_>(h)) return nb::cast<bool>(h);
  if (nb::isinstance<nb::int_>(h)) {
    if (PyObject_RichCompareBool(h.ptr(), nb::int_(0).ptr(), Py_LT) == 1)
      return nb::cast<int64_t>(h);
    return nb::cast<uint64_t>(h);
  }
  if (nb::isinstance<nb::float_>(h)) return nb::cast<double>(h);
  if (nb::isinstance<nb::str>(h)) return nb::cast<std::string>(h);
  if (nb::isinstance<nb::dict>(h)) {
    nlohmann::json o = nlohmann::json::object();
    for (auto [k, v] : nb::borrow<nb::dict>(h)) {
      if (!nb::isinstance<nb::str>(k))
        throw nb::type_error(("a key of a tessera configuration must be a str, not " +
                              nb::cast<std::string>(nb::repr(k)))
                                 .c_str());
      o[nb::cast<std::string>(k)] = to_json(v);
    }
    return o;
  }
  if (nb::isinstance<nb::list>(h) || nb::isinstance<nb::tuple>(h)) {
    nlohmann::json a = nlohmann::json::array();
    for (nb::handle e : h) a.push_back(to_json(e));
    return a;
  }
  if (nb::hasattr(h, "__fspath__")) return to_json(h.attr("__fspath__")());
  if (nb::hasattr(h, "__index__")) return to_json(h.attr("__index__")());  // numpy integers
  if (nb::hasattr(h, "__float__")) return to_json(h.attr("__float__")());  // numpy floats
  throw nb::type_error(("cannot pass " + nb::cast<std::string>(nb::repr(h)) +
                        " to tessera: expected None, bool, int, float, str, a list or a dict")
                           .c_str());
}

}  // namespace tessera::python
