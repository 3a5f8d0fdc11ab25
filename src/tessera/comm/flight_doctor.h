// `tessera doctor DIR`: reads the flight recorder's dumps of every rank (flight_recorder.h) and
// says in one sentence what went wrong, then the evidence (docs/RELIABILITY.md, "Flight
// recorder"). Checks, in order, on the collectives of every communicator (matched across ranks by
// communicator name and sequence number):
//   dead_rank     a world rank left no dump, or its dump says it exited, while the others waited
//   mismatch      ranks issued different calls (op, count, dtype, reduce op, root) at one sequence
//                 number of one communicator; the minority is named
//   never_issued  a rank has no record of a call the others issued and waited in (its record of
//                 the communicator covers that sequence number, or stops before it)
//   slow_rank     every rank issued the call, one of them late: the largest lag between the first
//                 and the last rank's issue time (clocks aligned by the dumps' wall-clock anchors)
//   incomplete    calls did not complete but none of the above stands out
//   all_completed every recorded call completed on every rank (the largest lag is evidence)
// What it cannot see: calls older than the ring's capacity, point-to-point matching (send/recv
// carry no sequence number), a communicator whose members' dumps are missing, and clock skew
// between hosts larger than the lag (alignment is by wall clock).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace tessera::comm {

struct Diagnosis {
  std::string kind;      // see above; "" only before diagnose()
  std::string sentence;  // one sentence naming the rank and the call
  std::vector<std::string> evidence;
  int rank = -1;  // the world rank named (-1: none)
  std::string op, comm;
  uint64_t seq = 0;
  double lag_seconds = 0;  // slow_rank: the lag; otherwise the largest lag seen
  nlohmann::json to_json() const;
};

// Every DIR/rank-*.json, by world rank. Throws IoError when DIR holds none or one is unreadable.
std::vector<nlohmann::json> read_flight_dumps(const std::string& dir);
// Throws ConfigError when a dump is not a flight recorder dump of a known version.
Diagnosis diagnose(const std::vector<nlohmann::json>& dumps);

}  // namespace tessera::comm
