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

// A broken invariant inside tessera: a bug, not something the user can fix by changing input.
// The message starts with "internal error at file:line".
class InternalError : public Error {
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

// TESSERA_ASSERT(cond, "what broke ", value, ...): an internal invariant. Throws InternalError
// "internal error at src/tessera/x.cc:123: <message> (please report this)". User-facing errors
// use TESSERA_CHECK_AS with a message that says what to change instead.
#define TESSERA_ASSERT(cond, ...)                                           \
  do {                                                                      \
    if (!(cond))                                                            \
      throw ::tessera::InternalError(::tessera::detail::concat(             \
          "internal error at ", __FILE__, ":", __LINE__, ": ", __VA_ARGS__, \
          " (this is a bug in tessera, not in your input)"));               \
  } while (0)
