#include "tessera/kernels/embedding.h"

namespace tessera::kernels {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C, const int64_t* positions) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int64_t row = static_cast<int64_t>(b) * T + t;
      float* o = out + row * C;
      const float* e = wte + static_cast<int64_t>(tokens[row]) * C;
      const float* p = wpe + (positions ? positions[t] : t) * C;
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C, const int64_t* positions) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int64_t row = static_cast<int64_t>(b) * T + t;
      const float* d = dout + row * C;
      if (dwte != nullptr) {
        float* g = dwte + static_cast<int64_t>(tokens[row]) * C;
        for (int c = 0; c < C; ++c) g[c] += d[c];
      }
      if (dwpe != nullptr) {
        float* g = dwpe + (positions ? positions[t] : t) * C;
        for (int c = 0; c < C; ++c) g[c] += d[c];
      }
    }
  }
}

}  // namespace tessera::kernels

namespace tessera::kernels {

void embedding_lookup_rows(float* out, const int32_t* tokens, const float* wte_local,
                           int64_t row_begin, int64_t rows, int64_t N, int C) {
  for (int64_t n = 0; n < N; ++n) {
    float* o = out + n * C;
    const int64_t r = static_cast<int64_t>(tokens[n]) - row_begin;
    if (r < 0 || r >= rows) {
      for (int c = 0; c < C; ++c) o[c] = 0.0f;
      continue;
    }
    const float* e = wte_local + r * C;
    for (int c = 0; c < C; ++c) o[c] = e[c];
  }
}

void add_positions(float* out, const float* wpe, int B, int T, int C, const int64_t* positions) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      float* o = out + (static_cast<int64_t>(b) * T + t) * C;
      const float* p = wpe + (positions ? positions[t] : t) * C;
      for (int c = 0; c < C; ++c) o[c] += p[c];
    }
}

void add_positions_rows(float* out, const float* wpe, int64_t first_row, int64_t rows, int T,
                        int C) {
  for (int64_t i = 0; i < rows; ++i) {
    float* o = out + i * C;
    const float* p = wpe + ((first_row + i) % T) * C;
    for (int c = 0; c < C; ++c) o[c] += p[c];
  }
}

void add_positions_rows(float* out, const float* wpe, const RowMap& map, int64_t first,
                        int64_t rows, int C) {
  for (int64_t i = 0; i < rows; ++i) {
    float* o = out + i * C;
    const float* p = wpe + map.position((first + i) % map.T) * C;
    for (int c = 0; c < C; ++c) o[c] += p[c];
  }
}

void embedding_rows_backward(float* dwte_local, float* dwpe, const float* dout,
                             const int32_t* tokens, int64_t row_begin, int64_t rows, int B, int T,
                             int C, const int64_t* positions) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int64_t row = static_cast<int64_t>(b) * T + t;
      const float* d = dout + row * C;
      const int64_t r = static_cast<int64_t>(tokens[row]) - row_begin;
      if (dwte_local != nullptr && r >= 0 && r < rows) {
        float* g = dwte_local + r * C;
        for (int c = 0; c < C; ++c) g[c] += d[c];
      }
      if (dwpe != nullptr) {
        float* g = dwpe + (positions ? positions[t] : t) * C;
        for (int c = 0; c < C; ++c) g[c] += d[c];
      }
    }
  }
}

}  // namespace tessera::kernels
