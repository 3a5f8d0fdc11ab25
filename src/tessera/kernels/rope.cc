#include "tessera/kernels/rope.h"

#include <cmath>
#include <numbers>

#include "tessera/kernels/parallel_rows.h"

namespace tessera::kernels {

void rope_inverse_frequencies(float* inv_freq, int head_dim, double theta,
                              const RopeScaling& scaling) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    double f = std::pow(theta, -2.0 * i / head_dim);
    if (scaling.factor > 0) {
      const double wavelength = 2.0 * std::numbers::pi / f;
      const double low_freq_wavelength = scaling.original_max_positions / scaling.low_freq_factor;
      const double high_freq_wavelength = scaling.original_max_positions / scaling.high_freq_factor;
      if (wavelength > low_freq_wavelength) {
        f /= scaling.factor;
      } else if (wavelength >= high_freq_wavelength) {
        const double smooth =
            (scaling.original_max_positions / wavelength - scaling.low_freq_factor) /
            (scaling.high_freq_factor - scaling.low_freq_factor);
        f = (1.0 - smooth) * f / scaling.factor + smooth * f;
      }
    }
    inv_freq[i] = static_cast<float>(f);
  }
}

void rope_tables(float* cos, float* sin, const float* inv_freq, int head_dim, int64_t positions) {
  const int half = head_dim / 2;
  for (int64_t p = 0; p < positions; ++p)
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * static_cast<double>(inv_freq[i]);
      cos[p * half + i] = static_cast<float>(std::cos(angle));
      sin[p * half + i] = static_cast<float>(std::sin(angle));
    }
}

void rope_apply(float* x, int64_t rows, int heads, int head_dim, int64_t ld, const int64_t* pos,
                const float* cos, const float* sin, bool inverse) {
  const int half = head_dim / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  // Rows are spread over the rank's compute threads (parallel_rows): bitwise one thread's result.
  parallel_rows(rows, int64_t{heads} * head_dim, [&](int64_t first, int64_t end) {
    for (int64_t r = first; r < end; ++r) {
      const float* c = cos + pos[r] * half;
      const float* s = sin + pos[r] * half;
      for (int h = 0; h < heads; ++h) {
        float* a = x + r * ld + static_cast<int64_t>(h) * head_dim;
        float* b = a + half;
#pragma omp simd
        for (int i = 0; i < half; ++i) {
          const float si = sign * s[i];
          const float ai = a[i], bi = b[i];
          a[i] = ai * c[i] - bi * si;
          b[i] = bi * c[i] + ai * si;
        }
      }
    }
  });
}

}  // namespace tessera::kernels
