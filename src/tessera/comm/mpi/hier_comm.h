// The hierarchical backend: several thread ranks in each process of an MPI job (reach it through
// run_hierarchical() in launch.h).
//
// World rank = process * R + thread, for R ranks per process. A communicator's members that share
// a process talk in memory (peers' buffers read in place, as on the inproc backend); members in
// other processes over MPI point to point, each rank on its own MPI communicators (one per pair of
// thread indices, so threads never match each other's messages), every wait polled against its
// deadline.
//
// Fixed reduction order: every reduction (all_reduce, reduce_scatter) combines the ranks' values
// left to right in rank order, whatever the mapping of ranks to processes, so a layout gives the
// same bits with 1, 2 or R ranks per process, and the same as the inproc backend's direct
// all-reduce (reduce.h combines in source order). The all-reduce is a chain over the "runs" of the
// communicator (maximal sets of consecutive ranks in one process): the buffer is cut into slices,
// one per rank of a run; in each run one rank handles a slice, folds the partial result that
// arrives from the previous run with its run's values in order, and passes it on; the last run's
// handler returns the result to one handler per run, which writes it into its run's outputs. On 2
// processes of R ranks each process sends and receives the buffer once (a flat ring over 2R ranks
// sends 2(2R-1)/(2R) of it across at each of its two crossings). Reduce-scatter is the same chain
// with each block's result sent to its owner only. bf16 partial results travel as fp32 and are
// rounded once, as reduce.h rounds.
#pragma once

#include <memory>
#include <string>

#include "tessera/comm/communicator.h"

namespace tessera::comm::mpi {

struct HierWorld;

// This process's share of a world of MPI-size x `ranks_per_process` ranks. Collective over the
// processes of the job (it creates the MPI communicators the ranks use); call from one thread.
std::shared_ptr<HierWorld> make_hier_world(int ranks_per_process, const CommOptions& resolved_opts);
// The world communicator of this process's thread `thread` (0 <= thread < ranks_per_process):
// world rank = process * ranks_per_process + thread. Call once per thread.
std::unique_ptr<Communicator> hier_communicator(const std::shared_ptr<HierWorld>& world,
                                                int thread);
// Fails every later or waiting call of this process's ranks with PeerFailedError quoting `reason`.
void hier_fail(HierWorld& world, const std::string& reason);

}  // namespace tessera::comm::mpi
