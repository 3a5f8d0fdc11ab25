// Fuzz target: a safetensors file (io/safetensors.h), then everything the loaders do with one:
// every tensor read as stored and, where it converts, as F32 (whole and a slice), the GPT-2
// shape inference and the expected-tensor loader.
#include <algorithm>
#include <vector>

#include "fuzz_util.h"
#include "tessera/core/error.h"
#include "tessera/io/hf_config.h"
#include "tessera/io/safetensors.h"
#include "tessera/io/tensor_set.h"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fuzz::write_input("model.safetensors", data, size);
  try {
    const io::SafetensorsFile file(path);
    uint64_t covered = 0;
    for (const std::string& name : file.names()) {
      const io::TensorInfo& ti = file.info(name);
      const auto bytes = file.bytes(name);
      fuzz::require(bytes.size() == ti.end - ti.begin && ti.end <= size,
                    "a tensor's bytes lie inside the file");
      fuzz::require(static_cast<uint64_t>(ti.numel()) * dtype_size(ti.dtype) == bytes.size(),
                    "a tensor's byte count matches its shape and dtype");
      covered += bytes.size();
      const Tensor raw = file.read_raw(name);
      fuzz::require(
          raw.nbytes() == bytes.size() &&
              std::equal(bytes.begin(), bytes.end(), static_cast<const std::byte*>(raw.raw())),
          "read_raw copies the stored bytes");
      if (ti.dtype == DType::F32 || ti.dtype == DType::BF16 || ti.dtype == DType::F16) {
        const Tensor f = file.read_f32(name);
        fuzz::require(f.numel() == ti.numel(), "read_f32 returns every element");
        if (ti.numel() >= 2) {
          std::vector<float> part(static_cast<size_t>(ti.numel() / 2));
          const int64_t offset = ti.numel() - static_cast<int64_t>(part.size());
          file.read_slice_f32(name, offset, static_cast<int64_t>(part.size()), part.data());
          fuzz::require(std::equal(part.begin(), part.end(), f.data<float>() + offset,
                                   [](float a, float b) { return a == b || (a != a && b != b); }),
                        "a slice equals the same elements of the whole tensor");
        }
      }
    }
    uint64_t header_len = 0;
    for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(data[i]) << (8 * i);
    fuzz::require(covered == size - 8 - header_len, "the tensors tile the data section");

    const io::GptShape g = io::infer_gpt_shape(file);
    io::HfGptConfig c;
    c.n_layer = g.n_layer;
    c.n_head = 1;
    c.n_embd = g.n_embd;
    c.vocab_size = g.vocab_size;
    c.n_positions = g.n_positions;
    io::TensorLoadOptions lenient;
    lenient.error_on_unexpected = false;
    const auto loaded = io::load_expected(file, io::gpt2_expected_tensors(c), lenient);
    fuzz::require(loaded.size() == io::gpt2_expected_tensors(c).size(),
                  "load_expected returns every expected tensor");
  } catch (const Error& e) {
    fuzz::rejected(e);  // The expected outcome for a malformed file.
  }
  return 0;
}
