// CPU time, for rates that should not depend on what else shares the machine: a thread's work
// takes the same CPU time whether or not other tenants take turns on its core (wall time would
// not).
#pragma once

namespace tessera {

// CPU seconds the calling thread has run so far.
double thread_cpu_seconds();
// CPU seconds of every thread of this process so far (rank threads, BLAS's threads).
double process_cpu_seconds();

}  // namespace tessera
