#include "tessera/core/tensor.h"

#include <gtest/gtest.h>

#include <cmath>

namespace tessera {
namespace {

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::zeros({4, 3});
  Tensor row = t.slice0(1, 3);
  EXPECT_EQ(row.shape(), (Shape{2, 3}));
  row.fill_(2.0f);
  std::vector<float> v = t.to_vector();
  EXPECT_EQ(v[2], 0.0f);
  EXPECT_EQ(v[3], 2.0f);
  EXPECT_EQ(v[8], 2.0f);
  EXPECT_EQ(v[9], 0.0f);
  EXPECT_TRUE(row.shares_storage_with(t));
  Tensor c = t.clone();
  EXPECT_FALSE(c.shares_storage_with(t));
  EXPECT_EQ(c.to_vector(), v);
}

TEST(Tensor, BadShapesAreErrors) {
  Tensor t = Tensor::zeros({4, 3});
  EXPECT_THROW(t.reshape({5, 3}), ShapeError);
  EXPECT_THROW(t.view(10, {3}), ShapeError);
  EXPECT_THROW(t.slice0(3, 5), ShapeError);
  EXPECT_THROW(Tensor::empty({-1}), ShapeError);
  Tensor i = Tensor::zeros({2}, DType::I32);
  EXPECT_THROW(i.f32(), ShapeError);
}

TEST(BF16, RoundsToNearestEven) {
  EXPECT_EQ(from_bf16(to_bf16(1.0f)), 1.0f);
  // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1+2^-7: ties go to even (1).
  EXPECT_EQ(from_bf16(to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(from_bf16(to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(NAN))));
}

}  // namespace
}  // namespace tessera
