#include "tessera/core/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tessera/core/error.h"

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

namespace tessera {
namespace {
// Internal invariants are InternalErrors that say where and that they are bugs; user errors are
// not.
TEST(Errors, InternalAssertionNamesFileAndLine) {
  try {
    TESSERA_ASSERT(1 + 1 == 3, "arithmetic broke: ", 42);
    FAIL();
  } catch (const InternalError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("internal error at tests/core/tensor_test.cc:", 0), 0u) << m;
    EXPECT_NE(m.find("arithmetic broke: 42"), std::string::npos) << m;
    EXPECT_NE(m.find("bug in tessera"), std::string::npos) << m;
  }
  EXPECT_THROW(TESSERA_CHECK_AS(ConfigError, false, "x"), ConfigError);
}
}  // namespace
}  // namespace tessera
