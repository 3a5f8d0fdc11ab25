// A user-written layer: a bottleneck adapter on the residual stream (Houlsby et al. 2019),
//   y = x + relu(x . W_down + b_down) . W_up + b_up,   x, y [rows, C], bottleneck R.
// It follows tessera's module conventions (docs/API.md, "Modules and activation records"):
// parameters registered in a ParameterSet under global names, activations in a Record the caller
// owns, the forward ASSIGNS its output, the backward ACCUMULATES parameter gradients, and every
// parameter and gradient is read through param_data / grad_data when it is used (ZeRO-3 points
// them at gathered buffers only while the layer runs).
#pragma once

#include <tessera/core.h>
#include <tessera/kernels/gemm.h>
#include <tessera/nn/parameters.h>

#include <algorithm>
#include <cstdint>
#include <string>

class Adapter {
 public:
  struct Record {
    tessera::Tensor h;         // [rows, R] the bottleneck after the ReLU
    tessera::Tensor dh;        // [rows, R] its gradient (backward scratch)
    const float* x = nullptr;  // the input, kept alive by the caller until backward
    int rows = 0;
  };

  Adapter(tessera::nn::ParameterSet& ps, const std::string& name, int C, int R)
      : ps_(ps), C_(C), R_(R) {
    using tessera::nn::Init;
    down_w_ = ps.add(name + ".down.weight", {C, R}, Init::Normal, 0.02f, true);
    down_b_ = ps.add(name + ".down.bias", {R}, Init::Zeros, 0.0f, false);
    up_w_ = ps.add(name + ".up.weight", {R, C}, Init::Normal, 0.02f, true);
    up_b_ = ps.add(name + ".up.bias", {C}, Init::Zeros, 0.0f, false);
  }

  Record make_record(int64_t max_rows, tessera::Allocator& alloc) const {
    using tessera::DType, tessera::MemCategory, tessera::Tensor;
    Record r;
    r.h = Tensor::zeros({max_rows * R_}, DType::F32, MemCategory::Activations, "adapter.h", &alloc);
    r.dh =
        Tensor::zeros({max_rows * R_}, DType::F32, MemCategory::Activations, "adapter.dh", &alloc);
    return r;
  }

  // ASSIGNS y[rows, C]; x must stay unchanged until backward(r, ...).
  void forward(const float* x, float* y, int rows, Record& r) const {
    float* h = r.h.f32();
    tessera::kernels::matmul_forward(h, x, w(down_w_), w(down_b_), nullptr, rows, C_, R_);
    for (int64_t i = 0; i < int64_t{rows} * R_; ++i) h[i] = std::max(h[i], 0.0f);
    tessera::kernels::matmul_forward(y, h, w(up_w_), w(up_b_), /*residual=*/x, rows, R_, C_);
    r.x = x;
    r.rows = rows;
  }

  // Given d[rows, C] = dL/dy, overwrites it with dL/dx and ACCUMULATES the four gradients.
  void backward(Record& r, float* d) const {
    const float* h = r.h.f32();
    float* dh = r.dh.f32();
    tessera::kernels::matmul_backward(dh, g(up_w_), g(up_b_), d, h, w(up_w_), r.rows, R_, C_);
    for (int64_t i = 0; i < int64_t{r.rows} * R_; ++i)
      if (h[i] <= 0.0f) dh[i] = 0.0f;
    // dL/dx = dL/dy (the residual) + dh . W_down^T: accumulate into d.
    tessera::kernels::matmul_backward(d, g(down_w_), g(down_b_), dh, r.x, w(down_w_), r.rows, C_,
                                      R_, /*accumulate_din=*/true);
  }

 private:
  float* w(int i) const { return ps_.param_data(i); }
  float* g(int i) const { return ps_.grad_data(i); }

  const tessera::nn::ParameterSet& ps_;
  int C_, R_;
  int down_w_ = -1, down_b_ = -1, up_w_ = -1, up_b_ = -1;
};
