#include "tessera/io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "tessera/io/half.h"
#include "test_util.h"

namespace tessera::io {
namespace {

using testing::expect_error;
using testing::slurp;
using testing::spit;

class SafetensorsTest : public testing::TempDirTest {};

Tensor bf16_tensor(const std::vector<float>& v, const Shape& s) {
  Tensor t = Tensor::empty(s, DType::BF16);
  for (size_t i = 0; i < v.size(); ++i) t.data<uint16_t>()[i] = to_bf16(v[i]).bits;
  return t;
}

Tensor f16_tensor(const std::vector<float>& v, const Shape& s) {
  Tensor t = Tensor::empty(s, DType::F16);
  for (size_t i = 0; i < v.size(); ++i) t.data<uint16_t>()[i] = f32_to_f16(v[i]);
  return t;
}

uint64_t header_len(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  return n;
}

TEST_F(SafetensorsTest, RoundTripF32Bf16F16AndMetadata) {
  const std::vector<float> a = {1.5f, -2.25f, 3.0f, 0.0f, 1e-3f, 7.0f};
  const std::vector<float> b = {0.5f, -1.0f, 2.0f, 256.0f};  // exact in bf16 and f16
  const auto path = dir_ / "t.safetensors";
  const NamedTensors tensors = {{"zeta", Tensor::from(a, {2, 3})},
                                {"alpha", bf16_tensor(b, {4})},
                                {"mid", f16_tensor(b, {2, 2})},
                                {"scalar", Tensor::from({42.0f}, {})}};
  const FileDigest d = save_safetensors(path, tensors, {{"format", "pt"}, {"step", "7"}});
  EXPECT_EQ(d.bytes, std::filesystem::file_size(path));
  EXPECT_EQ(d.crc32, digest_file(path).crc32);

  SafetensorsFile f(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"alpha", "mid", "scalar", "zeta"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("step"), "7");
  EXPECT_EQ(f.dtype("alpha"), DType::BF16);
  EXPECT_EQ(f.dtype("mid"), DType::F16);
  EXPECT_EQ(f.shape("zeta"), (Shape{2, 3}));
  EXPECT_EQ(f.shape("scalar"), Shape{});
  EXPECT_EQ(f.read_f32("zeta").to_vector(), a);
  EXPECT_EQ(f.read_f32("alpha").to_vector(), b);
  EXPECT_EQ(f.read_f32("mid").to_vector(), b);
  EXPECT_EQ(f.read_f32("scalar").to_vector(), std::vector<float>{42.0f});
  std::vector<float> buf(4);
  f.read_f32("mid", buf.data(), 4);
  EXPECT_EQ(buf, b);
  EXPECT_THROW(f.read_f32("mid", buf.data(), 3), ShapeError);
  expect_error<IoError>([&] { f.info("nope"); }, {path.string(), "'nope'"});

  // Data starts 8-byte aligned, and the header lists tensors in name order.
  const std::string bytes = slurp(path);
  EXPECT_EQ((8 + header_len(bytes)) % 8, 0u);
  auto header = nlohmann::json::parse(bytes.substr(8, header_len(bytes)));
  EXPECT_EQ(header["alpha"]["data_offsets"], (nlohmann::json{0, 8}));
  EXPECT_EQ(header["mid"]["data_offsets"], (nlohmann::json{8, 16}));
}

TEST_F(SafetensorsTest, EmptyTensorsAndEmptyFile) {
  const auto path = dir_ / "e.safetensors";
  save_safetensors(path, {{"a", Tensor::empty({0, 4})},
                          {"b", Tensor::from({1, 2}, {2})},
                          {"c", Tensor::empty({3, 0}, DType::BF16)}});
  SafetensorsFile f(path);
  EXPECT_EQ(f.size(), 3u);
  EXPECT_EQ(f.read_f32("a").numel(), 0);
  EXPECT_EQ(f.read_f32("c").shape(), (Shape{3, 0}));
  EXPECT_EQ(f.read_f32("b").to_vector(), (std::vector<float>{1, 2}));

  const auto none = dir_ / "none.safetensors";
  save_safetensors(none, {});
  SafetensorsFile g(none);
  EXPECT_EQ(g.size(), 0u);
  EXPECT_TRUE(g.metadata().empty());
}

TEST_F(SafetensorsTest, ReadSliceAndRaw) {
  std::vector<float> v(100);
  for (int i = 0; i < 100; ++i) v[i] = static_cast<float>(i);
  const auto path = dir_ / "s.safetensors";
  save_safetensors(path, {{"w", Tensor::from(v, {10, 10})}, {"h", bf16_tensor(v, {100})}});
  SafetensorsFile f(path);
  std::vector<float> out(7);
  f.read_slice_f32("w", 33, 7, out.data());
  EXPECT_EQ(out, std::vector<float>(v.begin() + 33, v.begin() + 40));
  f.read_slice_f32("h", 93, 7, out.data());
  EXPECT_EQ(out, std::vector<float>(v.begin() + 93, v.end()));
  f.read_slice_f32("h", 100, 0, out.data());
  EXPECT_THROW(f.read_slice_f32("w", 94, 7, out.data()), ShapeError);
  EXPECT_THROW(f.read_slice_f32("w", -1, 1, out.data()), ShapeError);

  Tensor raw = f.read_raw("h");
  EXPECT_EQ(raw.dtype(), DType::BF16);
  EXPECT_EQ(std::memcmp(raw.raw(), f.bytes("h").data(), 200), 0);
}

TEST_F(SafetensorsTest, IntegerTensorsKeepTheirDtypeButDoNotReadAsF32) {
  Tensor t = Tensor::empty({3}, DType::I32);
  for (int i = 0; i < 3; ++i) t.data<int32_t>()[i] = -i;
  const auto path = dir_ / "i.safetensors";
  save_safetensors(path, {{"ids", t}});
  SafetensorsFile f(path);
  EXPECT_EQ(f.read_raw("ids").data<int32_t>()[2], -2);
  expect_error<IoError>([&] { f.read_f32("ids"); }, {path.string(), "I32"});
}

TEST_F(SafetensorsTest, HandBuiltFileMatchingTheSpec) {
  // Two F32 tensors and metadata, header padded with spaces, written byte by byte.
  std::string header = R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("a":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]},)"
                       R"("__metadata__":{"who":"hand"}})";
  header += "   ";
  std::string bytes;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  bytes += header;
  const float b[2] = {1.0f, -3.5f};
  bytes.append(reinterpret_cast<const char*>(b), 8);
  bytes += std::string("\x80\x3f\x00\xc0", 4);  // bf16 1.0 (0x3f80), -2.0 (0xc000)
  const auto path = dir_ / "hand.safetensors";
  spit(path, bytes);

  SafetensorsFile f(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(f.metadata().at("who"), "hand");
  EXPECT_EQ(f.read_f32("b").to_vector(), (std::vector<float>{1.0f, -3.5f}));
  EXPECT_EQ(f.read_f32("a").to_vector(), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(f.info("a").begin, 8u);

  // Our writer produces exactly this layout for the same tensors (sorted, compact JSON).
  const auto ours = dir_ / "ours.safetensors";
  save_safetensors(ours, {{"x", Tensor::from({1.0f, -3.5f}, {2})}});
  const std::string expected_header = R"({"x":{"data_offsets":[0,8],"dtype":"F32","shape":[2]}})";
  std::string expected;
  const uint64_t m = expected_header.size() + (8 - expected_header.size() % 8) % 8;
  for (int i = 0; i < 8; ++i) expected.push_back(static_cast<char>((m >> (8 * i)) & 0xff));
  expected += expected_header + std::string(m - expected_header.size(), ' ');
  expected.append(reinterpret_cast<const char*>(b), 8);
  EXPECT_EQ(slurp(ours), expected);
}

TEST_F(SafetensorsTest, WriterRejectsBadNames) {
  const auto path = dir_ / "bad.safetensors";
  Tensor t = Tensor::from({1}, {1});
  EXPECT_THROW(save_safetensors(path, {{"a", t}, {"a", t}}), IoError);
  EXPECT_THROW(save_safetensors(path, {{"__metadata__", t}}), IoError);
  EXPECT_THROW(save_safetensors(path, {{"", t}}), IoError);
  EXPECT_THROW(save_safetensors(path, {{"u", Tensor()}}), IoError);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST_F(SafetensorsTest, ReadAll) {
  const auto path = dir_ / "all.safetensors";
  save_safetensors(path, {{"b", bf16_tensor({2}, {1})}, {"a", Tensor::from({1}, {1})}});
  NamedTensors all = read_all_f32(SafetensorsFile(path));
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].first, "a");
  EXPECT_EQ(all[1].second.to_vector(), std::vector<float>{2});
  EXPECT_EQ(all[1].second.dtype(), DType::F32);
}

}  // namespace
}  // namespace tessera::io
