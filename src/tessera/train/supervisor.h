// The supervisor of `tessera train --max-restarts N` (docs/RELIABILITY.md, "Automatic restarts"):
// like torchrun's elastic agent, it runs each attempt of the job as a child process (the ranks as
// its threads, or the processes of `--mpirun ...`), watches it, and when it fails (an error, a
// rank that exits or crashes, no step for --hang-timeout) starts it again from the newest
// complete checkpoint in --save, up to N times. With --min-dp it drops a data-parallel replica
// whose rank failed in two attempts in a row and goes on with fewer replicas, keeping --batch
// (more micro-batches each), so the model trained stays the one of the full layout.
//
// Not restarted: a configuration error (it would fail again), and a stop by SIGINT, SIGTERM or
// SIGUSR1, which the supervisor passes on to the attempt (it stops after its step and saves, as
// without a supervisor) and then ends with the attempt's status.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "tessera/train/train_config.h"

namespace tessera::train {

// Runs `command` (a `tessera train` command line, program first, whose merged configuration is
// `cfg`) under supervision and returns the exit status to leave with. Each attempt's process gets
// TESSERA_SUPERVISED=1 (so it does not supervise itself), TESSERA_ATTEMPT=K (comm/fault.h) and the
// channels of train/attempt_report.h. Messages go to `log`.
int supervise(const TrainConfig& cfg, const std::vector<std::string>& command, std::FILE* log);

// Whether this process is an attempt started by a supervisor (TESSERA_SUPERVISED=1).
bool supervised();

// The data-parallel size a run of `cfg` goes on with after losing `lost` replicas: the largest
// dp' in [cfg.min_dp, cfg.dp - lost] for which the configuration is valid (--batch divisible by
// dp' x --micro-batch, --ep dividing it, ...), or 0 when there is none.
int shrunk_dp(const TrainConfig& cfg, int lost);

}  // namespace tessera::train
