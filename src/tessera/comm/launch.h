// Starting ranks: threads of this process (inproc) or the processes of an mpirun job (mpi).
//
//   tessera::comm::run_inproc(4, [](Communicator& comm) { ... comm.all_reduce(t).wait(); ... });
//
//   // one code path for both: threads unless started by mpirun
//   run_ranks(Backend::Auto, 4, fn);
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "tessera/comm/communicator.h"

namespace tessera::comm {

// Runs fn(comm) on `world_size` threads, one per rank, and returns each rank's exception (null
// when it returned normally). A rank that throws poisons the world, so the others fail fast with
// PeerFailedError instead of waiting for it; a rank that returns is marked exited, so peers still
// waiting for it fail at once.
std::vector<std::exception_ptr> run_inproc_each(int world_size,
                                                const std::function<void(Communicator&)>& fn,
                                                const CommOptions& opts = {});
// As run_inproc_each, then rethrows the first exception (in time) after all threads end,
// preferring one that is not a PeerFailedError (those report another rank's failure). A rank
// that throws InjectedExit (an injected fault, fault.h) is marked exited without poisoning the
// world, as if its function had returned.
void run_inproc(int world_size, const std::function<void(Communicator&)>& fn,
                const CommOptions& opts = {});

// A communicator of one rank alone (a world of one, on no thread of its own): every collective is
// the identity, a copy at most. What "no parallelism" passes where a group is expected, so that
// code reads the same for every layout: a model computed on one rank, a module in a test.
std::unique_ptr<Communicator> one_rank(const CommOptions& opts = {});

// A group that is only a shape: `size` ranks, this one `rank`. A planner builds a model stage on
// it (with an allocator of address space only, core/allocator.h) to measure what one rank of a
// tensor- or expert-parallel group allocates; any communication on it is an internal error.
std::unique_ptr<Communicator> placeholder_group(int size, int rank = 0);

// true when the process was started by mpirun / mpiexec (OMPI_COMM_WORLD_SIZE, PMI_SIZE or
// PMIX_RANK is set).
bool launched_by_mpi();
// true when tessera was built with the MPI backend (TESSERA_HAVE_MPI).
bool mpi_available();
// This process's communicator over MPI_COMM_WORLD (a duplicate). Initialises MPI with
// MPI_THREAD_MULTIPLE on first use and finalises it at process exit. Throws CommError when built
// without MPI or when the MPI library does not provide MPI_THREAD_MULTIPLE.
std::unique_ptr<Communicator> mpi_world(const CommOptions& opts = {});

// Runs fn(comm) on `ranks_per_process` threads of each process of an mpirun job: a world of
// (processes x ranks_per_process) ranks, world rank = process * ranks_per_process + thread, on the
// hierarchical backend (mpi/hier_comm.h): ranks in one process talk in memory, across processes
// over MPI, and every reduction combines in rank order, so the bits do not depend on how ranks map
// to processes. Rethrows the first error, as run_inproc does. Throws CommError without MPI.
void run_hierarchical(int ranks_per_process, const std::function<void(Communicator&)>& fn,
                      const CommOptions& opts = {});

enum class Backend { Auto, Inproc, Mpi };
Backend parse_backend(std::string_view s);  // "auto" | "inproc" | "mpi"; throws ConfigError
// Auto -> Mpi when launched_by_mpi(), else Inproc. Mpi without MPI support throws CommError.
Backend resolve_backend(Backend b);
// Runs fn on this process's ranks: inproc -> `inproc_ranks` threads (run_inproc); mpi -> once, on
// this process's rank of MPI_COMM_WORLD (exceptions propagate).
void run_ranks(Backend b, int inproc_ranks, const std::function<void(Communicator&)>& fn,
               const CommOptions& opts = {});

}  // namespace tessera::comm
