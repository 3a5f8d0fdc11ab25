// Hugging Face's sharded safetensors layout: save_safetensors_sharded writes it and
// SafetensorsFile::open_model reads it (a folder, an index or one file).
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "tessera/io/half.h"
#include "tessera/io/safetensors.h"
#include "tessera/io/tensor_set.h"
#include "test_util.h"

namespace tessera::io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::expect_error;
using testing::slurp;
using testing::spit;

// A tensor whose bytes are a pseudo-random pattern (for BF16: any bit pattern, NaNs included).
Tensor pattern(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* b = static_cast<unsigned char*>(t.raw());
  uint32_t x = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < t.nbytes(); ++i) {
    x = x * 1664525u + 1013904223u;
    b[i] = static_cast<unsigned char>(x >> 24);
  }
  if (dtype == DType::F32) {  // keep F32 values finite so that they compare as floats too
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = static_cast<float>(seed) + 0.25f * i;
  }
  return t;
}

bool same_bytes(std::span<const std::byte> a, const Tensor& t) {
  return a.size() == t.nbytes() && (a.empty() || std::memcmp(a.data(), t.raw(), a.size()) == 0);
}

// What read_f32 must return for a stored tensor, computed independently.
std::vector<float> as_f32(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = t.dtype() == DType::F32 ? t.f32()[i] : from_bf16(bf16{t.data<uint16_t>()[i]});
  }
  return out;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

json read_json(const fs::path& p) {
  return json::parse(slurp(p));
}

std::set<std::string> files_in(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

const std::string kIndex(kSafetensorsIndexFile);
const std::string kSingle(kSafetensorsModelFile);

class ShardedTest : public testing::TempDirTest {
 protected:
  // Opening `path` with open_model must fail with an IoError containing every part.
  void expect_open_error(const fs::path& path, std::initializer_list<std::string> parts) {
    expect_error<IoError>([&] { SafetensorsFile::open_model(path); }, parts);
  }
  // A hand-written index in dir_ (its text as given).
  fs::path write_index(const std::string& text) {
    spit(dir_ / kIndex, text);
    return dir_ / kIndex;
  }
};

TEST_F(ShardedTest, ShardNames) {
  EXPECT_EQ(safetensors_shard_name(1, 3), "model-00001-of-00003.safetensors");
  EXPECT_EQ(safetensors_shard_name(12, 345), "model-00012-of-00345.safetensors");
  EXPECT_EQ(safetensors_shard_name(7, 123456), "model-00007-of-123456.safetensors");
}

TEST_F(ShardedTest, RoundTripF32AndBf16ThroughThreeShards) {
  // Caller order is shard order; with 100 bytes per shard: {embed 64, q 32}, {up 96},
  // {norm 16, empty 0, lm_head 64, scalar 4}.
  const NamedTensors tensors = {
      {"model.embed_tokens.weight", pattern({8, 4}, DType::BF16, 1)},
      {"model.layers.0.self_attn.q_proj.weight", pattern({4, 4}, DType::BF16, 2)},
      {"model.layers.0.mlp.up_proj.weight", pattern({4, 6}, DType::F32, 3)},
      {"model.norm.weight", pattern({4}, DType::F32, 4)},
      {"empty", pattern({0, 4}, DType::BF16, 5)},
      {"lm_head.weight", pattern({8, 4}, DType::BF16, 6)},
      {"scalar", pattern({}, DType::F32, 7)}};
  const std::vector<std::string> shard_of = {
      "model-00001-of-00003.safetensors", "model-00001-of-00003.safetensors",
      "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
      "model-00003-of-00003.safetensors", "model-00003-of-00003.safetensors",
      "model-00003-of-00003.safetensors"};
  const auto saved = save_safetensors_sharded(dir_, tensors, 100, {{"format", "pt"}});

  ASSERT_EQ(saved.size(), 4u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(saved[k].path, dir_ / safetensors_shard_name(k + 1, 3));
    EXPECT_EQ(saved[k].digest.bytes, fs::file_size(saved[k].path));
    EXPECT_EQ(saved[k].digest.crc32, digest_file(saved[k].path).crc32);
  }
  EXPECT_EQ(saved[3].path, dir_ / kIndex);
  EXPECT_EQ(saved[3].digest.crc32, digest_file(dir_ / kIndex).crc32);
  EXPECT_EQ(files_in(dir_), (std::set<std::string>{kIndex, "model-00001-of-00003.safetensors",
                                                   "model-00002-of-00003.safetensors",
                                                   "model-00003-of-00003.safetensors"}));

  // The index as Hugging Face writes it: total_size, the metadata, a sorted weight_map.
  const json index = read_json(dir_ / kIndex);
  EXPECT_EQ(index["metadata"]["total_size"], 64 + 32 + 96 + 16 + 0 + 64 + 4);
  EXPECT_EQ(index["metadata"]["format"], "pt");
  ASSERT_EQ(index["weight_map"].size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(index["weight_map"][tensors[i].first], shard_of[i]) << tensors[i].first;
  }
  EXPECT_EQ(slurp(dir_ / kIndex).back(), '\n');

  // Every shard is a plain safetensors file with the metadata, at most 100 bytes of tensors.
  for (int k = 1; k <= 3; ++k) {
    const SafetensorsFile shard(dir_ / safetensors_shard_name(k, 3));
    EXPECT_EQ(shard.metadata().at("format"), "pt");
    uint64_t bytes = 0;
    for (const std::string& name : shard.names()) bytes += shard.bytes(name).size();
    EXPECT_LE(bytes, 100u);
  }

  for (const fs::path& open : {dir_, dir_ / kIndex}) {
    SCOPED_TRACE(open.string());
    const SafetensorsFile f = SafetensorsFile::open_model(open);
    EXPECT_TRUE(f.sharded());
    EXPECT_EQ(f.path(), dir_ / kIndex);
    EXPECT_EQ(f.size(), tensors.size());
    EXPECT_EQ(f.shard_paths(), (std::vector<fs::path>{dir_ / "model-00001-of-00003.safetensors",
                                                      dir_ / "model-00002-of-00003.safetensors",
                                                      dir_ / "model-00003-of-00003.safetensors"}));
    EXPECT_EQ(f.metadata().at("format"), "pt");
    EXPECT_EQ(f.metadata().at("total_size"), "276");
    std::vector<std::string> names;
    for (const auto& [name, t] : tensors) names.push_back(name);
    std::sort(names.begin(), names.end());
    EXPECT_EQ(f.names(), names);
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& [name, t] = tensors[i];
      SCOPED_TRACE(name);
      EXPECT_TRUE(f.contains(name));
      EXPECT_EQ(f.file_of(name), dir_ / shard_of[i]);
      EXPECT_EQ(f.dtype(name), t.dtype());
      EXPECT_EQ(f.shape(name), t.shape());
      EXPECT_TRUE(same_bytes(f.bytes(name), t));
      const Tensor raw = f.read_raw(name);
      EXPECT_EQ(raw.dtype(), t.dtype());
      EXPECT_EQ(raw.shape(), t.shape());
      EXPECT_TRUE(same_bytes({static_cast<const std::byte*>(raw.raw()), raw.nbytes()}, t));
      EXPECT_TRUE(bitwise_equal(f.read_f32(name).to_vector(), as_f32(t)));
    }
    EXPECT_FALSE(f.contains("model.layers.1.mlp.up_proj.weight"));
  }
}

TEST_F(ShardedTest, EverythingInOneShardWritesModelSafetensorsAndNoIndex) {
  const NamedTensors tensors = {{"b", pattern({4}, DType::F32, 1)},
                                {"a", pattern({2, 2}, DType::BF16, 2)}};
  const auto saved = save_safetensors_sharded(dir_, tensors, 24, {{"format", "pt"}});  // 16 + 8
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(saved[0].path, dir_ / kSingle);
  EXPECT_EQ(files_in(dir_), std::set<std::string>{kSingle});
  for (const fs::path& open : {dir_, dir_ / kSingle}) {
    const SafetensorsFile f = SafetensorsFile::open_model(open);
    EXPECT_FALSE(f.sharded());
    EXPECT_EQ(f.path(), dir_ / kSingle);
    EXPECT_EQ(f.shard_paths(), std::vector<fs::path>{dir_ / kSingle});
    EXPECT_EQ(f.file_of("a"), dir_ / kSingle);
    EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
    EXPECT_TRUE(same_bytes(f.bytes("a"), tensors[1].second));
    EXPECT_TRUE(same_bytes(f.bytes("b"), tensors[0].second));
  }
  // One byte more than the limit takes two shards.
  save_safetensors_sharded(dir_, tensors, 23);
  EXPECT_EQ(files_in(dir_), (std::set<std::string>{kIndex, "model-00001-of-00002.safetensors",
                                                   "model-00002-of-00002.safetensors"}));
  // No tensors at all: one empty model.safetensors.
  save_safetensors_sharded(dir_, {}, 1);
  EXPECT_EQ(files_in(dir_), std::set<std::string>{kSingle});
  EXPECT_EQ(SafetensorsFile::open_model(dir_).size(), 0u);
}

TEST_F(ShardedTest, ShardSizeBoundaries) {
  // 64 bytes per shard. a + b fill one exactly; c alone is exactly the limit; d (160 bytes) is
  // larger and gets a shard of its own, between a partly filled one and the next.
  const NamedTensors tensors = {
      {"a", pattern({8}, DType::F32, 1)},      // 32
      {"b", pattern({16}, DType::BF16, 2)},    // 32: a + b = 64, exactly the limit
      {"c", pattern({16}, DType::F32, 3)},     // 64 alone
      {"d", pattern({4}, DType::F32, 4)},      // 16
      {"big", pattern({80}, DType::BF16, 5)},  // 160 > 64: alone
      {"e", pattern({2, 2}, DType::F32, 6)},   // 16
      {"f", pattern({48}, DType::F32, 7)},     // 192 > 64: alone, right after e's shard
      {"g", pattern({1}, DType::BF16, 8)}};    // 2
  save_safetensors_sharded(dir_, tensors, 64);
  const json wm = read_json(dir_ / kIndex)["weight_map"];
  const std::map<std::string, int> expected = {{"a", 1},   {"b", 1}, {"c", 2}, {"d", 3},
                                               {"big", 4}, {"e", 5}, {"f", 6}, {"g", 7}};
  for (const auto& [name, k] : expected) {
    EXPECT_EQ(wm[name], safetensors_shard_name(k, 7)) << name;
  }
  const SafetensorsFile f = SafetensorsFile::open_model(dir_);
  EXPECT_EQ(f.shard_paths().size(), 7u);
  for (const auto& [name, t] : tensors) EXPECT_TRUE(same_bytes(f.bytes(name), t)) << name;

  // A single tensor larger than the limit, alone: one model.safetensors, as it fits nowhere else.
  fs::remove_all(dir_);
  save_safetensors_sharded(dir_, {{"big", pattern({80}, DType::BF16, 5)}}, 64);
  EXPECT_EQ(files_in(dir_), std::set<std::string>{kSingle});
}

TEST_F(ShardedTest, SlicesAcrossShards) {
  const Tensor w1 = pattern({6, 4}, DType::F32, 1);
  const Tensor w2 = pattern({5, 4}, DType::BF16, 2);
  save_safetensors_sharded(
      dir_, {{"h.0.w", w1}, {"h.1.w", w2}, {"ids", pattern({3}, DType::I32, 9)}}, 96);
  const SafetensorsFile f = SafetensorsFile::open_model(dir_);
  ASSERT_NE(f.file_of("h.0.w"), f.file_of("h.1.w"));
  const std::vector<float> all1 = as_f32(w1), all2 = as_f32(w2);

  std::vector<float> part(7);
  f.read_slice_f32("h.0.w", 13, 7, part.data());
  EXPECT_TRUE(bitwise_equal(part, {all1.begin() + 13, all1.begin() + 20}));
  f.read_slice_f32("h.1.w", 3, 7, part.data());
  EXPECT_TRUE(bitwise_equal(part, {all2.begin() + 3, all2.begin() + 10}));

  // load_slices (what a ZeRO or tensor-parallel rank runs) reaches into both shards.
  std::vector<float> a(5), b(9);
  load_slices(f, {{"h.0.w", {6, 4}, 19, 5, a.data()}, {"h.1.w", {5, 4}, 0, 9, b.data()}});
  EXPECT_TRUE(bitwise_equal(a, {all1.begin() + 19, all1.end()}));
  EXPECT_TRUE(bitwise_equal(b, {all2.begin(), all2.begin() + 9}));

  // Errors about a tensor name the shard that holds it.
  expect_error<ShapeError>(
      [&] { f.read_slice_f32("h.1.w", 15, 6, part.data()); },
      {"elements [15, 21) are out of range for tensor 'h.1.w'", f.file_of("h.1.w").string()});
  expect_error<IoError>([&] { f.read_f32("ids"); },
                        {"cannot read tensor 'ids' of ", f.file_of("ids").string(), "as F32"});
  expect_error<IoError>([&] { f.info("absent"); },
                        {"the sharded safetensors model ", (dir_ / kIndex).string(),
                         " has no tensor named 'absent'"});
}

TEST_F(ShardedTest, CopiesShareTheMappingsAndThreadsReadConcurrently) {
  NamedTensors tensors;
  for (int i = 0; i < 8; ++i) {
    tensors.emplace_back("t" + std::to_string(i), pattern({64}, DType::BF16, i + 1));
  }
  save_safetensors_sharded(dir_, tensors, 300);  // two tensors (256 bytes) per shard
  SafetensorsFile copy;
  {
    const SafetensorsFile f = SafetensorsFile::open_model(dir_);
    EXPECT_EQ(f.shard_paths().size(), 4u);
    copy = f;
  }  // the original is gone; the copy keeps the mappings alive
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      std::vector<float> out(16);
      for (int rep = 0; rep < 50; ++rep) {
        for (const auto& [name, t] : tensors) {
          const int64_t off = (rep * 7 + th * 13) % 48;
          copy.read_slice_f32(name, off, 16, out.data());
          const std::vector<float> all = as_f32(t);
          if (!bitwise_equal(out, {all.begin() + off, all.begin() + off + 16})) ++bad[th];
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad, std::vector<int>(4, 0));
}

TEST_F(ShardedTest, StaleFilesOfPreviousSavesAreRemoved) {
  const auto tensors = [](int n, uint32_t seed) {
    NamedTensors out;
    for (int i = 0; i < n; ++i) {
      out.emplace_back("w" + std::to_string(i), pattern({16}, DType::F32, seed + i));
    }
    return out;
  };
  // Files that are not shards of a save stay.
  const std::set<std::string> others = {"config.json", "model-extra.safetensors",
                                        "model-1-of-2.safetensors", "model-00001-of-00002.bin"};
  for (const std::string& o : others) spit(dir_ / o, "x");
  const auto with_others = [&](std::set<std::string> s) {
    s.insert(others.begin(), others.end());
    return s;
  };

  save_safetensors_sharded(dir_, tensors(3, 10), 64);  // 3 shards
  EXPECT_EQ(files_in(dir_),
            with_others({kIndex, "model-00001-of-00003.safetensors",
                         "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"}));

  const NamedTensors two = tensors(2, 20);
  save_safetensors_sharded(dir_, two, 64);  // 2 shards: the -of-00003 files go
  EXPECT_EQ(files_in(dir_), with_others({kIndex, "model-00001-of-00002.safetensors",
                                         "model-00002-of-00002.safetensors"}));
  SafetensorsFile f = SafetensorsFile::open_model(dir_);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"w0", "w1"}));
  EXPECT_TRUE(same_bytes(f.bytes("w1"), two[1].second));

  const NamedTensors again = tensors(2, 30);  // as many shards: the same names, replaced
  save_safetensors_sharded(dir_, again, 64);
  f = SafetensorsFile::open_model(dir_);
  EXPECT_TRUE(same_bytes(f.bytes("w0"), again[0].second));
  EXPECT_TRUE(same_bytes(f.bytes("w1"), again[1].second));

  const NamedTensors one = tensors(2, 40);
  save_safetensors_sharded(dir_, one, 1 << 20);  // one file: the index and the shards go
  EXPECT_EQ(files_in(dir_), with_others({kSingle}));
  EXPECT_FALSE(SafetensorsFile::open_model(dir_).sharded());

  save_safetensors_sharded(dir_, tensors(3, 50), 64);  // shards again: model.safetensors goes
  EXPECT_EQ(files_in(dir_),
            with_others({kIndex, "model-00001-of-00003.safetensors",
                         "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"}));
  EXPECT_TRUE(SafetensorsFile::open_model(dir_).sharded());
}

TEST_F(ShardedTest, TheIndexIsTheAuthority) {
  // Shard 1 holds 'a' and an extra tensor the index does not name; shard 2 holds 'b' and a stale
  // copy of 'a' with other values; a stale shard of a 3-shard save lies beside them.
  const Tensor a = pattern({4}, DType::F32, 1), b = pattern({4}, DType::BF16, 2);
  save_safetensors(dir_ / "model-00001-of-00002.safetensors",
                   {{"a", a}, {"extra", pattern({2}, DType::F32, 3)}});
  save_safetensors(dir_ / "model-00002-of-00002.safetensors",
                   {{"b", b}, {"a", pattern({4}, DType::F32, 4)}});
  save_safetensors(dir_ / "model-00003-of-00003.safetensors", {{"a", pattern({9}, DType::F32, 5)}});
  // A total_size that matches nothing is not checked either.
  write_index(R"({"metadata": {"total_size": 1}, "weight_map": {
      "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})");
  const SafetensorsFile f = SafetensorsFile::open_model(dir_);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(f.contains("extra"));
  EXPECT_EQ(f.file_of("a"), dir_ / "model-00001-of-00002.safetensors");
  EXPECT_TRUE(same_bytes(f.bytes("a"), a));
  EXPECT_TRUE(same_bytes(f.bytes("b"), b));
  EXPECT_EQ(f.metadata().at("total_size"), "1");
  EXPECT_EQ(f.shard_paths().size(), 2u);
}

TEST_F(ShardedTest, ModelSafetensorsWinsOverAnIndexAsInTransformers) {
  const Tensor one = pattern({3}, DType::F32, 1), two = pattern({3}, DType::F32, 2);
  save_safetensors_sharded(dir_, {{"x", two}, {"y", two}}, 12);  // sharded
  save_safetensors(dir_ / kSingle, {{"x", one}});                // and a single file beside it
  const SafetensorsFile f = SafetensorsFile::open_model(dir_);
  EXPECT_FALSE(f.sharded());
  EXPECT_EQ(f.path(), dir_ / kSingle);
  EXPECT_TRUE(same_bytes(f.bytes("x"), one));
  // Naming the index opens the index.
  const SafetensorsFile g = SafetensorsFile::open_model(dir_ / kIndex);
  EXPECT_TRUE(g.sharded());
  EXPECT_TRUE(same_bytes(g.bytes("x"), two));
}

TEST_F(ShardedTest, OpenModelPathErrors) {
  expect_open_error(dir_ / "absent", {"cannot open model weights ", (dir_ / "absent").string(),
                                      ": it does not exist"});
  expect_open_error(dir_, {"the directory ", dir_.string(), " holds no model weights",
                           "neither model.safetensors nor model.safetensors.index.json"});
  spit(dir_ / "weights.bin", "not a safetensors file");  // any other file is a safetensors file
  expect_open_error(dir_ / "weights.bin", {(dir_ / "weights.bin").string(), "safetensors"});
}

TEST_F(ShardedTest, MissingShard) {
  save_safetensors_sharded(dir_,
                           {{"a", pattern({4}, DType::F32, 1)},
                            {"b", pattern({4}, DType::F32, 2)},
                            {"c", pattern({4}, DType::F32, 3)}},
                           32);
  fs::remove(dir_ / "model-00002-of-00002.safetensors");
  expect_open_error(
      dir_, {(dir_ / kIndex).string(),
             " names model-00002-of-00002.safetensors, which does not exist", "tensor 'c'"});
}

TEST_F(ShardedTest, TensorMissingFromItsShard) {
  save_safetensors(dir_ / "model-00001-of-00002.safetensors", {{"a", pattern({4}, DType::F32, 1)}});
  save_safetensors(dir_ / "model-00002-of-00002.safetensors",
                   {{"b", pattern({4}, DType::F32, 2)}, {"c", pattern({4}, DType::F32, 3)}});
  write_index(R"({"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
      "b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}})");
  expect_open_error(dir_, {(dir_ / kIndex).string(),
                           " maps tensor 'b' to model-00001-of-00002.safetensors, which has no "
                           "tensor of that name (model-00002-of-00002.safetensors has it)"});
  write_index(R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
      "zz": "model-00002-of-00002.safetensors"}})");
  expect_open_error(dir_, {" maps tensor 'zz' to model-00002-of-00002.safetensors, which has no "
                           "tensor of that name"});
}

TEST_F(ShardedTest, TensorNamedTwiceInTheIndex) {
  save_safetensors(dir_ / "s1.safetensors", {{"a", pattern({4}, DType::F32, 1)}});
  save_safetensors(dir_ / "s2.safetensors", {{"a", pattern({4}, DType::F32, 2)}});
  write_index(R"({"weight_map": {"a": "s1.safetensors", "a": "s2.safetensors"}})");
  expect_open_error(dir_, {"invalid safetensors index ", (dir_ / kIndex).string(),
                           "\"weight_map\" names tensor 'a' more than once"});
  // The same key elsewhere in the document is no concern of the weight map.
  write_index(R"({"metadata": {"a": 1, "x": {"a": 2}}, "weight_map": {"a": "s1.safetensors"}})");
  EXPECT_EQ(SafetensorsFile::open_model(dir_).names(), std::vector<std::string>{"a"});
}

TEST_F(ShardedTest, MalformedIndex) {
  save_safetensors(dir_ / "s.safetensors", {{"a", pattern({4}, DType::F32, 1)}});
  const std::string where = "invalid safetensors index " + (dir_ / kIndex).string() + ": ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"weight_map": {"a": "s.safetensors")", "it is not valid JSON"},
      {"", "it is not valid JSON"},
      {R"(["s.safetensors"])", "it must be a JSON object, but it is a JSON array"},
      {R"({"metadata": {"total_size": 16}})", "it has no \"weight_map\""},
      {R"({"weight_map": ["s.safetensors"]})",
       "\"weight_map\" must be an object mapping tensor names to shard file names, but it is a "
       "JSON array"},
      {R"({"weight_map": {"a": 3}})",
       "\"weight_map\" maps tensor 'a' to 3; shard file names must be strings"},
      {R"({"weight_map": {"a": null}})",
       "\"weight_map\" maps tensor 'a' to null; shard file names"},
      {R"({"weight_map": {"a": "s.safetensors"}, "metadata": [1]})",
       "\"metadata\" must be an object, but it is a JSON array"}};
  for (const auto& [text, what] : cases) {
    SCOPED_TRACE(text);
    expect_open_error(write_index(text), {where + what});
  }
  // Shard names must be plain file names in the index's folder.
  fs::create_directories(dir_ / "sub");
  save_safetensors(dir_ / "sub" / "s.safetensors", {{"a", pattern({4}, DType::F32, 1)}});
  for (const std::string shard : {"../s.safetensors", "sub/s.safetensors", "/etc/passwd", "..", ".",
                                  "", "sub\\\\s.safetensors", "s.safetensors\\u0000x"}) {
    SCOPED_TRACE(shard);
    expect_open_error(write_index(R"({"weight_map": {"a": ")" + shard + R"("}})"),
                      {where, "\"weight_map\" maps tensor 'a' to \"",
                       "which is not a file name in the index's folder"});
  }
  // An empty weight map is a model without tensors.
  EXPECT_EQ(SafetensorsFile::open_model(write_index(R"({"weight_map": {}})")).size(), 0u);
}

TEST_F(ShardedTest, BrokenShardIsNamed) {
  save_safetensors_sharded(
      dir_, {{"a", pattern({4}, DType::F32, 1)}, {"b", pattern({4}, DType::F32, 2)}}, 16);
  const fs::path shard = dir_ / "model-00002-of-00002.safetensors";
  const std::string bytes = slurp(shard);
  spit(shard, bytes.substr(0, bytes.size() - 1));
  expect_open_error(dir_,
                    {"invalid safetensors file ", shard.string(), "the file may be truncated"});
  fs::remove(shard);
  fs::create_directories(shard);
  expect_open_error(dir_, {shard.string(), "not a regular file"});
}

TEST_F(ShardedTest, WriterRefusesBadInputBeforeWritingAnything) {
  const Tensor t = pattern({4}, DType::F32, 1);
  const fs::path out = dir_ / "out";
  expect_error<IoError>(
      [&] {
        save_safetensors_sharded(out, {{"a", t}}, 0);
      },
      {"cannot write the model to ", out.string(), "the largest shard size must be positive"});
  expect_error<IoError>(
      [&] {
        save_safetensors_sharded(out, {{"a", t}}, 16, {{"total_size", "3"}});
      },
      {"the metadata key \"total_size\" is reserved for the index"});
  // Duplicates that would land in different shards are still found.
  expect_error<IoError>(
      [&] {
        save_safetensors_sharded(out, {{"a", t}, {"b", t}, {"a", t}}, 16);
      },
      {out.string(), "the tensor name 'a' appears more than once"});
  expect_error<IoError>(
      [&] {
        save_safetensors_sharded(out, {{"a", t}, {"", t}}, 16);
      },
      {"\"\" is not a valid tensor name"});
  expect_error<IoError>(
      [&] {
        save_safetensors_sharded(out, {{"a", t}, {"__metadata__", t}}, 16);
      },
      {"\"__metadata__\" is not a valid tensor name"});
  expect_error<IoError>(
      [&] {
        save_safetensors_sharded(out, {{"a", t}, {"u", Tensor()}}, 16);
      },
      {"tensor 'u' is undefined"});
  EXPECT_FALSE(fs::exists(out));
  // A folder that cannot be created.
  spit(dir_ / "file", "x");
  expect_error<IoError>(
      [&] {
        save_safetensors_sharded(dir_ / "file" / "sub", {{"a", t}}, 16);
      },
      {"cannot create the directory ", (dir_ / "file" / "sub").string()});
}

// Written by transformers' save_pretrained (scripts/fixtures/): a bf16 Llama in several shards.
TEST(HuggingFaceSharded, LlamaBf16FixtureOpensWithEveryTensorReadable) {
  const fs::path dir =
      fs::path(TESSERA_SOURCE_DIR) / "tests" / "fixtures" / "hf" / "llama_sharded_bf16";
  if (!fs::exists(dir / kIndex)) GTEST_SKIP() << dir << " has no " << kIndex << " (yet)";
  const json index = read_json(dir / kIndex);
  const SafetensorsFile f = SafetensorsFile::open_model(dir);
  ASSERT_TRUE(f.sharded());
  std::set<std::string> shards;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    SCOPED_TRACE(name);
    shards.insert(shard.get<std::string>());
    ASSERT_TRUE(f.contains(name));
    EXPECT_EQ(f.file_of(name).filename().string(), shard.get<std::string>());
    EXPECT_EQ(f.dtype(name), DType::BF16);
    const Tensor t = f.read_f32(name);
    EXPECT_EQ(t.shape(), f.shape(name));
    EXPECT_EQ(t.nbytes(), f.bytes(name).size() * 2);
  }
  EXPECT_EQ(f.size(), index["weight_map"].size());
  EXPECT_GT(shards.size(), 1u);
  EXPECT_EQ(f.shard_paths().size(), shards.size());
  // The shard names say how many there are, and the folder holds exactly those.
  const std::string tail =
      safetensors_shard_name(1, static_cast<int64_t>(shards.size())).substr(11);
  size_t in_folder = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with("model-") && n.ends_with(".safetensors")) {
      ++in_folder;
      EXPECT_TRUE(shards.count(n)) << n;
      EXPECT_TRUE(n.ends_with(tail)) << n;
    }
  }
  EXPECT_EQ(in_folder, shards.size());
}

}  // namespace
}  // namespace tessera::io
