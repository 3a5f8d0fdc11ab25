// Fault injection (docs/RELIABILITY.md): one chosen world rank misbehaves at one chosen
// communication call, so that tests (and users who want to see it) can check that every failure
// ends every rank within the deadline with an error naming the operation, the communicator and
// the ranks involved. Set by CommOptions::fault, or on every rank by the environment variable
//
//   TESSERA_FAULT="rank=1,op=37,kind=delay:5000ms"
//
// rank=R    world rank that misbehaves (its rank in MPI_COMM_WORLD, or its thread's world rank)
// op=N      the N-th call (from 1) this rank issues on any communicator of more than one rank:
//           collectives, barrier, send, recv, send_recv, in issue order (split is not counted);
//           with call= and comm=, only the calls that match are counted
// kind=     delay:D    the call starts D later (D: 250ms, 5s; at most 1 hour); a delay past the
//                      deadline makes the peers time out. On inproc the wait ends early when the
//                      world has failed.
//           throw      the call fails on this rank with InjectedFaultError (the communicator is
//                      poisoned, as by any failure)
//           exit[:S]   the rank leaves at once: under MPI the process ends with status S
//                      (default 1) without MPI_Finalize, as a crash would; on inproc the rank's
//                      thread unwinds with InjectedExit and is marked exited (not failed), so its
//                      peers see a rank that left
//           mismatch   the rank issues a different call: a collective becomes a barrier (a
//                      barrier a 0-element broadcast), a send, recv or send_recv moves one element
//                      less (a 0-element send changes its dtype); the fingerprint check (always on
//                      inproc; turned on for every rank on MPI, where it is TESSERA_COMM_DEBUG) or
//                      the receiver's size check catches it before any data moves
//           skip       the rank does not issue the call at all: it returns a completed Work as if
//                      the call had run (a collective still takes its sequence number), so its
//                      peers wait for it and time out; the flight recorder has no record of it
// call=OP   count only calls of this operation (all_reduce, all_gather, reduce_scatter,
//           broadcast, all_to_all, all_to_allv, barrier, send, recv, send_recv)
// comm=NAME count only calls on the communicator named NAME, or on those whose name starts with
//           NAME followed by '[' or '.' (comm=dp matches 'dp[0,2]')
// attempt=K only in restart attempt K (0 the first run; TESSERA_ATTEMPT, set by the supervisor
//           of `tessera train --max-restarts`, says which attempt a process belongs to); without
//           it the fault fires in every attempt
//
// Several faults, separated by ';', each for its own attempt: the first that applies to this
// attempt is used ("attempt=0,rank=1,op=40,kind=throw;attempt=1,rank=0,op=9,kind=exit").
//
// When the fault fires, the rank prints one line to stderr naming the call, and its flight
// recorder dumps (flight_recorder.h) when one is configured.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "tessera/comm/errors.h"
#include "tessera/comm/options.h"

namespace tessera::comm {

enum class FaultKind : uint8_t { Delay, Throw, Exit, Mismatch, Skip };

struct FaultSpec {
  int rank = -1;
  uint64_t op = 0;
  FaultKind kind = FaultKind::Throw;
  Timeout delay{0};     // kind Delay
  int exit_status = 1;  // kind Exit (MPI)
  std::string call;     // "" = every operation
  std::string comm;     // "" = every communicator
  int attempt = -1;     // -1 = every restart attempt
  std::string text;     // as written, quoted in messages
};

// Parses the format above (one fault). Throws ConfigError naming the bad item and showing the
// format.
FaultSpec parse_fault_spec(std::string_view text);
// Parses a ';'-separated list of faults (each checked) and returns the first that applies to
// restart attempt `attempt`, or none.
std::optional<FaultSpec> select_fault_spec(std::string_view text, int attempt);
// This process's restart attempt: TESSERA_ATTEMPT (0 when unset). Throws ConfigError when
// malformed.
int restart_attempt();

// The call where kind=throw fired.
class InjectedFaultError : public CommError {
 public:
  using CommError::CommError;
};

// Unwinds an inproc rank's thread where kind=exit fired; run_inproc marks the rank exited.
class InjectedExit : public CommError {
 public:
  using CommError::CommError;
};

namespace detail {

struct OpDesc;

// One rank's fault: the counter of matching calls, shared by all communicators of the rank.
class FaultInjector {
 public:
  explicit FaultInjector(FaultSpec spec) : spec_(std::move(spec)) {}
  const FaultSpec& spec() const { return spec_; }
  // Counts the call (when it matches) and returns true exactly once: at the spec's op.
  bool fires(const OpDesc& d, std::string_view comm_name);

 private:
  FaultSpec spec_;
  std::atomic<uint64_t> count_{0};
};

// kind=mismatch: turns `d` into a different call that moves no more data than `d` did.
void make_mismatched(OpDesc& d);

}  // namespace detail
}  // namespace tessera::comm
