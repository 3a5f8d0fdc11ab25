// Internal: what the MPI backends share: MPI initialised once per process (MPI_THREAD_MULTIPLE,
// finalised at exit), the element types, and whether waits should give up their core.
#pragma once

#include <mpi.h>

#include "tessera/core/dtype.h"

namespace tessera::comm::mpi::runtime_access {

// Initialises MPI on first use; throws CommError when it lacks MPI_THREAD_MULTIPLE.
void ensure_initialised();
// More ranks on this machine than hardware threads when each process runs `ranks_per_process`.
bool oversubscribed(int ranks_per_process);
MPI_Datatype datatype(DType t);
// Throws CommError "<where>: MPI error: ..." unless rc is MPI_SUCCESS.
void check(int rc, const std::string& where);

}  // namespace tessera::comm::mpi::runtime_access
