#include "tessera/kernels/embedding.h"

#include "grad_check.h"

namespace tessera::kernels {
namespace {

using testing::dot;
using testing::expect_fd_close;
using testing::randn;

TEST(Embedding, ForwardAndBackward) {
  const int B = 2, T = 3, C = 4, V = 5;
  const std::vector<int32_t> tokens = {1, 4, 1, 0, 1, 3};  // repeated ids accumulate
  auto wte = randn(V * C, 1), wpe = randn(T * C, 2), dout = randn(B * T * C, 3);
  std::vector<float> out(B * T * C);
  embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)
        EXPECT_EQ(out[(b * T + t) * C + c], wte[tokens[b * T + t] * C + c] + wpe[t * C + c]);
  auto loss = [&] {
    embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return dot(out, dout);
  };
  std::vector<float> dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
  embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  expect_fd_close(wte, dwte, loss, "dwte");
  expect_fd_close(wpe, dwpe, loss, "dwpe");
  for (int c = 0; c < C; ++c) EXPECT_EQ(dwte[2 * C + c], 0.0f);  // id 2 unused
}

}  // namespace
}  // namespace tessera::kernels
