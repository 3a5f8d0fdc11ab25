// A clean stop (docs/RELIABILITY.md): the first SIGINT, SIGTERM or SIGUSR1 asks the training loop
// to stop after the step it is in (the ranks agree on the step, and a checkpoint is saved when
// --save is set); a second one ends the process at once with the signal's default action.
// SIGUSR1 is there for mpirun: Open MPI forwards it to every rank at once, while SIGINT and
// SIGTERM sent to mpirun reach the ranks only as SIGTERM after odls_base_sigkill_timeout, shortly
// before SIGKILL.
//
// The request is one process-wide flag. StopSignals installs the handlers that set it (the
// `tessera train` command does, for the whole run); the trainer only reads it, so library users
// who install nothing are never stopped by a signal. request_stop() sets it as a signal would.
#pragma once

namespace tessera::train {

class StopSignals {
 public:
  // Installs handlers for SIGINT, SIGTERM and SIGUSR1 (SA_RESTART, so interrupted file writes
  // resume), and for SIGUSR2 (a flight recorder dump: dump_requests()), and clears any earlier
  // request. A SIGINT that is ignored (a script's background job)
  // stays ignored, as in Python and the GNU coding standards. `announce`: the first signal prints
  // one line to stderr saying that the run stops after the current step.
  explicit StopSignals(bool announce = true);
  // Restores the previous handlers.
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
};

// The signal that asked for a stop (SIGINT, SIGTERM, SIGUSR1), or 0 when none has.
int stop_requested();
// Asks for a stop as signal `signo` would (without the second-signal exit).
void request_stop(int signo);
void clear_stop_request();
// How many SIGUSR2 have arrived since StopSignals was installed: the trainer dumps every rank's
// flight recorder (comm/flight_recorder.h) when it grows. The handler only counts; the dump is
// written by a thread of the trainer, never in the handler.
unsigned dump_requests();
// Counts one as SIGUSR2 would.
void request_dump();
// "SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2", or "a signal".
const char* signal_name(int signo);

}  // namespace tessera::train
