// Every malformed safetensors file must give an IoError that names the file.
#include <gtest/gtest.h>

#include "tessera/io/safetensors.h"
#include "test_util.h"

namespace tessera::io {
namespace {

using testing::expect_error;
using testing::slurp;
using testing::spit;

class MalformedTest : public testing::TempDirTest {
 protected:
  // Writes an 8-byte length, `header` and `data_bytes` zero bytes; returns the path.
  std::filesystem::path make(const std::string& header, size_t data_bytes,
                             const std::string& name = "m.safetensors") {
    std::string bytes;
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    bytes += header + std::string(data_bytes, '\0');
    const auto path = dir_ / name;
    spit(path, bytes);
    return path;
  }
  // Opening `path` must fail with an IoError naming it and containing `what`.
  void expect_invalid(const std::filesystem::path& path, const std::string& what) {
    SCOPED_TRACE(what);
    expect_error<IoError>([&] { SafetensorsFile f(path); }, {path.string(), what});
  }
};

TEST_F(MalformedTest, TruncatedAtEveryInterestingPoint) {
  const auto good = dir_ / "good.safetensors";
  save_safetensors(good, {{"a", Tensor::from({1, 2, 3}, {3})}, {"b", Tensor::from({4}, {1})}});
  const std::string bytes = slurp(good);
  SafetensorsFile ok(good);  // the intact file is fine
  const size_t header_end = bytes.size() - 16;
  const std::vector<std::pair<size_t, std::string>> cuts = {
      {0, "8-byte header length"},
      {5, "8-byte header length"},
      {7, "8-byte header length"},
      {8, "header length field says"},
      {20, "header length field says"},
      {header_end - 1, "header length field says"},
      {header_end, "beyond the end of the data"},
      {header_end + 8, "beyond the end of the data"},
      {bytes.size() - 1, "beyond the end of the data"}};
  for (const auto& [len, what] : cuts) {
    const auto path = dir_ / ("cut" + std::to_string(len) + ".safetensors");
    spit(path, bytes.substr(0, len));
    expect_invalid(path, what);
  }
  // A header length near 2^64 must not wrap around.
  std::string huge = bytes;
  for (int i = 0; i < 8; ++i) huge[i] = '\xff';
  spit(dir_ / "huge.safetensors", huge);
  expect_invalid(dir_ / "huge.safetensors", "header length field says");
}

TEST_F(MalformedTest, HeaderNotJsonOrNotAnObject) {
  expect_invalid(make(R"({"a": {"dtype": "F32", )", 0), "not valid JSON");
  expect_invalid(make("", 0), "not valid JSON");
  expect_invalid(make("{\"a\xff\": {}}", 0), "not valid JSON");  // invalid UTF-8
  expect_invalid(make("[1, 2]  ", 0), "must be a JSON object");
  expect_invalid(make("42", 0), "must be a JSON object");
}

TEST_F(MalformedTest, EntriesMissingFieldsOrMistyped) {
  expect_invalid(make(R"({"a": {"shape": [1], "data_offsets": [0, 4]}})", 4),
                 "tensor 'a' has no \"dtype\" field");
  expect_invalid(make(R"({"a": {"dtype": "F32", "data_offsets": [0, 4]}})", 4),
                 "tensor 'a' has no \"shape\" field");
  expect_invalid(make(R"({"a": {"dtype": "F32", "shape": [1]}})", 4),
                 "tensor 'a' has no \"data_offsets\" field");
  expect_invalid(make(R"({"a": [1, 2]})", 0), "tensor 'a' must be described by an object");
  expect_invalid(make(R"({"a": {"dtype": 3, "shape": [1], "data_offsets": [0, 4]}})", 4),
                 "not a string");
  expect_invalid(make(R"({"a": {"dtype": "F32", "shape": 1, "data_offsets": [0, 4]}})", 4),
                 "not an array");
  expect_invalid(make(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4),
                 "expected [begin, end]");
  expect_invalid(make(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4.0]}})", 4),
                 "expected [begin, end]");
  expect_invalid(make(R"({"__metadata__": {"k": 1}})", 0), "metadata value \"k\"");
  expect_invalid(make(R"({"__metadata__": [1]})", 0), "\"__metadata__\" must be an object");
}

TEST_F(MalformedTest, UnknownDtype) {
  expect_invalid(make(R"({"a": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", 8),
                 "unsupported dtype \"F64\"");
  expect_invalid(make(R"({"a": {"dtype": "f32", "shape": [1], "data_offsets": [0, 4]}})", 4),
                 "unsupported dtype \"f32\"");
}

TEST_F(MalformedTest, BadShapes) {
  expect_invalid(make(R"({"a": {"dtype": "F32", "shape": [-1, 2], "data_offsets": [0, 8]}})", 8),
                 "dimensions must be non-negative integers");
  expect_invalid(make(R"({"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4),
                 "dimensions must be non-negative integers");
  expect_invalid(
      make(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})",
           4),
      "overflows 64 bits");
}

TEST_F(MalformedTest, BadOffsets) {
  expect_invalid(make(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 4),
                 "need 8 bytes");
  expect_invalid(make(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", 4),
                 "begin > end");
  expect_invalid(make(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4),
                 "expected [begin, end]");
  expect_invalid(make(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4),
                 "beyond the end of the data");
  // Overlap: b starts inside a.
  expect_invalid(make(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                      R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                      12),
                 "tensors 'a' and 'b' overlap");
  // Two tensors sharing the same bytes.
  expect_invalid(make(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                      R"( "b": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}})",
                      8),
                 "overlap");
  // A hole between tensors, and bytes after the last one.
  expect_invalid(make(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8),
                 "belong to no tensor");
  expect_invalid(make(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 8),
                 "cover only 4");
}

TEST_F(MalformedTest, WrongDtypeForTheBytes) {
  // Valid file, then the header edited to claim BF16 for F32 data: the size no longer matches.
  const auto path = dir_ / "d.safetensors";
  save_safetensors(path, {{"w", Tensor::from({1, 2}, {2})}});
  std::string bytes = slurp(path);
  const size_t at = bytes.find("\"F32\"");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 5, "\"F16\"");
  spit(path, bytes);
  expect_invalid(path, "need 4 bytes");
}

TEST_F(MalformedTest, CorruptHeaderBytes) {
  const auto good = dir_ / "good.safetensors";
  save_safetensors(good, {{"a", Tensor::from({1, 2, 3}, {3})}});
  std::string bytes = slurp(good);
  bytes[8] = 'x';  // the opening brace
  spit(dir_ / "c1.safetensors", bytes);
  expect_invalid(dir_ / "c1.safetensors", "not valid JSON");
}

TEST_F(MalformedTest, MissingFileOrDirectory) {
  expect_error<IoError>([&] { SafetensorsFile f(dir_ / "absent.safetensors"); },
                        {"absent.safetensors", "No such file"});
  expect_error<IoError>([&] { SafetensorsFile f(dir_); }, {dir_.string(), "not a regular file"});
}

}  // namespace
}  // namespace tessera::io
