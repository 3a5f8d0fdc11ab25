#include "tessera/core/cpu_time.h"

#include <time.h>

namespace tessera {
namespace {
double seconds_of(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}
}  // namespace

double thread_cpu_seconds() {
  return seconds_of(CLOCK_THREAD_CPUTIME_ID);
}

double process_cpu_seconds() {
  return seconds_of(CLOCK_PROCESS_CPUTIME_ID);
}

}  // namespace tessera
