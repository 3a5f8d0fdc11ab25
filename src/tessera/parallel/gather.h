// Small collectives built on a Communicator for bookkeeping: strings (memory reports, timelines)
// and a double-precision sum.
#pragma once

#include <string>
#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/io/safetensors.h"

namespace tessera::parallel {

// Every rank's string, in rank order, on every rank.
std::vector<std::string> all_gather_strings(comm::Communicator& c, const std::string& s);
// The sum over ranks of `x` (an F64 all-reduce: every rank gets the same double).
double all_reduce_sum(comm::Communicator& c, double x);

// Every rank's F32 tensors on rank 0, in rank order; a name already seen (the tied wte of the
// first and the last pipeline stage) is kept once. Other ranks get an empty list.
io::NamedTensors gather_named_tensors(comm::Communicator& c, io::NamedTensors local);

}  // namespace tessera::parallel
