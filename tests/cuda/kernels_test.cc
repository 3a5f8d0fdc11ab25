// The GPU kernels (cuda/kernels.h) against the CPU kernels they mirror, on random inputs of
// awkward sizes: fp32 to 1e-5 relative (bitwise where the CPU's order of operations is kept:
// conversions, dropout, the position-embedding gradient), bf16 against the CPU kernel on
// bf16-rounded inputs to 1e-2. Skipped without a CUDA device.
#include "tessera/cuda/kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/cuda/runtime.h"
#include "tessera/kernels/attention.h"
#include "tessera/kernels/bf16.h"
#include "tessera/kernels/dropout.h"
#include "tessera/kernels/embedding.h"
#include "tessera/kernels/gelu.h"
#include "tessera/kernels/layernorm.h"
#include "tessera/kernels/residual.h"
#include "tessera/kernels/softmax_xent.h"
#include "tessera/optim/adamw.h"

namespace tessera::cuda {
namespace {

// ---- Device buffers and copies (plain CUDA runtime calls, all on the test's stream) -----------

class TestStream {
 public:
  TestStream() { check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "stream create"); }
  ~TestStream() { cudaStreamDestroy(s_); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

template <typename T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) {
    if (n > 0) check(cudaMalloc(reinterpret_cast<void**>(&p_), sizeof(T) * n), "cudaMalloc");
  }
  ~Dev() {
    if (p_ != nullptr) cudaFree(p_);
  }
  Dev(Dev&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  Dev& operator=(Dev&&) = delete;
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

void copy_in(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s), "test upload");
  check(cudaStreamSynchronize(s), "test upload sync");
}

void copy_out(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  check(cudaStreamSynchronize(s), "test kernel sync");
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s), "test download");
  check(cudaStreamSynchronize(s), "test download sync");
}

// Raw values (tokens, targets, segments, fp32 parameters).
template <typename T>
Dev<T> upload(const std::vector<T>& v, cudaStream_t s) {
  Dev<T> d(v.size());
  copy_in(d.get(), v.data(), sizeof(T) * v.size(), s);
  return d;
}

template <typename T>
std::vector<T> download(const T* p, size_t n, cudaStream_t s) {
  std::vector<T> v(n);
  copy_out(v.data(), p, sizeof(T) * n, s);
  return v;
}

// Activations of type T from fp32 host values (bf16: rounded to nearest even on the host).
template <typename T>
Dev<T> to_device(const std::vector<float>& v, cudaStream_t s) {
  Dev<T> d(v.size());
  if constexpr (std::is_same_v<T, float>) {
    copy_in(d.get(), v.data(), sizeof(float) * v.size(), s);
  } else {
    std::vector<uint16_t> bits(v.size());
    kernels::f32_to_bf16(bits.data(), v.data(), static_cast<int64_t>(v.size()));
    copy_in(d.get(), bits.data(), sizeof(uint16_t) * v.size(), s);
  }
  return d;
}

template <typename T>
void overwrite(Dev<T>& d, const std::vector<float>& v, cudaStream_t s) {
  ASSERT_EQ(d.size(), v.size());
  Dev<T> src = to_device<T>(v, s);
  check(cudaMemcpyAsync(d.get(), src.get(), sizeof(T) * v.size(), cudaMemcpyDeviceToDevice, s),
        "test overwrite");
  check(cudaStreamSynchronize(s), "test overwrite sync");
}

template <typename T>
std::vector<float> to_f32(const T* p, size_t n, cudaStream_t s) {
  if constexpr (std::is_same_v<T, float>) {
    return download(p, n, s);
  } else {
    std::vector<uint16_t> bits(n);
    copy_out(bits.data(), p, sizeof(uint16_t) * n, s);
    std::vector<float> v(n);
    kernels::bf16_to_f32(v.data(), bits.data(), static_cast<int64_t>(n));
    return v;
  }
}

// What the GPU sees of host values as T: bf16-rounded for bf16.
template <typename T>
std::vector<float> as_input(std::vector<float> v) {
  if constexpr (!std::is_same_v<T, float>)
    kernels::round_to_bf16(v.data(), v.data(), static_cast<int64_t>(v.size()));
  return v;
}

template <typename T>
double tol() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-2;
}

std::vector<float> randn(size_t n, uint32_t seed, float stddev = 1.0f, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

template <typename A, typename B>
double rel_err(const std::vector<A>& got, const std::vector<B>& want) {
  EXPECT_EQ(got.size(), want.size());
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double d = static_cast<double>(got[i]) - static_cast<double>(want[i]);
    num += d * d;
    den += static_cast<double>(want[i]) * static_cast<double>(want[i]);
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

bool same_bits(const void* a, const void* b, size_t bytes) {
  return std::memcmp(a, b, bytes) == 0;
}

// ---- Conversions -------------------------------------------------------------------------------

TEST(CudaKernels, ConvertRoundsBitwiseAsTheCpu) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  TestStream stream;
  const cudaStream_t s = stream.get();
  std::vector<float> x = randn(4099, 1, 3.0f);
  const uint32_t specials[] = {0x7fc00000u, 0x7f800001u, 0xffc00001u, 0x7fbfffffu,
                               0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u,
                               0x7f7fffffu, 0x3f808000u, 0x3f818000u, 0x3f80c000u,
                               0x00000001u, 0x007fffffu, 0x807fffffu, 0x7f7f8000u};
  for (size_t i = 0; i < std::size(specials); ++i) std::memcpy(&x[i * 37], &specials[i], 4);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint16_t> want(x.size());
  kernels::f32_to_bf16(want.data(), x.data(), n);
  Dev<float> dx = upload(x, s);
  Dev<bf16> dy(x.size());
  // Aligned (vector path and tail) and offset by one element (scalar path).
  for (int offset : {0, 1}) {
    cudaMemsetAsync(dy.get(), 0xff, sizeof(bf16) * x.size(), s);
    convert(dy.get() + offset, dx.get() + offset, n - offset, s);
    std::vector<uint16_t> got(x.size());
    copy_out(got.data(), dy.get(), sizeof(uint16_t) * got.size(), s);
    for (int64_t i = offset; i < n; ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;
  }
  // bf16 -> fp32 is exact: every bit pattern.
  std::vector<uint16_t> bits(65536 + 3);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(i * 40503u);
  std::vector<float> back(bits.size());
  kernels::bf16_to_f32(back.data(), bits.data(), static_cast<int64_t>(bits.size()));
  Dev<bf16> db(bits.size());
  copy_in(db.get(), bits.data(), sizeof(uint16_t) * bits.size(), s);
  Dev<float> df(bits.size());
  for (int offset : {0, 1}) {
    convert(df.get() + offset, db.get() + offset, static_cast<int64_t>(bits.size()) - offset, s);
    const std::vector<float> got = download(df.get(), bits.size(), s);
    EXPECT_TRUE(same_bits(got.data() + offset, back.data() + offset,
                          sizeof(float) * (bits.size() - offset)));
  }
}

TEST(CudaKernels, ScaleMultipliesInPlace) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  TestStream stream;
  const cudaStream_t s = stream.get();
  const std::vector<float> x = randn(1001, 2);
  Dev<float> d = upload(x, s);
  scale(d.get(), 1001, 0.37f, s);
  scale(d.get() + 1, 999, 0.5f, s);  // misaligned, leaves the first and last element
  const std::vector<float> got = download(d.get(), x.size(), s);
  for (size_t i = 0; i < x.size(); ++i) {
    const float once = x[i] * 0.37f;
    ASSERT_EQ(got[i], i == 0 || i == 1000 ? once : once * 0.5f) << i;
  }
}

// ---- Embedding ---------------------------------------------------------------------------------

template <typename T>
void check_embedding(int B, int T_, int C, int V) {
  TestStream stream;
  const cudaStream_t s = stream.get();
  std::mt19937 rng(7);
  std::vector<int32_t> tokens(static_cast<size_t>(B) * T_);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % V);
  const auto wte = randn(static_cast<size_t>(V) * C, 1),
             wpe = randn(static_cast<size_t>(T_) * C, 2);
  const size_t n = tokens.size() * C;
  std::vector<float> out(n);
  kernels::embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T_, C);
  Dev<int32_t> dtok = upload(tokens, s);
  Dev<float> dwte = upload(wte, s), dwpe = upload(wpe, s);
  Dev<T> dout(n);
  embedding_forward(dout.get(), dtok.get(), dwte.get(), dwpe.get(), B, T_, C, s);
  EXPECT_LT(rel_err(to_f32(dout.get(), n, s), out), tol<T>()) << "forward";

  // Backward: the gradients ACCUMULATE into random contents.
  const auto grad = as_input<T>(randn(n, 3));
  const auto gwte0 = randn(wte.size(), 4), gwpe0 = randn(wpe.size(), 5);
  std::vector<float> gwte = gwte0, gwpe = gwpe0;
  kernels::embedding_backward(gwte.data(), gwpe.data(), grad.data(), tokens.data(), B, T_, C);
  Dev<T> dgrad = to_device<T>(grad, s);
  Dev<float> dgwte = upload(gwte0, s), dgwpe = upload(gwpe0, s);
  embedding_backward(dgwte.get(), dgwpe.get(), dgrad.get(), dtok.get(), B, T_, C, s);
  EXPECT_LT(rel_err(download(dgwte.get(), gwte.size(), s), gwte), 1e-5) << "dwte";
  const auto got_wpe = download(dgwpe.get(), gwpe.size(), s);
  EXPECT_LT(rel_err(got_wpe, gwpe), 1e-5) << "dwpe";
  EXPECT_EQ(got_wpe, gwpe) << "dwpe adds the samples in the CPU's order";
  // Either gradient may be null.
  Dev<float> only_wte = upload(gwte0, s), only_wpe = upload(gwpe0, s);
  embedding_backward(only_wte.get(), static_cast<float*>(nullptr), dgrad.get(), dtok.get(), B, T_,
                     C, s);
  embedding_backward(static_cast<float*>(nullptr), only_wpe.get(), dgrad.get(), dtok.get(), B, T_,
                     C, s);
  EXPECT_LT(rel_err(download(only_wte.get(), gwte.size(), s), gwte), 1e-5);
  EXPECT_EQ(download(only_wpe.get(), gwpe.size(), s), gwpe);
}

TEST(CudaKernels, EmbeddingMatchesCpu) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  check_embedding<float>(3, 7, 45, 10);
  check_embedding<float>(2, 65, 300, 50);
  check_embedding<float>(1, 1, 7, 3);
}

TEST(CudaKernels, EmbeddingBf16MatchesCpu) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  check_embedding<bf16>(3, 7, 45, 10);
  check_embedding<bf16>(2, 65, 300, 50);
}

// ---- LayerNorm ---------------------------------------------------------------------------------

template <typename T>
void check_layernorm(int N, int C) {
  SCOPED_TRACE(::testing::Message() << "N " << N << " C " << C);
  TestStream stream;
  const cudaStream_t s = stream.get();
  const size_t n = static_cast<size_t>(N) * C;
  const auto x = as_input<T>(randn(n, 11, 1.5f, 3.0f));  // |mean| > std: the two-pass variance
  const auto w = randn(C, 12, 0.5f, 1.0f), b = randn(C, 13, 0.3f);
  std::vector<float> out(n), mean(N), rstd(N);
  kernels::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                             C, 1e-5f);
  Dev<T> dx = to_device<T>(x, s), dout(n);
  Dev<float> dw = upload(w, s), db = upload(b, s), dmean(N), drstd(N);
  layernorm_forward(dout.get(), dmean.get(), drstd.get(), dx.get(), dw.get(), db.get(), N, C, 1e-5f,
                    s);
  EXPECT_LT(rel_err(to_f32(dout.get(), n, s), out), tol<T>()) << "out";
  EXPECT_LT(rel_err(download(dmean.get(), N, s), mean), 1e-5) << "mean";
  EXPECT_LT(rel_err(download(drstd.get(), N, s), rstd), 1e-5) << "rstd";

  // Backward from the CPU's saved statistics; din, dweight, dbias ACCUMULATE.
  const auto dy = as_input<T>(randn(n, 14));
  const auto din0 = as_input<T>(randn(n, 15)), dw0 = randn(C, 16), db0 = randn(C, 17);
  std::vector<float> din = din0, gw = dw0, gb = db0;
  kernels::layernorm_backward(din.data(), gw.data(), gb.data(), dy.data(), x.data(), w.data(),
                              mean.data(), rstd.data(), N, C);
  Dev<float> cmean = upload(mean, s), crstd = upload(rstd, s);
  Dev<T> ddy = to_device<T>(dy, s), ddin = to_device<T>(din0, s);
  Dev<float> dgw = upload(dw0, s), dgb = upload(db0, s);
  Dev<float> scratch(static_cast<size_t>(layernorm_backward_scratch(N, C)));
  layernorm_backward(ddin.get(), dgw.get(), dgb.get(), ddy.get(), dx.get(), dw.get(), cmean.get(),
                     crstd.get(), N, C, scratch.get(), s);
  EXPECT_LT(rel_err(to_f32(ddin.get(), n, s), din), tol<T>()) << "din";
  EXPECT_LT(rel_err(download(dgw.get(), C, s), gw), 1e-5) << "dweight";
  EXPECT_LT(rel_err(download(dgb.get(), C, s), gb), 1e-5) << "dbias";
}

TEST(CudaKernels, LayernormMatchesCpu) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  check_layernorm<float>(1, 45);
  check_layernorm<float>(37, 769);
  check_layernorm<float>(301, 64);
  check_layernorm<float>(1001, 45);
  check_layernorm<float>(65, 1600);  // the backward's 8-columns-a-thread form
  check_layernorm<float>(33, 2500);  // past it: the column-sum form
}

TEST(CudaKernels, LayernormBf16MatchesCpu) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  check_layernorm<bf16>(37, 769);
  check_layernorm<bf16>(301, 64);
}

// ---- GELU --------------------------------------------------------------------------------------

template <typename T>
void check_gelu(int64_t n) {
  SCOPED_TRACE(::testing::Message() << "n " << n);
  TestStream stream;
  const cudaStream_t s = stream.get();
  const auto x = as_input<T>(randn(n, 21, 2.0f));
  const auto dy = as_input<T>(randn(n, 22));
  std::vector<float> y(n), dx(n);
  kernels::gelu_forward(y.data(), x.data(), n);
  kernels::gelu_backward(dx.data(), dy.data(), x.data(), n);
  Dev<T> dxin = to_device<T>(x, s), dout(n), ddy = to_device<T>(dy, s), ddx(n);
  for (int offset : {0, 1}) {  // the vector path, then the scalar one
    SCOPED_TRACE(::testing::Message() << "offset " << offset);
    gelu_forward(dout.get() + offset, dxin.get() + offset, n - offset, s);
    gelu_backward(ddx.get() + offset, ddy.get() + offset, dxin.get() + offset, n - offset, s);
    auto got = to_f32(dout.get(), n, s), got_dx = to_f32(ddx.get(), n, s);
    EXPECT_LT(rel_err(std::vector<float>(got.begin() + offset, got.end()),
                      std::vector<float>(y.begin() + offset, y.end())),
              tol<T>());
    EXPECT_LT(rel_err(std::vector<float>(got_dx.begin() + offset, got_dx.end()),
                      std::vector<float>(dx.begin() + offset, dx.end())),
              tol<T>());
  }
  // In place: out = in, din = dout.
  Dev<T> inplace = to_device<T>(x, s), dinplace = to_device<T>(dy, s);
  gelu_backward(dinplace.get(), dinplace.get(), inplace.get(), n, s);
  gelu_forward(inplace.get(), inplace.get(), n, s);
  EXPECT_LT(rel_err(to_f32(inplace.get(), n, s), y), tol<T>());
  EXPECT_LT(rel_err(to_f32(dinplace.get(), n, s), dx), tol<T>());
}

TEST(CudaKernels, GeluMatchesCpu) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  check_gelu<float>(10007);
  check_gelu<float>(9);
}

TEST(CudaKernels, GeluBf16MatchesCpu) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  check_gelu<bf16>(10007);
  check_gelu<bf16>(9);
}

// ---- Residual and bias -------------------------------------------------------------------------

template <typename T>
void check_residual_and_bias(int64_t M, int N) {
  SCOPED_TRACE(::testing::Message() << "M " << M << " N " << N);
  TestStream stream;
  const cudaStream_t s = stream.get();
  const size_t n = static_cast<size_t>(M) * N;
  const auto a = as_input<T>(randn(n, 31)), b = as_input<T>(randn(n, 32));
  const auto bias = randn(N, 33);
  std::vector<float> sum(n), biased(n), acc(n);
  kernels::residual_forward(sum.data(), a.data(), b.data(), static_cast<int64_t>(n));
  kernels::bias_forward(biased.data(), a.data(), bias.data(), M, N);
  Dev<T> da = to_device<T>(a, s), dbb = to_device<T>(b, s), dsum(n);
  Dev<float> dbias = upload(bias, s);
  residual_forward(dsum.get(), da.get(), dbb.get(), static_cast<int64_t>(n), s);
  EXPECT_LT(rel_err(to_f32(dsum.get(), n, s), sum), tol<T>()) << "residual_forward";
  // accumulate: out += in, where out starts as a.
  Dev<T> dacc = to_device<T>(a, s);
  accumulate(dacc.get(), dbb.get(), static_cast<int64_t>(n), s);
  EXPECT_LT(rel_err(to_f32(dacc.get(), n, s), sum), tol<T>()) << "accumulate";
  // residual_forward in place over its first input.
  residual_forward(da.get(), da.get(), dbb.get(), static_cast<int64_t>(n), s);
  EXPECT_LT(rel_err(to_f32(da.get(), n, s), sum), tol<T>()) << "residual_forward in place";
  Dev<T> dbiased = to_device<T>(a, s);
  add_bias(dbiased.get(), dbias.get(), M, N, s);
  EXPECT_LT(rel_err(to_f32(dbiased.get(), n, s), biased), tol<T>()) << "add_bias";

  // bias_backward ACCUMULATES column sums.
  const auto dy = as_input<T>(randn(n, 34));
  const auto g0 = randn(N, 35);
  std::vector<double> want(g0.begin(), g0.end());
  for (int64_t r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) want[c] += dy[r * N + c];
  Dev<T> ddy = to_device<T>(dy, s);
  Dev<float> dg = upload(g0, s), scratch(static_cast<size_t>(column_sum_scratch(M, N)));
  bias_backward(dg.get(), ddy.get(), M, N, scratch.get(), s);
  EXPECT_LT(rel_err(download(dg.get(), N, s), want), 1e-5) << "bias_backward";
}

TEST(CudaKernels, ResidualAndBiasMatchCpu) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  check_residual_and_bias<float>(1, 45);
  check_residual_and_bias<float>(37, 45);
  check_residual_and_bias<float>(301, 769);
  check_residual_and_bias<float>(5001, 33);
}

TEST(CudaKernels, ResidualAndBiasBf16MatchCpu) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  check_residual_and_bias<bf16>(37, 45);
  check_residual_and_bias<bf16>(301, 769);
}

// The biases fused into the pass after their product: bias + residual, bias + GELU (the biased
// input kept), and the c_attn bias added while splitting the heads; each against the CPU's
// unfused kernels.
template <typename T>
void check_fused_biases(int B, int T_, int NH, int hs) {
  SCOPED_TRACE(::testing::Message() << "B " << B << " T " << T_ << " NH " << NH << " hs " << hs);
  TestStream stream;
  const cudaStream_t s = stream.get();
  const int C = NH * hs;
  const int64_t M = int64_t{B} * T_;
  const size_t n = static_cast<size_t>(M) * C;
  const auto in = as_input<T>(randn(n, 41)), res = as_input<T>(randn(n, 42));
  const auto bias = randn(4 * static_cast<size_t>(C), 43);
  // bias_residual_forward against kernels::bias_residual_forward.
  std::vector<float> want(n);
  kernels::bias_residual_forward(want.data(), in.data(), bias.data(), res.data(), M, C);
  Dev<T> din = to_device<T>(in, s), dres = to_device<T>(res, s), dout(n);
  Dev<float> dbias = upload(bias, s);
  bias_residual_forward(dout.get(), din.get(), dbias.get(), dres.get(), M, C, s);
  EXPECT_LT(rel_err(to_f32(dout.get(), n, s), want), tol<T>()) << "bias_residual_forward";
  // gelu_bias_forward against bias_forward then gelu_forward on [M, 4C].
  const size_t n4 = n * 4;
  const auto pre = as_input<T>(randn(n4, 44));
  std::vector<float> biased(n4), act(n4);
  kernels::bias_forward(biased.data(), pre.data(), bias.data(), M, 4 * C);
  kernels::gelu_forward(act.data(), biased.data(), static_cast<int64_t>(n4));
  Dev<T> dpre = to_device<T>(pre, s), dact(n4);
  gelu_bias_forward(dpre.get(), dact.get(), dbias.get(), M, 4 * C, s);
  EXPECT_LT(rel_err(to_f32(dpre.get(), n4, s), biased), tol<T>()) << "gelu_bias_forward input";
  EXPECT_LT(rel_err(to_f32(dact.get(), n4, s), act), tol<T>()) << "gelu_bias_forward output";
  // split_qkv_heads with the bias against the split of qkv + bias.
  const size_t n3 = n * 3;
  const auto qkv = as_input<T>(randn(n3, 45));
  std::vector<float> qkvb(n3);
  kernels::bias_forward(qkvb.data(), qkv.data(), bias.data(), M, 3 * C);
  Dev<T> dqkv = to_device<T>(qkv, s), dqkvb = to_device<T>(qkvb, s);
  Dev<T> q(n), k(n), v(n), q0(n), k0(n), v0(n);
  split_qkv_heads(q.get(), k.get(), v.get(), dqkv.get(), B, T_, NH, hs, s, dbias.get());
  split_qkv_heads(q0.get(), k0.get(), v0.get(), dqkvb.get(), B, T_, NH, hs, s);
  EXPECT_LT(rel_err(to_f32(q.get(), n, s), to_f32(q0.get(), n, s)), tol<T>()) << "queries";
  EXPECT_LT(rel_err(to_f32(k.get(), n, s), to_f32(k0.get(), n, s)), tol<T>()) << "keys";
  EXPECT_LT(rel_err(to_f32(v.get(), n, s), to_f32(v0.get(), n, s)), tol<T>()) << "values";
}

TEST(CudaKernels, FusedBiasesMatchTheUnfusedCpuKernels) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  check_fused_biases<float>(1, 1, 1, 3);
  check_fused_biases<float>(3, 17, 4, 5);
  check_fused_biases<float>(2, 65, 12, 64);
  check_fused_biases<bf16>(3, 17, 4, 5);
  check_fused_biases<bf16>(2, 65, 12, 64);
}

// ---- Dropout -----------------------------------------------------------------------------------

TEST(CudaKernels, DropoutIsBitwiseTheCpuMask) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  TestStream stream;
  const cudaStream_t s = stream.get();
  const int64_t rows = 37, first_row = 13;
  const int C = 45;
  const float p = 0.1f;
  const uint64_t seed = 1234, stream_id = mix_stream(3, stable_hash("h.0.attn.resid_dropout"));
  const size_t n = static_cast<size_t>(rows) * C;
  const auto x = randn(n, 41);
  std::vector<float> y(n);
  kernels::dropout_forward_rows(y.data(), nullptr, x.data(), rows, C, p, seed, stream_id,
                                first_row);
  Dev<float> dx = upload(x, s), dy(n);
  dropout_forward(dy.get(), dx.get(), rows, C, p, seed, stream_id, first_row, s);
  EXPECT_EQ(download(dy.get(), n, s), y);
  int dropped = 0;
  for (float v : y) dropped += v == 0.0f;
  EXPECT_GT(dropped, 0);
  // In place.
  Dev<float> inplace = upload(x, s);
  dropout_forward(inplace.get(), inplace.get(), rows, C, p, seed, stream_id, first_row, s);
  EXPECT_EQ(download(inplace.get(), n, s), y);
  // Backward: the CPU's mask, redrawn.
  const auto g = randn(n, 42);
  std::vector<uint8_t> mask(n);
  kernels::dropout_mask_rows(mask.data(), rows, C, p, seed, stream_id, first_row);
  std::vector<float> dx_cpu(n);
  kernels::dropout_backward(dx_cpu.data(), g.data(), mask.data(), static_cast<int64_t>(n), p);
  Dev<float> dg = upload(g, s), ddx(n);
  dropout_backward(ddx.get(), dg.get(), rows, C, p, seed, stream_id, first_row, s);
  EXPECT_EQ(download(ddx.get(), n, s), dx_cpu);
  dropout_backward(dg.get(), dg.get(), rows, C, p, seed, stream_id, first_row, s);
  EXPECT_EQ(download(dg.get(), n, s), dx_cpu);
  // p = 0: a copy.
  Dev<float> copy(n);
  dropout_forward(copy.get(), dx.get(), rows, C, 0.0f, seed, stream_id, first_row, s);
  EXPECT_EQ(download(copy.get(), n, s), x);
  EXPECT_THROW(dropout_forward(copy.get(), dx.get(), rows, C, 1.0f, seed, stream_id, 0, s),
               ConfigError);
}

TEST(CudaKernels, DropoutBf16KeepsTheCpuMask) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  TestStream stream;
  const cudaStream_t s = stream.get();
  const int64_t rows = 65, first_row = 1000;
  const int C = 300;
  const float p = 0.1f;
  const uint64_t seed = 99, stream_id = mix_stream(5, 17);
  const size_t n = static_cast<size_t>(rows) * C;
  const auto x = as_input<bf16>(randn(n, 43));
  std::vector<float> y(n);
  kernels::dropout_forward_rows(y.data(), nullptr, x.data(), rows, C, p, seed, stream_id,
                                first_row);
  Dev<bf16> dx = to_device<bf16>(x, s), dy(n);
  dropout_forward(dy.get(), dx.get(), rows, C, p, seed, stream_id, first_row, s);
  const auto got = to_f32(dy.get(), n, s);
  EXPECT_LT(rel_err(got, y), 1e-2);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i] == 0.0f, y[i] == 0.0f) << i;
  dropout_backward(dx.get(), dx.get(), rows, C, p, seed, stream_id, first_row, s);
  EXPECT_EQ(to_f32(dx.get(), n, s), got) << "the same formula and mask as the forward";
}

// ---- Attention heads ---------------------------------------------------------------------------

template <typename T>
void check_heads(int B, int T_, int NH, int hs) {
  TestStream stream;
  const cudaStream_t s = stream.get();
  const int C = NH * hs;
  const auto qkv = as_input<T>(randn(static_cast<size_t>(B) * T_ * 3 * C, 51));
  const size_t n = static_cast<size_t>(B) * NH * T_ * hs;
  std::vector<float> q(n), k(n), v(n);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T_; ++t)
        for (int d = 0; d < hs; ++d) {
          const size_t i = ((static_cast<size_t>(b) * NH + h) * T_ + t) * hs + d;
          const size_t src = (static_cast<size_t>(b) * T_ + t) * 3 * C + h * hs + d;
          q[i] = qkv[src];
          k[i] = qkv[src + C];
          v[i] = qkv[src + 2 * C];
        }
  Dev<T> dqkv = to_device<T>(qkv, s), dq(n), dk(n), dv(n);
  split_qkv_heads(dq.get(), dk.get(), dv.get(), dqkv.get(), B, T_, NH, hs, s);
  EXPECT_EQ(to_f32(dq.get(), n, s), q);
  EXPECT_EQ(to_f32(dk.get(), n, s), k);
  EXPECT_EQ(to_f32(dv.get(), n, s), v);
  Dev<T> back(qkv.size());
  merge_qkv_heads(back.get(), dq.get(), dk.get(), dv.get(), B, T_, NH, hs, s);
  EXPECT_EQ(to_f32(back.get(), qkv.size(), s), qkv);
  // merge_heads: out[b, t, h hs + d] = y[b, h, t, d]; split_heads inverts it.
  std::vector<float> out(n);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T_; ++t)
        for (int d = 0; d < hs; ++d)
          out[(static_cast<size_t>(b) * T_ + t) * C + h * hs + d] =
              q[((static_cast<size_t>(b) * NH + h) * T_ + t) * hs + d];
  Dev<T> dout(n), dy(n);
  merge_heads(dout.get(), dq.get(), B, T_, NH, hs, s);
  EXPECT_EQ(to_f32(dout.get(), n, s), out);
  split_heads(dy.get(), dout.get(), B, T_, NH, hs, s);
  EXPECT_EQ(to_f32(dy.get(), n, s), q);
}

TEST(CudaKernels, HeadsReorderExactly) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  check_heads<float>(2, 7, 3, 5);
  check_heads<float>(1, 65, 4, 64);
  check_heads<bf16>(2, 7, 3, 5);
}

// ---- Causal softmax ----------------------------------------------------------------------------

// The double reference of the forward: att[row, j] over j <= t, 0 above.
std::vector<double> softmax_ref(const std::vector<float>& scores, int64_t rows, int T_,
                                float scale) {
  std::vector<double> att(scores.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const int t = static_cast<int>(r % T_);
    const float* sc = scores.data() + r * T_;
    double mx = -1e300, z = 0.0;
    for (int j = 0; j <= t; ++j) mx = std::max(mx, static_cast<double>(scale) * sc[j]);
    for (int j = 0; j <= t; ++j) z += std::exp(static_cast<double>(scale) * sc[j] - mx);
    for (int j = 0; j <= t; ++j)
      att[r * T_ + j] = std::exp(static_cast<double>(scale) * sc[j] - mx) / z;
  }
  return att;
}

template <typename T>
void check_causal_softmax_forward(int B, int NH, int T_) {
  SCOPED_TRACE(::testing::Message() << "T " << T_);
  TestStream stream;
  const cudaStream_t s = stream.get();
  const int64_t rows = static_cast<int64_t>(B) * NH * T_;
  const size_t n = static_cast<size_t>(rows) * T_;
  const float scale = 0.125f;
  const auto scores = as_input<T>(randn(n, 61, 8.0f));
  const auto want = softmax_ref(scores, rows, T_, scale);
  Dev<T> dscores = to_device<T>(scores, s), datt(n);
  causal_softmax_forward(datt.get(), static_cast<T*>(nullptr), dscores.get(), B, NH, T_, scale,
                         AttnDropout{}, s);
  const auto got = to_f32(datt.get(), n, s);
  EXPECT_LT(rel_err(got, want), tol<T>());
  for (int64_t r = 0; r < rows; ++r)
    for (int j = static_cast<int>(r % T_) + 1; j < T_; ++j)
      ASSERT_EQ(got[r * T_ + j], 0.0f) << "above the diagonal, row " << r << " column " << j;
  // In place over the scores: the same numbers.
  causal_softmax_forward(dscores.get(), static_cast<T*>(nullptr), dscores.get(), B, NH, T_, scale,
                         AttnDropout{}, s);
  EXPECT_EQ(to_f32(dscores.get(), n, s), got);
}

TEST(CudaKernels, CausalSoftmaxForwardMatchesDouble) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  for (int T_ : {1, 7, 65, 300}) check_causal_softmax_forward<float>(2, 3, T_);
  check_causal_softmax_forward<float>(1, 1, 1100);  // 8 elements a thread
  check_causal_softmax_forward<float>(1, 1, 2100);  // past the register forms
}

TEST(CudaKernels, CausalSoftmaxForwardBf16MatchesDouble) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  for (int T_ : {1, 7, 65, 300}) check_causal_softmax_forward<bf16>(2, 3, T_);
}

// The probabilities and the dropped probabilities against the CPU attention kernel with the same
// dropout coordinates (the scores: Q K^T per (sample, head), computed here).
TEST(CudaKernels, CausalSoftmaxDropoutMatchesCpuAttention) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  TestStream stream;
  const cudaStream_t s = stream.get();
  for (int T_ : {7, 65, 130}) {
    SCOPED_TRACE(::testing::Message() << "T " << T_);
    const int B = 2, NH = 3, hs = 8, C = NH * hs;
    const auto qkv = randn(static_cast<size_t>(B) * T_ * 3 * C, 71);
    kernels::AttentionDropout drop;
    drop.p = 0.1f;
    drop.seed = 77;
    drop.stream = mix_stream(9, stable_hash("h.3.attn.attn_dropout"));
    drop.first_sample = 5;
    const size_t n = static_cast<size_t>(B) * NH * T_ * T_;
    std::vector<float> out(static_cast<size_t>(B) * T_ * C), att(n), att_drop(n);
    kernels::attention_forward(out.data(), att.data(), att_drop.data(), qkv.data(), B, T_, C, NH,
                               &drop);
    std::vector<float> scores(n);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < NH; ++h)
        for (int t = 0; t < T_; ++t)
          for (int j = 0; j < T_; ++j) {
            double dot = 0.0;
            for (int d = 0; d < hs; ++d)
              dot +=
                  static_cast<double>(qkv[(static_cast<size_t>(b) * T_ + t) * 3 * C + h * hs + d]) *
                  qkv[(static_cast<size_t>(b) * T_ + j) * 3 * C + C + h * hs + d];
            scores[((static_cast<size_t>(b) * NH + h) * T_ + t) * T_ + j] = static_cast<float>(dot);
          }
    Dev<float> dscores = upload(scores, s), datt(n), ddrop(n);
    AttnDropout gdrop;
    gdrop.p = drop.p;
    gdrop.seed = drop.seed;
    gdrop.stream_id = drop.stream;
    gdrop.first_sample = drop.first_sample;
    causal_softmax_forward(datt.get(), ddrop.get(), dscores.get(), B, NH, T_,
                           1.0f / std::sqrt(static_cast<float>(hs)), gdrop, s);
    const auto got = download(datt.get(), n, s), got_drop = download(ddrop.get(), n, s);
    std::vector<float> lower, lower_cpu, lower_drop, lower_drop_cpu;
    int dropped = 0;
    for (size_t r = 0; r < n / T_; ++r) {
      const int t = static_cast<int>(r % T_);
      for (int j = 0; j < T_; ++j) {
        const size_t i = r * T_ + j;
        if (j > t) {
          ASSERT_EQ(got_drop[i], 0.0f);
          continue;
        }
        lower.push_back(got[i]);
        lower_cpu.push_back(att[i]);
        lower_drop.push_back(got_drop[i]);
        lower_drop_cpu.push_back(att_drop[i]);
        ASSERT_EQ(got_drop[i] == 0.0f, att_drop[i] == 0.0f) << "the mask differs at " << i;
        dropped += att_drop[i] == 0.0f;
      }
    }
    EXPECT_GT(dropped, 0);
    EXPECT_LT(rel_err(lower, lower_cpu), 1e-5);
    EXPECT_LT(rel_err(lower_drop, lower_drop_cpu), 1e-5);
  }
}

template <typename T>
void check_causal_softmax_backward(int B, int NH, int T_, float p) {
  SCOPED_TRACE(::testing::Message() << "T " << T_ << " p " << p);
  TestStream stream;
  const cudaStream_t s = stream.get();
  const int64_t rows = static_cast<int64_t>(B) * NH * T_;
  const size_t n = static_cast<size_t>(rows) * T_;
  const float scale = 0.125f;
  AttnDropout drop;
  drop.p = p;
  drop.seed = 5;
  drop.stream_id = mix_stream(2, 3);
  drop.first_sample = 3;
  const auto ref = softmax_ref(randn(n, 81, 8.0f), rows, T_, scale);
  const auto att = as_input<T>(std::vector<float>(ref.begin(), ref.end()));
  const auto datt = as_input<T>(randn(n, 82));
  std::vector<double> want(n, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const int t = static_cast<int>(r % T_);
    const uint64_t base = (static_cast<uint64_t>(drop.first_sample) * NH + r / T_) * T_ + t;
    std::vector<double> g(t + 1);
    double dot = 0.0;
    for (int j = 0; j <= t; ++j) {
      g[j] = datt[r * T_ + j];
      if (p > 0.0f)
        g[j] =
            philox_uniform(drop.seed, drop.stream_id, base * T_ + j) > p ? g[j] / (1.0 - p) : 0.0;
      dot += att[r * T_ + j] * g[j];
    }
    for (int j = 0; j <= t; ++j) want[r * T_ + j] = scale * att[r * T_ + j] * (g[j] - dot);
  }
  Dev<T> dA = to_device<T>(att, s), dG = to_device<T>(datt, s), dS(n);
  causal_softmax_backward(dS.get(), dG.get(), dA.get(), B, NH, T_, scale, drop, s);
  const auto got = to_f32(dS.get(), n, s);
  EXPECT_LT(rel_err(got, want), tol<T>());
  for (int64_t r = 0; r < rows; ++r)
    for (int j = static_cast<int>(r % T_) + 1; j < T_; ++j) ASSERT_EQ(got[r * T_ + j], 0.0f);
  // In place over datt.
  causal_softmax_backward(dG.get(), dG.get(), dA.get(), B, NH, T_, scale, drop, s);
  EXPECT_EQ(to_f32(dG.get(), n, s), got);
}

TEST(CudaKernels, CausalSoftmaxBackwardMatchesDouble) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  for (float p : {0.0f, 0.1f})
    for (int T_ : {1, 7, 65, 300, 1100, 2100}) check_causal_softmax_backward<float>(1, 2, T_, p);
}

TEST(CudaKernels, CausalSoftmaxBackwardBf16MatchesDouble) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  for (float p : {0.0f, 0.1f})
    for (int T_ : {7, 300}) check_causal_softmax_backward<bf16>(2, 3, T_, p);
}

// ---- Loss --------------------------------------------------------------------------------------

template <typename T>
void check_softmax_xent(int N, int V) {
  SCOPED_TRACE(::testing::Message() << "N " << N << " V " << V);
  TestStream stream;
  const cudaStream_t s = stream.get();
  const size_t n = static_cast<size_t>(N) * V;
  const auto logits = as_input<T>(randn(n, 91, 2.0f));
  std::mt19937 rng(92);
  std::vector<int32_t> targets(N);
  int counted = 0;
  for (int i = 0; i < N; ++i) {
    targets[i] = i % 5 == 2 ? -1 : static_cast<int32_t>(rng() % V);
    counted += targets[i] >= 0;
  }
  targets[N - 1] = V - 1;
  const float scale = 1.0f / static_cast<float>(std::max(counted, 1));
  std::vector<float> losses(N), lse(N), grad(n);
  kernels::softmax_xent_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V);
  kernels::softmax_xent_backward(grad.data(), logits.data(), lse.data(), targets.data(), scale, N,
                                 V);
  Dev<T> dlogits = to_device<T>(logits, s);
  Dev<int32_t> dtargets = upload(targets, s);
  Dev<float> dlosses(N);
  softmax_xent_forward(dlosses.get(), static_cast<const T*>(dlogits.get()), dtargets.get(), N, V,
                       s);
  const auto got_eval = download(dlosses.get(), N, s);
  EXPECT_LT(rel_err(got_eval, losses), 1e-5) << "forward";
  EXPECT_EQ(to_f32(dlogits.get(), n, s), logits) << "the forward leaves the logits";
  cudaMemsetAsync(dlosses.get(), 0xff, sizeof(float) * N, s);
  softmax_xent_forward_backward(dlogits.get(), dlosses.get(), dtargets.get(), scale, N, V, s);
  const auto got_losses = download(dlosses.get(), N, s);
  EXPECT_LT(rel_err(got_losses, got_eval), 1e-6) << "the fused pass computes the same losses";
  const auto got = to_f32(dlogits.get(), n, s);
  EXPECT_LT(rel_err(got, grad), tol<T>()) << "dlogits";
  for (int i = 0; i < N; ++i) {
    if (targets[i] >= 0) continue;
    EXPECT_EQ(got_losses[i], 0.0f);
    for (int v = 0; v < V; ++v) ASSERT_EQ(got[static_cast<size_t>(i) * V + v], 0.0f);
  }
}

TEST(CudaKernels, SoftmaxXentMatchesCpu) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  check_softmax_xent<float>(37, 1000);
  check_softmax_xent<float>(37, 50257);
  check_softmax_xent<float>(3, 7);
}

TEST(CudaKernels, SoftmaxXentBf16MatchesCpu) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  check_softmax_xent<bf16>(37, 1000);
  check_softmax_xent<bf16>(37, 50257);
}

// ---- Optimizer ---------------------------------------------------------------------------------

TEST(CudaKernels, AdamwMatchesCpuPerSegmentAndLeavesPadding) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  TestStream stream;
  const cudaStream_t s = stream.get();
  const std::vector<int64_t> begin = {0, 130, 300, 1000, 1031};
  const std::vector<int64_t> length = {100, 150, 513, 7, 1};
  const std::vector<uint8_t> decay = {1, 0, 1, 0, 1};
  const int64_t flat_n = 1100;  // padding at [100, 130), [280, 300), [813, 1000), ..., [1032, 1100)
  const int segments = static_cast<int>(begin.size());
  const auto param0 = randn(flat_n, 101);
  const auto m0 = randn(flat_n, 102, 0.01f);
  auto v0 = randn(flat_n, 103, 0.001f);
  for (float& x : v0) x = std::abs(x);
  std::vector<float> param = param0, m = m0, v = v0;
  Dev<float> dp = upload(param0, s), dm = upload(m0, s), dv = upload(v0, s);
  Dev<int64_t> dbegin = upload(begin, s), dlength = upload(length, s);
  Dev<uint8_t> ddecay = upload(decay, s);
  AdamwArgs args;
  args.lr = 3e-3f;
  for (int64_t t = 1; t <= 3; ++t) {
    const auto grad = randn(flat_n, 110 + static_cast<uint32_t>(t), 0.1f);
    for (int i = 0; i < segments; ++i)
      optim::adamw_update(param.data() + begin[i], m.data() + begin[i], v.data() + begin[i],
                          grad.data() + begin[i], length[i], args.lr, args.beta1, args.beta2,
                          args.eps, decay[i] ? args.weight_decay : 0.0f, t);
    Dev<float> dg = upload(grad, s);
    args.t = t;
    adamw_step(dp.get(), dm.get(), dv.get(), dg.get(), dbegin.get(), dlength.get(), ddecay.get(),
               segments, flat_n, args, s);
  }
  const auto gp = download(dp.get(), flat_n, s), gm = download(dm.get(), flat_n, s),
             gv = download(dv.get(), flat_n, s);
  for (int i = 0; i < segments; ++i) {
    SCOPED_TRACE(::testing::Message() << "segment " << i);
    auto slice = [&](const std::vector<float>& x) {
      return std::vector<float>(x.begin() + begin[i], x.begin() + begin[i] + length[i]);
    };
    EXPECT_LT(rel_err(slice(gp), slice(param)), 1e-6);
    EXPECT_LT(rel_err(slice(gm), slice(m)), 1e-6);
    EXPECT_LT(rel_err(slice(gv), slice(v)), 1e-6);
    EXPECT_NE(slice(gp), slice(param0));
  }
  std::vector<bool> inside(flat_n, false);
  for (int i = 0; i < segments; ++i)
    for (int64_t j = begin[i]; j < begin[i] + length[i]; ++j) inside[j] = true;
  for (int64_t j = 0; j < flat_n; ++j) {
    if (inside[j]) continue;
    ASSERT_EQ(gp[j], param0[j]) << "padding element " << j;
    ASSERT_EQ(gm[j], m0[j]) << "padding element " << j;
    ASSERT_EQ(gv[j], v0[j]) << "padding element " << j;
  }
}

// ---- Reductions --------------------------------------------------------------------------------

TEST(CudaKernels, SumsMatchDoubleLoops) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  TestStream stream;
  const cudaStream_t s = stream.get();
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{1000003}}) {
    SCOPED_TRACE(::testing::Message() << "n " << n);
    const auto x = randn(n, 121, 1.0f, 0.5f);
    double sq = 0.0, sm = 0.0;
    for (float v : x) {
      sq += static_cast<double>(v) * v;
      sm += v;
    }
    Dev<float> dx = upload(x, s);
    Dev<double> scratch(static_cast<size_t>(sum_squares_scratch(n)));
    EXPECT_NEAR(sum_squares(dx.get(), n, scratch.get(), s), sq, 1e-10 * sq);
    EXPECT_NEAR(sum(dx.get(), n, scratch.get(), s), sm, 1e-10 * std::abs(sm));
  }
}

// ---- Determinism: every kernel twice on the same inputs, bitwise the same ---------------------
// (except embedding_backward's dwte, whose atomics add in a varying order)

template <typename T>
std::vector<uint8_t> bytes_of(const Dev<T>& d, cudaStream_t s) {
  std::vector<uint8_t> v(sizeof(T) * d.size());
  copy_out(v.data(), d.get(), v.size(), s);
  return v;
}

template <typename T>
std::vector<std::vector<uint8_t>> run_everything(cudaStream_t s) {
  std::vector<std::vector<uint8_t>> results;
  const int B = 2, T_ = 300, C = 769, V = 50257, NH = 3;
  const int N = B * T_;
  const size_t nc = static_cast<size_t>(N) * C;
  // Embedding.
  std::vector<int32_t> tokens(N);
  for (int i = 0; i < N; ++i) tokens[i] = (i * 7919) % 1000;
  Dev<int32_t> dtok = upload(tokens, s);
  Dev<float> wte = upload(randn(1000 * static_cast<size_t>(C), 1), s);
  Dev<float> wpe = upload(randn(static_cast<size_t>(T_) * C, 2), s);
  Dev<T> x(nc);
  embedding_forward(x.get(), dtok.get(), wte.get(), wpe.get(), B, T_, C, s);
  results.push_back(bytes_of(x, s));
  Dev<T> dy = to_device<T>(randn(nc, 3), s);
  Dev<float> dwpe = upload(randn(static_cast<size_t>(T_) * C, 4), s);
  embedding_backward(static_cast<float*>(nullptr), dwpe.get(), dy.get(), dtok.get(), B, T_, C, s);
  results.push_back(bytes_of(dwpe, s));
  // LayerNorm.
  Dev<float> w = upload(randn(C, 5, 0.5f, 1.0f), s), b = upload(randn(C, 6), s);
  Dev<T> ln(nc);
  Dev<float> mean(N), rstd(N);
  layernorm_forward(ln.get(), mean.get(), rstd.get(), x.get(), w.get(), b.get(), N, C, 1e-5f, s);
  results.push_back(bytes_of(ln, s));
  results.push_back(bytes_of(rstd, s));
  Dev<T> din = to_device<T>(randn(nc, 7), s);
  Dev<float> dw = upload(randn(C, 8), s), db = upload(randn(C, 9), s);
  Dev<float> scratch(
      static_cast<size_t>(std::max(layernorm_backward_scratch(N, C), column_sum_scratch(N, C))));
  layernorm_backward(din.get(), dw.get(), db.get(), dy.get(), x.get(), w.get(), mean.get(),
                     rstd.get(), N, C, scratch.get(), s);
  results.push_back(bytes_of(din, s));
  results.push_back(bytes_of(dw, s));
  results.push_back(bytes_of(db, s));
  bias_backward(db.get(), dy.get(), N, C, scratch.get(), s);
  results.push_back(bytes_of(db, s));
  // Elementwise.
  Dev<T> g(nc);
  gelu_forward(g.get(), x.get(), static_cast<int64_t>(nc), s);
  gelu_backward(g.get(), dy.get(), x.get(), static_cast<int64_t>(nc), s);
  residual_forward(g.get(), g.get(), x.get(), static_cast<int64_t>(nc), s);
  accumulate(g.get(), dy.get(), static_cast<int64_t>(nc), s);
  add_bias(g.get(), b.get(), N, C, s);
  dropout_forward(g.get(), g.get(), N, C, 0.1f, 1, 2, 3, s);
  dropout_backward(g.get(), g.get(), N, C, 0.1f, 1, 2, 3, s);
  results.push_back(bytes_of(g, s));
  // Attention softmax with dropout.
  const size_t na = static_cast<size_t>(B) * NH * T_ * T_;
  Dev<T> scores = to_device<T>(randn(na, 10, 8.0f), s), att(na), att_drop(na);
  AttnDropout drop;
  drop.p = 0.1f;
  drop.seed = 11;
  drop.stream_id = 12;
  drop.first_sample = 1;
  causal_softmax_forward(att.get(), att_drop.get(), scores.get(), B, NH, T_, 0.125f, drop, s);
  results.push_back(bytes_of(att, s));
  results.push_back(bytes_of(att_drop, s));
  causal_softmax_backward(scores.get(), att_drop.get(), att.get(), B, NH, T_, 0.125f, drop, s);
  results.push_back(bytes_of(scores, s));
  // Loss.
  const int NL = 17;
  Dev<T> logits = to_device<T>(randn(static_cast<size_t>(NL) * V, 13, 2.0f), s);
  std::vector<int32_t> targets(NL);
  for (int i = 0; i < NL; ++i) targets[i] = i == 3 ? -1 : (i * 2999) % V;
  Dev<int32_t> dtargets = upload(targets, s);
  Dev<float> losses(NL);
  softmax_xent_forward_backward(logits.get(), losses.get(), dtargets.get(), 0.1f, NL, V, s);
  results.push_back(bytes_of(logits, s));
  results.push_back(bytes_of(losses, s));
  // Optimizer and sums (fp32 buffers).
  const int64_t flat_n = 3000001;
  Dev<float> p = upload(randn(flat_n, 14), s), m = upload(randn(flat_n, 15, 0.01f), s);
  auto v0 = randn(flat_n, 16, 0.01f);
  for (float& z : v0) z = std::abs(z);
  Dev<float> v = upload(v0, s), grad = upload(randn(flat_n, 17), s);
  Dev<int64_t> begin = upload(std::vector<int64_t>{0, 1000, 2000000}, s);
  Dev<int64_t> length = upload(std::vector<int64_t>{999, 1500000, 1000001}, s);
  Dev<uint8_t> decay = upload(std::vector<uint8_t>{1, 0, 1}, s);
  adamw_step(p.get(), m.get(), v.get(), grad.get(), begin.get(), length.get(), decay.get(), 3,
             flat_n, AdamwArgs{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 4}, s);
  results.push_back(bytes_of(p, s));
  Dev<double> sscratch(static_cast<size_t>(sum_squares_scratch(flat_n)));
  const double sums[2] = {sum_squares(p.get(), flat_n, sscratch.get(), s),
                          sum(grad.get(), flat_n, sscratch.get(), s)};
  results.emplace_back(reinterpret_cast<const uint8_t*>(sums),
                       reinterpret_cast<const uint8_t*>(sums) + sizeof(sums));
  return results;
}

TEST(CudaKernels, EveryKernelIsDeterministic) {
  if (!tessera::cuda::available()) GTEST_SKIP() << "no CUDA device";
  TestStream stream;
  const auto first = run_everything<float>(stream.get());
  const auto second = run_everything<float>(stream.get());
  ASSERT_EQ(first.size(), second.size());
  for (size_t i = 0; i < first.size(); ++i) EXPECT_TRUE(first[i] == second[i]) << "result " << i;
  const auto first16 = run_everything<bf16>(stream.get());
  const auto second16 = run_everything<bf16>(stream.get());
  ASSERT_EQ(first16.size(), second16.size());
  for (size_t i = 0; i < first16.size(); ++i)
    EXPECT_TRUE(first16[i] == second16[i]) << "bf16 result " << i;
}

}  // namespace
}  // namespace tessera::cuda
