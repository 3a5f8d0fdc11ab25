// Errors and checks. Library code throws; it never calls exit().
#pragma once

#include <iterator>
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

// A configuration key named in a ConfigError's message, marked so that each reader sees it in
// its own terms: what() shows the key itself ("micro_batch", as a JSON config file or a library
// caller writes it), and the command line renders it as its flag ("--micro-batch",
// ConfigError::render). Library code writes
//   TESSERA_CHECK_AS(ConfigError, ok, config_key("micro_batch"), " ", m, " must divide ...");
inline std::string config_key(const std::string& key) {
  return "\x02" + key + "\x03";
}

// Bad user input: flags, config files, shapes that do not divide.
class ConfigError : public Error {
 public:
  // `msg` may name configuration keys with config_key().
  explicit ConfigError(const std::string& msg) : Error(render(msg, plain)), marked_(msg) {}
  // The message with each marked key rendered by `as` (e.g. as a command-line flag).
  std::string render(std::string (*as)(const std::string& key)) const {
    return render(marked_, as);
  }

 private:
  static std::string plain(const std::string& key) { return key; }
  static std::string render(const std::string& msg, std::string (*as)(const std::string&)) {
    std::string out;
    size_t i = 0;
    while (i < msg.size()) {
      const size_t open = msg.find('\x02', i);
      const size_t close = open == std::string::npos ? open : msg.find('\x03', open);
      if (close == std::string::npos) {
        out.append(msg, i, std::string::npos);
        break;
      }
      out.append(msg, i, open - i);
      out += as(msg.substr(open + 1, close - open - 1));
      i = close + 1;
    }
    return out;
  }
  std::string marked_;
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

// "a, b or c": the items separated by `sep`, the last two by `last` (default: `sep`).
template <typename Range>
std::string join(const Range& items, const std::string& sep, const std::string& last = "") {
  std::string out;
  size_t i = 0, n = static_cast<size_t>(std::distance(std::begin(items), std::end(items)));
  for (const auto& item : items) {
    if (i > 0) out += (i + 1 == n && !last.empty()) ? last : sep;
    out += item;
    ++i;
  }
  return out;
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
