#include "tessera/comm/fault.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <set>

#include "tessera/comm/op.h"

namespace tessera::comm {

namespace {

constexpr std::string_view kFormat =
    "rank=R,op=N,kind=delay:DURATION|throw|exit[:STATUS]|mismatch|skip[,call=OP][,comm=NAME]"
    "[,attempt=K], e.g. rank=1,op=37,kind=delay:5000ms; several faults for different restart "
    "attempts are separated by ';'";

[[noreturn]] void bad(std::string_view text, const std::string& why) {
  throw ConfigError(detail::concat("TESSERA_FAULT='", text, "': ", why, "; the format is ", kFormat,
                                   " (docs/RELIABILITY.md)"));
}

// Whether `s` is a whole unsigned integer in [lo, hi] (stored in `out`).
bool parse_uint(std::string_view s, uint64_t lo, uint64_t hi, uint64_t& out) {
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && out >= lo && out <= hi;
}

constexpr std::string_view kCalls[] = {"all_reduce", "all_gather",  "reduce_scatter", "broadcast",
                                       "all_to_all", "all_to_allv", "barrier",        "send",
                                       "recv",       "send_recv"};

}  // namespace

FaultSpec parse_fault_spec(std::string_view text) {
  FaultSpec f;
  f.text = std::string(text);
  std::set<std::string, std::less<>> seen;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string_view item = text.substr(pos, comma - pos);
    pos = comma + 1;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) bad(text, detail::concat("'", item, "' is not key=value"));
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    if (!seen.insert(std::string(key)).second)
      bad(text, detail::concat("'", key, "' is given twice"));
    uint64_t v = 0;
    if (key == "rank") {
      if (!parse_uint(value, 0, 1 << 30, v))
        bad(text, detail::concat("rank must be a world rank (0, 1, ...), got '", value, "'"));
      f.rank = static_cast<int>(v);
    } else if (key == "op") {
      if (!parse_uint(value, 1, UINT64_MAX, v))
        bad(text, detail::concat("op must be a call number counted from 1, got '", value, "'"));
      f.op = v;
    } else if (key == "kind") {
      const size_t colon = value.find(':');
      const std::string_view name = value.substr(0, colon);
      const std::string_view arg =
          colon == std::string_view::npos ? std::string_view() : value.substr(colon + 1);
      const bool has_arg = colon != std::string_view::npos;
      if (name == "delay") {
        const bool ms = arg.ends_with("ms");
        const bool s = !ms && arg.ends_with("s");
        const std::string_view digits = arg.substr(0, arg.size() - (ms ? 2 : s ? 1 : 0));
        if (!has_arg || !(ms || s) || !parse_uint(digits, 0, ms ? 3600000 : 3600, v))
          bad(text, detail::concat("kind=delay needs a duration of at most an hour such as "
                                   "delay:250ms or delay:5s, got '",
                                   value, "'"));
        f.kind = FaultKind::Delay;
        f.delay = Timeout(static_cast<int64_t>(ms ? v : v * 1000));
      } else if (name == "throw" || name == "mismatch" || name == "skip") {
        if (has_arg)
          bad(text, detail::concat("kind=", name, " takes no argument, got '", value, "'"));
        f.kind = name == "throw"      ? FaultKind::Throw
                 : name == "mismatch" ? FaultKind::Mismatch
                                      : FaultKind::Skip;
      } else if (name == "exit") {
        if (has_arg && !parse_uint(arg, 0, 255, v))
          bad(text,
              detail::concat("kind=exit:STATUS needs a status in [0, 255], got '", value, "'"));
        f.kind = FaultKind::Exit;
        f.exit_status = has_arg ? static_cast<int>(v) : 1;
      } else {
        bad(text, detail::concat("unknown kind '", value,
                                 "' (expected delay:DURATION, throw, exit, exit:STATUS, "
                                 "mismatch or skip)"));
      }
    } else if (key == "call") {
      bool known = false;
      for (std::string_view c : kCalls) known = known || c == value;
      if (!known)
        bad(text, detail::concat("call must name an operation (all_reduce, all_gather, "
                                 "reduce_scatter, broadcast, all_to_all, all_to_allv, barrier, "
                                 "send, recv, send_recv), got '",
                                 value, "'"));
      f.call = std::string(value);
    } else if (key == "comm") {
      if (value.empty()) bad(text, "comm needs a communicator name");
      f.comm = std::string(value);
    } else if (key == "attempt") {
      if (!parse_uint(value, 0, 1 << 20, v))
        bad(text,
            detail::concat("attempt must be a restart attempt (0, 1, ...), got '", value, "'"));
      f.attempt = static_cast<int>(v);
    } else {
      bad(text,
          detail::concat("unknown key '", key, "' (expected rank, op, kind, call, comm, attempt)"));
    }
  }
  for (const char* required : {"rank", "op", "kind"})
    if (!seen.contains(required)) bad(text, detail::concat("'", required, "=' is missing"));
  return f;
}

std::optional<FaultSpec> select_fault_spec(std::string_view text, int attempt) {
  std::optional<FaultSpec> chosen;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t semi = std::min(text.find(';', pos), text.size());
    std::string_view item = text.substr(pos, semi - pos);
    pos = semi + 1;
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item.empty()) continue;
    FaultSpec f = parse_fault_spec(item);  // every item is checked, chosen or not
    if (!chosen && (f.attempt < 0 || f.attempt == attempt)) chosen = std::move(f);
  }
  return chosen;
}

int restart_attempt() {
  const char* s = std::getenv("TESSERA_ATTEMPT");
  uint64_t v = 0;
  if (s == nullptr || *s == '\0') return 0;
  if (!parse_uint(s, 0, 1 << 20, v))
    throw ConfigError(
        detail::concat("TESSERA_ATTEMPT='", s, "' is not a restart attempt (0, 1, ...)"));
  return static_cast<int>(v);
}

namespace detail {

static bool comm_matches(std::string_view pattern, std::string_view name) {
  if (pattern.empty() || name == pattern) return true;
  return name.size() > pattern.size() && name.starts_with(pattern) &&
         (name[pattern.size()] == '[' || name[pattern.size()] == '.');
}

bool FaultInjector::fires(const OpDesc& d, std::string_view comm_name) {
  if (!spec_.call.empty() && op_name(d.type) != spec_.call) return false;
  if (!comm_matches(spec_.comm, comm_name)) return false;
  return count_.fetch_add(1, std::memory_order_relaxed) + 1 == spec_.op;
}

void make_mismatched(OpDesc& d) {
  switch (d.type) {
    case OpType::Send:
    case OpType::Recv:
    case OpType::SendRecv:
      if (d.type == OpType::SendRecv && d.peer < 0) {
        if (d.recv_count > 0) --d.recv_count;
      } else if (d.count > 0) {
        --d.count;
      } else {  // nothing to shorten: the same bytes under another dtype
        d.dtype = dtype_size(d.dtype) == 4 ? (d.dtype == DType::F32 ? DType::I32 : DType::F32)
                                           : (d.dtype == DType::U8 ? DType::F32 : DType::U8);
      }
      return;
    case OpType::Barrier:  // a 0-element broadcast from rank 0
      d.type = OpType::Broadcast;
      d.root = 0;
      d.count = 0;
      d.send = nullptr;
      d.recv = nullptr;
      return;
    default:  // every other collective becomes a barrier
      d.type = OpType::Barrier;
      d.count = 0;
      d.send = nullptr;
      d.recv = nullptr;
      d.send_counts.clear();
      d.recv_counts.clear();
      return;
  }
}

}  // namespace detail
}  // namespace tessera::comm
