#include "tessera/core/tensor.h"

#include <cstring>

#include "tessera/core/error.h"

namespace tessera {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

Storage::Storage(size_t bytes, Allocator& alloc, MemCategory cat, std::string tag)
    : data_(nullptr), bytes_(bytes), alloc_(&alloc), cat_(cat), tag_(std::move(tag)) {
  data_ = alloc_->allocate(bytes_, cat_, tag_);
}

Storage::~Storage() {
  alloc_->deallocate(data_, bytes_, cat_, tag_);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, MemCategory cat, std::string tag,
                     Allocator* alloc) {
  for (int64_t d : shape)
    TESSERA_CHECK_AS(ShapeError, d >= 0, "negative dimension in shape ", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ =
      std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype),
                                alloc ? *alloc : Allocator::current(), cat, std::move(tag));
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, MemCategory cat, std::string tag,
                     Allocator* alloc) {
  Tensor t = empty(shape, dtype, cat, std::move(tag), alloc);
  t.zero_();
  return t;
}

Tensor Tensor::from(const std::vector<float>& values, const Shape& shape) {
  TESSERA_CHECK_AS(ShapeError, static_cast<int64_t>(values.size()) == shape_numel(shape),
                   values.size(), " values do not fill shape ", shape_str(shape));
  Tensor t = empty(shape);
  if (!values.empty()) std::memcpy(t.raw(), values.data(), values.size() * sizeof(float));
  return t;
}

int64_t Tensor::dim(int i) const {
  int n = ndim();
  int j = i < 0 ? i + n : i;
  TESSERA_CHECK_AS(ShapeError, j >= 0 && j < n, "dimension ", i, " out of range for shape ",
                   shape_str(shape_));
  return shape_[j];
}

void* Tensor::raw() const {
  if (!storage_ || storage_->data() == nullptr) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

float* Tensor::f32() const {
  TESSERA_CHECK_AS(ShapeError, dtype_ == DType::F32, "expected an F32 tensor, got ",
                   dtype_name(dtype_));
  return data<float>();
}

Tensor Tensor::view(int64_t offset, const Shape& shape) const {
  TESSERA_CHECK_AS(ShapeError, offset >= 0 && offset + shape_numel(shape) <= numel(), "view of ",
                   shape_str(shape), " at offset ", offset, " does not fit in a tensor of shape ",
                   shape_str(shape_));
  Tensor t = *this;
  t.offset_ = offset_ + offset;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  TESSERA_CHECK_AS(ShapeError, shape_numel(shape) == numel(), "cannot reshape ", shape_str(shape_),
                   " to ", shape_str(shape));
  return view(0, shape);
}

Tensor Tensor::slice0(int64_t begin, int64_t end) const {
  TESSERA_CHECK_AS(ShapeError, ndim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0],
                   "rows [", begin, ", ", end, ") out of range for shape ", shape_str(shape_));
  Shape s = shape_;
  s[0] = end - begin;
  return view(begin * (numel() / std::max<int64_t>(shape_[0], 1)), s);
}

Tensor Tensor::clone(MemCategory cat, std::string tag) const {
  Tensor t = empty(shape_, dtype_, cat, std::move(tag));
  t.copy_from(*this);
  return t;
}

void Tensor::zero_() {
  if (nbytes() && !storage_->allocator().counts_only()) std::memset(raw(), 0, nbytes());
}

void Tensor::fill_(float v) {
  float* p = f32();
  for (int64_t i = 0, n = numel(); i < n; ++i) p[i] = v;
}

void Tensor::copy_from(const Tensor& src) {
  TESSERA_CHECK_AS(ShapeError, src.numel() == numel() && src.dtype() == dtype_, "copy from ",
                   shape_str(src.shape()), " ", dtype_name(src.dtype()), " into ",
                   shape_str(shape_), " ", dtype_name(dtype_));
  if (nbytes()) std::memmove(raw(), src.raw(), nbytes());
}

std::vector<float> Tensor::to_vector() const {
  const float* p = f32();
  return std::vector<float>(p, p + numel());
}

}  // namespace tessera
