// mpi_peer_exit: one MPI process dies (std::_Exit, no MPI_Finalize) while the others wait for it
// in an all-reduce. Run by tests/comm/mpi_peer_exit_test.sh under mpiexec, which checks that the
// job ends within a bound: either the survivors' all-reduce times out with a clear error, or
// mpirun notices the dead process and terminates the job. Never a hang.
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "tessera/comm/errors.h"
#include "tessera/comm/launch.h"

using namespace tessera;
using namespace tessera::comm;

int main() {
  if (!mpi_available() || !launched_by_mpi()) {
    std::printf("SKIPPED: mpi_peer_exit must be built with MPI and started by mpiexec\n");
    return 0;
  }
  CommOptions o;
  o.timeout = std::chrono::milliseconds(3000);
  auto world = mpi_world(o);
  std::vector<float> x(1 << 20, 1.0f);  // 4 MiB: the backend's own ring all-reduce
  world->all_reduce(x.data(), x.size(), DType::F32).wait();  // everyone alive: succeeds
  std::printf("rank %d: first all_reduce ok\n", world->rank());
  std::fflush(stdout);
  if (world->rank() == world->size() - 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::printf("rank %d: exiting without MPI_Finalize\n", world->rank());
    std::fflush(stdout);
    std::_Exit(3);
  }
  try {
    world->all_reduce(x.data(), x.size(), DType::F32).wait();
    std::printf("rank %d: UNEXPECTED: the all_reduce with a dead peer completed\n", world->rank());
    return 0;
  } catch (const CommError& e) {
    std::printf("rank %d: failed as expected: %s\n", world->rank(), e.what());
    std::fflush(stdout);
    std::_Exit(1);  // MPI cannot recover a communicator with a dead member: report and leave
  }
}
