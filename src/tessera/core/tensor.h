// A contiguous, reference-counted n-d array. Views share storage (a flat range of it), so a rank's
// parameters can live in one buffer with one view per parameter.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "tessera/core/allocator.h"
#include "tessera/core/dtype.h"

namespace tessera {

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[4, 128, 768]"

// Raw memory owned by an Allocator; freed when the last Tensor referring to it goes away.
class Storage {
 public:
  Storage(size_t bytes, Allocator& alloc, MemCategory cat, std::string tag);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  const Allocator& allocator() const { return *alloc_; }

 private:
  void* data_;
  size_t bytes_;
  Allocator* alloc_;
  MemCategory cat_;
  std::string tag_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined: no storage, numel 0

  // Uninitialised / zero-filled tensors from `alloc` (default: Allocator::current()).
  static Tensor empty(const Shape& shape, DType dtype = DType::F32,
                      MemCategory cat = MemCategory::Other, std::string tag = "",
                      Allocator* alloc = nullptr);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32,
                      MemCategory cat = MemCategory::Other, std::string tag = "",
                      Allocator* alloc = nullptr);
  static Tensor from(const std::vector<float>& values, const Shape& shape);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const;  // negative i counts from the end
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* raw() const;
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw());
  }
  float* f32() const;  // checks dtype == F32

  // A view of `shape` starting `offset` elements into this tensor's elements.
  Tensor view(int64_t offset, const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;         // same elements, new shape
  Tensor slice0(int64_t begin, int64_t end) const;  // rows [begin, end) of dimension 0
  Tensor clone(MemCategory cat = MemCategory::Other, std::string tag = "") const;

  void zero_();         // a no-op on storage of address space only (Backing::AddressSpaceOnly)
  void fill_(float v);  // F32 only
  void copy_from(const Tensor& src);     // same numel and dtype
  std::vector<float> to_vector() const;  // F32 only
  bool shares_storage_with(const Tensor& o) const { return storage_ && storage_ == o.storage_; }

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
  Shape shape_;
  DType dtype_ = DType::F32;
};

}  // namespace tessera
