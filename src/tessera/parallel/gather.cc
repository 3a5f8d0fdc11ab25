#include "tessera/parallel/gather.h"

#include <algorithm>
#include <cstring>

namespace tessera::parallel {

std::vector<std::string> all_gather_strings(comm::Communicator& c, const std::string& s) {
  const int n = c.size();
  int64_t len = static_cast<int64_t>(s.size());
  std::vector<int64_t> lens(n);
  c.all_gather(&len, lens.data(), 1, DType::I64).wait();
  const int64_t max_len = std::max<int64_t>(1, *std::max_element(lens.begin(), lens.end()));
  std::vector<char> mine(max_len, 0), all(static_cast<size_t>(max_len) * n);
  std::memcpy(mine.data(), s.data(), s.size());
  c.all_gather(mine.data(), all.data(), max_len, DType::U8).wait();
  std::vector<std::string> out(n);
  for (int r = 0; r < n; ++r) out[r].assign(all.data() + r * max_len, lens[r]);
  return out;
}

double all_reduce_sum(comm::Communicator& c, double x) {
  c.all_reduce(&x, 1, DType::F64).wait();
  return x;
}

}  // namespace tessera::parallel
