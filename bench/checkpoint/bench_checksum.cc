// The checkpoints' CRC-32 (io::crc32_update, ISA-L) against zlib's crc32 over 1 GiB, interleaved
// in each repetition: GB/s of each, and whether they agree (docs/PERFORMANCE.md).
//   bench_checksum [repetitions, default 5]
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "tessera/io/checksum.h"

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  const size_t n = size_t{1} << 30;
  std::vector<unsigned char> data(n);
  std::mt19937 g(1);
  for (auto& b : data) b = static_cast<unsigned char>(g());
  using clock = std::chrono::steady_clock;
  auto gbs = [&](clock::duration d) { return n / 1e9 / std::chrono::duration<double>(d).count(); };
  std::vector<double> z, i;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = clock::now();
    uLong zc = 0;
    for (size_t at = 0; at < n; at += size_t{1} << 28)  // zlib takes uInt lengths
      zc = crc32(zc, data.data() + at, static_cast<uInt>(std::min(n - at, size_t{1} << 28)));
    const auto t1 = clock::now();
    const uint32_t ic = tessera::io::crc32_update(0, data.data(), n);
    const auto t2 = clock::now();
    z.push_back(gbs(t1 - t0));
    i.push_back(gbs(t2 - t1));
    std::printf("rep %d: zlib %.2f GB/s, tessera (ISA-L) %.2f GB/s, %s\n", r + 1, z.back(),
                i.back(), static_cast<uint32_t>(zc) == ic ? "same CRC" : "DIFFERENT CRC");
    if (static_cast<uint32_t>(zc) != ic) return 1;
  }
  std::sort(z.begin(), z.end());
  std::sort(i.begin(), i.end());
  std::printf("median: zlib %.2f GB/s, tessera %.2f GB/s, %.2fx\n", z[z.size() / 2],
              i[i.size() / 2], i[i.size() / 2] / z[z.size() / 2]);
  return 0;
}
