// Activation buffers of a module's record: named tensors in the allocator's Activations
// category, listed so that a NaN can be traced to the tensor that first held it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/allocator.h"
#include "tessera/core/tensor.h"

namespace tessera::nn {

struct NamedActivation {
  std::string name;
  Tensor t;
  int64_t width = 0;  // elements per token (B*T rows)
  // Holds only this rank's rows (token_range: sequence parallelism) instead of all B*T.
  bool sequence_slice = false;
};

// Allocates activation tensors for up to `rows` tokens (max_batch * block_size, or a
// sequence-parallel rank's slice of them: sequence_slice) and lists the F32 ones in `list` under
// their names.
class ActivationAllocator {
 public:
  ActivationAllocator(Allocator& alloc, int64_t rows, std::vector<NamedActivation>* list,
                      bool sequence_slice = false)
      : alloc_(alloc), rows_(rows), list_(list), sequence_slice_(sequence_slice) {}
  // rows * width elements.
  Tensor operator()(const std::string& name, int64_t width, DType dt = DType::F32) {
    Tensor t = Tensor::zeros({rows_ * width}, dt, MemCategory::Activations, name, &alloc_);
    if (list_ && dt == DType::F32) list_->push_back({name, t, width, sequence_slice_});
    return t;
  }

 private:
  Allocator& alloc_;
  int64_t rows_;
  std::vector<NamedActivation>* list_;
  bool sequence_slice_;
};

}  // namespace tessera::nn
