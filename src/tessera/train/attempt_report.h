// What one attempt of a supervised run (train/supervisor.h) tells its supervisor, through the
// environment the supervisor sets; without it every call here does nothing.
//
//   TESSERA_HEARTBEAT=FILE   rank 0 rewrites one line, "start S step N", when it starts training
//                            (N = S, the step it starts from) and after every step N, so the
//                            supervisor sees progress and hangs (a file, so that it works from
//                            mpirun's processes too)
//   TESSERA_FAILURE_DIR=DIR  on failure each process writes what it knows there:
//                            ranks-<R>.json  the fate of each of its ranks (R: its first world
//                            rank) error-<pid>.json the error that ended the process, with its kind
#pragma once

#include <cstdint>
#include <exception>
#include <map>
#include <string>
#include <vector>

namespace tessera::train {

// How a rank of a failed attempt ended.
enum class RankFate {
  Finished,    // returned normally
  Failed,      // raised an error of its own (the likely cause)
  PeerFailed,  // stopped because another rank failed (a consequence)
  Exited,      // left the world without finishing (an injected exit, a crash)
};
const char* fate_name(RankFate f);

// Rank 0's progress: the step the run is at (a no-op without TESSERA_HEARTBEAT).
void report_heartbeat(int64_t step);

// The fate of a rank from the exception that ended it (null: Finished).
RankFate fate_of(const std::exception_ptr& e);
// Writes ranks-<first_world_rank>.json with the fates of this process's ranks (world ranks
// first_world_rank, first_world_rank + 1, ...).
void report_rank_fates(int first_world_rank, const std::vector<RankFate>& fates);
// Writes error-<pid>.json: kind ("config", "io", "comm", "internal", "other") and message.
void report_process_error(const std::string& kind, const std::string& message);

// What a supervisor reads back from a failure directory.
struct AttemptFailure {
  std::map<int, RankFate> fates;   // world rank -> fate, for the ranks some process reported
  std::vector<std::string> kinds;  // the error kinds of the processes that reported one
  std::string message;             // the first error message reported ("" when none)
  bool config_error() const;
};
AttemptFailure read_attempt_failure(const std::string& dir);

}  // namespace tessera::train
