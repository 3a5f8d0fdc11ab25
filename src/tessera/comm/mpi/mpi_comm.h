// The MPI backend (compiled only when MPI is found; reach it through mpi_world() in launch.h).
//
// Thread level: MPI_THREAD_MULTIPLE. Every communicator may run asynchronous calls on its own
// progress thread while the user's threads call MPI on other communicators, so MPI must accept
// calls from several threads at once. OpenMPI 4.1 provides it.
//
// Progress and deadlines: every operation is issued as a nonblocking MPI call (MPI_Iallreduce,
// MPI_Isend, ...) and completed by polling MPI_Test until it completes or its deadline passes, so
// a missing peer yields a TimeoutError instead of a hang. MPI cannot cancel a collective: after a
// timeout the request is abandoned and the communicator is poisoned (later calls fail at once);
// the process should report the error and exit, which makes mpirun terminate the job.
//
// Sends are eager, as on the inproc backend: the data is copied and the call completes at once;
// the MPI requests finish in the background and are reaped by later calls and the destructor.
//
// Peers in errors: when the job's ranks run on more than one host (MPI_Get_processor_name,
// gathered once by make_world), an error that names a peer names its world rank and host too
// ("waiting for rank 1 (world rank 3 on host h2) to send"); a collective that timed out without
// knowing which peer it waited for lists the hosts of its communicator's ranks. On one host the
// messages stay as they were.
//
// Debug mode (CommOptions::debug or TESSERA_COMM_DEBUG=1): before each collective every rank
// sends its fingerprint to every other rank on a private duplicate communicator. Mismatches fail
// on every rank with a MismatchError naming the ranks; a timeout names the ranks whose
// fingerprint never arrived.
#pragma once

#include <memory>

#include "tessera/comm/communicator.h"

namespace tessera::comm::mpi {

std::unique_ptr<Communicator> make_world(const CommOptions& resolved_opts);

}  // namespace tessera::comm::mpi
