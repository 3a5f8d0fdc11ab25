#include "tessera/comm/options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include "tessera/comm/errors.h"
#include "tessera/comm/fault.h"

namespace tessera::comm {

CommOptions resolve_options(CommOptions opts) {
  if (opts.timeout == kDefaultTimeout) {
    opts.timeout = std::chrono::seconds(300);
    if (const char* s = std::getenv("TESSERA_COMM_TIMEOUT_S"); s && *s) {
      char* end = nullptr;
      double v = std::strtod(s, &end);
      if (end == s || *end != '\0' || !(v > 0) || !std::isfinite(v))
        throw ConfigError(
            detail::concat("TESSERA_COMM_TIMEOUT_S='", s, "' is not a positive number of seconds"));
      opts.timeout = Timeout(static_cast<int64_t>(std::ceil(v * 1000.0)));
    }
  }
  if (const char* s = std::getenv("TESSERA_COMM_DEBUG"); s && *s && std::string(s) != "0")
    opts.debug = true;
  if (const char* s = std::getenv("TESSERA_COMM_STREAM_MIN_BYTES");
      s && *s && opts.stream_min_bytes == kDefaultStreamMinBytes) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE || s[0] == '-')
      throw ConfigError(
          detail::concat("TESSERA_COMM_STREAM_MIN_BYTES='", s, "' is not a number of bytes"));
    opts.stream_min_bytes = static_cast<size_t>(v);
  }
  if (const char* s = std::getenv("TESSERA_FAULT"); s && *s && !opts.fault)
    if (std::optional<FaultSpec> f = select_fault_spec(s, restart_attempt()))
      opts.fault = std::make_shared<const FaultSpec>(std::move(*f));
  // A mismatched or skipped call must be caught before data moves: under MPI a skipped
  // collective would otherwise pair with the peer's next one (the fingerprint check stops it).
  if (opts.fault &&
      (opts.fault->kind == FaultKind::Mismatch || opts.fault->kind == FaultKind::Skip))
    opts.debug = true;
  if (const char* s = std::getenv("TESSERA_FLIGHT_RECORDER");
      s && *s && opts.flight_recorder.empty())
    opts.flight_recorder = s;
  if (opts.timeout < Timeout::zero())
    throw ConfigError("CommOptions::timeout must be kDefaultTimeout or non-negative");
  return opts;
}

}  // namespace tessera::comm
