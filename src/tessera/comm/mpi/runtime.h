// Internal: what the MPI backends share: MPI initialised once per process (MPI_THREAD_MULTIPLE,
// finalised at exit), the element types, and whether waits should give up their core.
#pragma once

#include <mpi.h>

#include "tessera/core/dtype.h"

namespace tessera::comm::mpi::runtime_access {

// Initialises MPI on first use; throws CommError when it lacks MPI_THREAD_MULTIPLE.
void ensure_initialised();
// Counts the processes of `world` (collective over it) that run on this machine: the same kernel
// (its boot id), so that the test cluster's hosts, network namespaces of one machine, count as
// the one machine whose cores their processes share. Before it runs, the launcher's node-local
// size stands in.
void count_machine_processes(MPI_Comm world);
// More ranks on this machine than hardware threads when each process runs `ranks_per_process`
// (a wait then yields its core at once: the peer it waits for may need it).
bool oversubscribed(int ranks_per_process);
// The processes on this machine: as counted, or the launcher's node-local size before.
int machine_processes();
MPI_Datatype datatype(DType t);
// Throws CommError "<where>: MPI error: ..." unless rc is MPI_SUCCESS.
void check(int rc, const std::string& where);

}  // namespace tessera::comm::mpi::runtime_access
