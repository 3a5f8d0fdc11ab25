#include "tessera/io/tensor_set.h"

#include <gtest/gtest.h>

#include "tessera/io/hf_config.h"
#include "test_util.h"

namespace tessera::io {
namespace {

using testing::expect_error;

class TensorSetTest : public testing::TempDirTest {
 protected:
  // A tiny GPT-2 (2 layers, C=4, V=10, T=6) with every tensor filled with a distinct value.
  HfGptConfig cfg() const {
    HfGptConfig c;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 4;
    c.vocab_size = 10;
    c.n_positions = 6;
    return c;
  }
  NamedTensors gpt2_tensors(const std::string& prefix = "") const {
    NamedTensors out;
    float v = 1;
    for (const ExpectedTensor& e : gpt2_expected_tensors(cfg())) {
      Tensor t = Tensor::empty(e.shape);
      t.fill_(v++);
      out.emplace_back(prefix + e.name, t);
    }
    return out;
  }
  std::filesystem::path write(const NamedTensors& t, const std::string& name = "m.safetensors") {
    save_safetensors(dir_ / name, t);
    return dir_ / name;
  }
};

TEST_F(TensorSetTest, LoadsEverythingExpected) {
  const auto path = write(gpt2_tensors());
  const auto expected = gpt2_expected_tensors(cfg());
  EXPECT_EQ(expected.size(), 2u + 12u * 2u + 2u);
  auto got = load_expected(SafetensorsFile(path), expected);
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_EQ(got.at("wte.weight").shape(), (Shape{10, 4}));
  EXPECT_EQ(got.at("wte.weight").to_vector()[0], 1.0f);
  EXPECT_EQ(got.at("ln_f.bias").to_vector()[3], static_cast<float>(expected.size()));
}

TEST_F(TensorSetTest, MissingTensorIsNamed) {
  NamedTensors t = gpt2_tensors();
  t.erase(t.begin() + 5);  // h.0.attn.c_attn.bias
  const auto path = write(t);
  expect_error<IoError>([&] { load_expected(SafetensorsFile(path), gpt2_expected_tensors(cfg())); },
                        {path.string(), "missing the tensor 'h.0.attn.c_attn.bias'"});
}

TEST_F(TensorSetTest, WrongShapeNamesExpectedAndGot) {
  NamedTensors t = gpt2_tensors();
  t[4].second = Tensor::zeros({4, 11});  // h.0.attn.c_attn.weight should be [4, 12]
  const auto path = write(t);
  expect_error<IoError>([&] { load_expected(SafetensorsFile(path), gpt2_expected_tensors(cfg())); },
                        {path.string(), "'h.0.attn.c_attn.weight'", "has shape [4, 11]",
                         "the model expects [4, 12]"});
}

TEST_F(TensorSetTest, TransformerPrefixAcceptedAndHfExtrasIgnored) {
  NamedTensors t = gpt2_tensors("transformer.");
  t.emplace_back("lm_head.weight", Tensor::zeros({10, 4}));
  t.emplace_back("transformer.h.0.attn.bias", Tensor::zeros({1, 1, 6, 6}));
  t.emplace_back("transformer.h.1.attn.masked_bias", Tensor::zeros({}));
  const auto path = write(t);
  TensorLoadReport report;
  auto got = load_expected(SafetensorsFile(path), gpt2_expected_tensors(cfg()), {},
                           MemCategory::Parameters, &report);
  EXPECT_EQ(got.count("h.1.mlp.c_fc.weight"), 1u);
  EXPECT_EQ(report.ignored.size(), 3u);
  EXPECT_TRUE(report.unexpected.empty());
}

TEST_F(TensorSetTest, UnexpectedTensorsAreAnErrorOrAReport) {
  NamedTensors t = gpt2_tensors();
  t.emplace_back("h.2.ln_1.weight", Tensor::zeros({4}));  // a third layer the model lacks
  const auto path = write(t);
  SafetensorsFile f(path);
  expect_error<IoError>([&] { load_expected(f, gpt2_expected_tensors(cfg())); },
                        {path.string(), "'h.2.ln_1.weight'", "does not have"});
  TensorLoadOptions lenient;
  lenient.error_on_unexpected = false;
  TensorLoadReport report;
  load_expected(f, gpt2_expected_tensors(cfg()), lenient, MemCategory::Parameters, &report);
  EXPECT_EQ(report.unexpected, std::vector<std::string>{"h.2.ln_1.weight"});
}

TEST_F(TensorSetTest, SameTensorUnderTwoNamesIsAnError) {
  NamedTensors t = gpt2_tensors();
  t.emplace_back("transformer.wte.weight", Tensor::zeros({10, 4}));
  const auto path = write(t);
  expect_error<IoError>([&] { load_expected(SafetensorsFile(path), gpt2_expected_tensors(cfg())); },
                        {path.string(), "'transformer.wte.weight'", "'wte.weight'"});
}

TEST_F(TensorSetTest, LoadIntoViewsOfOneBuffer) {
  const auto path =
      write({{"a", Tensor::from({1, 2, 3, 4}, {2, 2})}, {"b", Tensor::from({5}, {1})}});
  Tensor flat = Tensor::zeros({5});
  NamedTensors dst = {{"a", flat.view(0, {2, 2})}, {"b", flat.view(4, {1})}};
  load_into(SafetensorsFile(path), dst);
  EXPECT_EQ(flat.to_vector(), (std::vector<float>{1, 2, 3, 4, 5}));
}

TEST(NameMatches, StarIsOneOrMoreNonDotCharacters) {
  EXPECT_TRUE(name_matches("h.*.attn.bias", "h.11.attn.bias"));
  EXPECT_FALSE(name_matches("h.*.attn.bias", "h..attn.bias"));
  EXPECT_FALSE(name_matches("h.*.attn.bias", "h.1.2.attn.bias"));
  EXPECT_FALSE(name_matches("h.*.attn.bias", "h.1.attn.c_attn.bias"));
  EXPECT_TRUE(name_matches("lm_head.weight", "lm_head.weight"));
  EXPECT_FALSE(name_matches("lm_head.weight", "lm_head.weights"));
  EXPECT_TRUE(name_matches("*", "x"));
  EXPECT_FALSE(name_matches("*", ""));
}

}  // namespace
}  // namespace tessera::io
