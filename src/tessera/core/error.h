// Errors and checks. Library code throws; it never calls exit().
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tessera {

// Base of every error tessera throws. what() is a complete sentence meant for the user.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// Bad user input: flags, config files, shapes that do not divide.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A tensor of the wrong shape or dtype reached an operation.
class ShapeError : public Error {
 public:
  using Error::Error;
};

// Reading or writing a file failed, or a file is malformed.
class IoError : public Error {
 public:
  using Error::Error;
};

// A loss or tensor became NaN or infinite.
class NumericError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

}  // namespace tessera

// TESSERA_CHECK(cond, "message ", value, ...) throws tessera::Error with the message.
#define TESSERA_CHECK(cond, ...)                                                 \
  do {                                                                           \
    if (!(cond)) throw ::tessera::Error(::tessera::detail::concat(__VA_ARGS__)); \
  } while (0)

// TESSERA_CHECK_AS(ExceptionType, cond, "message ", ...) throws the given Error subclass.
#define TESSERA_CHECK_AS(Type, cond, ...)                            \
  do {                                                               \
    if (!(cond)) throw Type(::tessera::detail::concat(__VA_ARGS__)); \
  } while (0)
