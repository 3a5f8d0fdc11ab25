// Fuzz target: a Hugging Face shard index, model.safetensors.index.json
// (io::SafetensorsFile::open_model), beside two fixed shards: model-00001-of-00002.safetensors
// holds a (F32 [2]) and b (BF16 [3]); model-00002-of-00002.safetensors holds c (F16 [2]) and a
// stale copy of a (F32 [1]). An index that opens must give every tensor it names exactly as the
// shard it names stores it, read in every way.
#include <algorithm>
#include <vector>

#include "fuzz_util.h"
#include "tessera/core/error.h"
#include "tessera/io/safetensors.h"

using namespace tessera;

namespace {

Tensor filled(const Shape& shape, DType dtype, unsigned char seed) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* b = static_cast<unsigned char*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) b[i] = static_cast<unsigned char>(seed + 17 * i);
  return t;
}

void make_shards() {
  static const bool made = [] {
    const auto& dir = fuzz::scratch_dir();
    io::save_safetensors(dir / "model-00001-of-00002.safetensors",
                         {{"a", filled({2}, DType::F32, 1)}, {"b", filled({3}, DType::BF16, 2)}});
    io::save_safetensors(dir / "model-00002-of-00002.safetensors",
                         {{"c", filled({2}, DType::F16, 3)}, {"a", filled({1}, DType::F32, 4)}});
    return true;
  }();
  (void)made;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  make_shards();
  const auto path = fuzz::write_input(io::kSafetensorsIndexFile, data, size);
  try {
    const io::SafetensorsFile file = io::SafetensorsFile::open_model(path);
    fuzz::require(file.sharded() && file.path() == path, "an index opens as a sharded model");
    fuzz::require(file.shard_paths().size() <= file.size(), "every shard mapped holds a tensor");
    for (const std::string& name : file.names()) {
      const std::filesystem::path& shard = file.file_of(name);
      fuzz::require(shard.parent_path() == path.parent_path(), "shards lie beside the index");
      const io::SafetensorsFile alone(shard);
      fuzz::require(alone.contains(name), "a tensor is in the shard the index names");
      const auto bytes = file.bytes(name);
      const auto stored = alone.bytes(name);
      fuzz::require(std::equal(bytes.begin(), bytes.end(), stored.begin(), stored.end()),
                    "a tensor's bytes are its shard's");
      fuzz::require(file.dtype(name) == alone.dtype(name) && file.shape(name) == alone.shape(name),
                    "a tensor's dtype and shape are its shard's");
      const Tensor raw = file.read_raw(name);
      fuzz::require(
          raw.nbytes() == bytes.size() &&
              std::equal(bytes.begin(), bytes.end(), static_cast<const std::byte*>(raw.raw())),
          "read_raw copies the stored bytes");
      const Tensor f = file.read_f32(name);
      const Tensor g = alone.read_f32(name);
      fuzz::require(std::equal(f.data<float>(), f.data<float>() + f.numel(), g.data<float>(),
                               [](float x, float y) { return x == y || (x != x && y != y); }),
                    "read_f32 gives the shard's values");
    }
  } catch (const Error& e) {
    fuzz::rejected(e);  // The expected outcome for a malformed index.
  }
  return 0;
}
