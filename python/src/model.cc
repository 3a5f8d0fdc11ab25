// tessera.load: a trained model in this process (train::load_model): its logits for a batch of
// token arrays, text generation (train::generate, with the key/value cache), its tokenizer, and
// its weights as read-only numpy views of the model's own memory.
#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "tessera/core/error.h"
#include "tessera/train/generate.h"
#include "tessera/train/model_io.h"

namespace tessera::python {
namespace {

struct Model {
  train::LoadedModel m;
  int max_batch = 1;

  nn::GPT& gpt() const { return *m.model; }
  const data::Tokenizer& tokenizer() const {
    TESSERA_CHECK_AS(ConfigError, m.tokenizer != nullptr,
                     "this model has no tokenizer (none beside its weights, and none given to "
                     "tessera.load): pass token ids instead of text");
    return *m.tokenizer;
  }
};

using Tokens = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu, int32_t, nb::ndim<2>>;

// [B, T, V] logits of tokens[B, T] (copied out of the model's buffer, which the next call reuses).
nb::ndarray<nb::numpy, float> forward(Model& self, Tokens tokens) {
  const int B = static_cast<int>(tokens.shape(0)), T = static_cast<int>(tokens.shape(1));
  nn::GPT& g = self.gpt();
  const int V = g.config().vocab_size;
  TESSERA_CHECK_AS(ShapeError, B >= 1 && B <= self.max_batch, "forward: a batch of ", B,
                   " sequences, but this model was loaded for up to ", self.max_batch,
                   " (tessera.load(..., max_batch=", B, "))");
  TESSERA_CHECK_AS(ShapeError, T >= 1 && T <= g.config().block_size, "forward: sequences of ", T,
                   " tokens, but the model's context is ", g.config().block_size);
  for (size_t i = 0; i < tokens.size(); ++i)
    TESSERA_CHECK_AS(ShapeError, tokens.data()[i] >= 0 && tokens.data()[i] < V,
                     "forward: token id ", tokens.data()[i], " is not in [0, ", V, ")");
  auto* out = new float[static_cast<size_t>(B) * T * V];
  nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  {
    nb::gil_scoped_release unlocked;
    g.forward(nn::Batch{tokens.data(), nullptr, B, T}, nn::StepContext{0, 0, false, 1.0f});
    std::copy(g.logits(), g.logits() + static_cast<size_t>(B) * T * V, out);
  }
  const size_t shape[3] = {static_cast<size_t>(B), static_cast<size_t>(T), static_cast<size_t>(V)};
  return nb::ndarray<nb::numpy, float>(out, 3, shape, owner);
}

std::vector<int32_t> generate_ids(Model& self, const std::vector<int32_t>& prompt, int tokens,
                                  float temperature, int top_k, uint64_t seed) {
  TESSERA_CHECK_AS(ConfigError, !prompt.empty(), "generate: the prompt has no tokens");
  const train::SampleOptions o{tokens, temperature, top_k, seed};
  nb::gil_scoped_release unlocked;
  return train::generate(self.gpt(), prompt, o);
}

std::vector<int32_t> encode(const Model& self, const std::string& text) {
  const std::vector<uint32_t> ids = self.tokenizer().encode_with_special_tokens(text);
  return std::vector<int32_t>(ids.begin(), ids.end());
}

// Bytes: a byte-level BPE's pieces need not be whole UTF-8 characters (python/tessera decodes).
nb::bytes decode(const Model& self, const std::vector<int32_t>& ids) {
  const std::string s = self.tokenizer().decode(std::vector<uint32_t>(ids.begin(), ids.end()));
  return nb::bytes(s.data(), s.size());
}

// name -> read-only float32 view of the parameter in the model's memory (kept alive by the
// Model object), under the Hugging Face names the weights were saved with.
nb::dict weights(nb::handle self_handle) {
  Model& self = nb::cast<Model&>(self_handle);
  nb::dict out;
  for (auto& [name, t] : train::named_weights(self.gpt())) {
    std::vector<size_t> shape(t.shape().begin(), t.shape().end());
    out[nb::str(name.c_str())] = nb::cast(
        nb::ndarray<nb::numpy, const float>(t.f32(), shape.size(), shape.data(), self_handle),
        nb::rv_policy::reference);
  }
  return out;
}

Model load(const std::string& path, const std::string& tokenizer, int max_batch, int heads) {
  TESSERA_CHECK_AS(ConfigError, max_batch >= 1, "max_batch must be at least 1, got ", max_batch);
  nb::gil_scoped_release unlocked;
  return Model{train::load_model(path, heads, tokenizer, max_batch), max_batch};
}

}  // namespace

void register_model(nb::module_& m) {
  nb::class_<Model>(m, "_Model")
      .def_prop_ro("config",
                   [](const Model& s) {
                     const nn::GPTConfig& c = s.gpt().config();
                     return to_python(io::hf_config_to_json(train::to_hf_config(c)));
                   })
      .def_prop_ro("vocab_size", [](const Model& s) { return s.gpt().config().vocab_size; })
      .def_prop_ro("block_size", [](const Model& s) { return s.gpt().config().block_size; })
      .def_prop_ro("has_tokenizer", [](const Model& s) { return s.m.tokenizer != nullptr; })
      .def("forward", &forward, nb::arg("tokens"))
      .def("generate_ids", &generate_ids, nb::arg("prompt"), nb::arg("tokens"),
           nb::arg("temperature"), nb::arg("top_k"), nb::arg("seed"))
      .def("encode", &encode, nb::arg("text"))
      .def("decode", &decode, nb::arg("ids"))
      .def("weights", &weights);
  m.def("_load", &load, nb::arg("path"), nb::arg("tokenizer"), nb::arg("max_batch"),
        nb::arg("heads"));
}

}  // namespace tessera::python
