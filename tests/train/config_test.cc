#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "tessera/core/error.h"
#include "tessera/io/hf_config.h"
#include "tessera/train/model_io.h"
#include "tessera/train/train_config.h"

namespace tessera::train {
namespace {

std::string config_error(const TrainConfig& c) {
  try {
    c.validate();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string json_error(const nlohmann::json& j) {
  try {
    train_config_from_json(j);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TrainConfig, JsonRoundTripAndDefaults) {
  TrainConfig c;
  c.layers = 7;
  c.lr = 1e-4f;
  c.data = "x.txt";
  c.precision = kernels::Precision::BF16;
  c.schedule = parallel::ScheduleKind::ZeroBubbleH1;
  c.recompute = nn::Recompute::Selective;
  c.activation_comm_dtype = WireDtype::Fp32;
  const nlohmann::json j = to_json(c);
  EXPECT_EQ(j["precision"], "bf16");  // enumerations travel by name
  EXPECT_EQ(j["schedule"], "zb-h1");
  EXPECT_EQ(j["recompute"], "selective");
  TrainConfig d = train_config_from_json(j);
  EXPECT_EQ(d.layers, 7);
  EXPECT_EQ(d.lr, 1e-4f);
  EXPECT_EQ(d.data, "x.txt");
  EXPECT_EQ(d.precision, kernels::Precision::BF16);
  EXPECT_EQ(d.schedule, parallel::ScheduleKind::ZeroBubbleH1);
  EXPECT_EQ(d.recompute, nn::Recompute::Selective);
  EXPECT_EQ(d.activation_comm_dtype, WireDtype::Fp32);
  EXPECT_EQ(to_json(d), j);
  TrainConfig e = train_config_from_json(nlohmann::json::object({{"dim", 64}}));
  EXPECT_EQ(e.dim, 64);
  EXPECT_EQ(e.layers, TrainConfig{}.layers);
  EXPECT_EQ(TrainConfig{}.precision, kernels::Precision::F32);  // fp32 stays the default
}

TEST(TrainConfig, UnknownKeysAndWrongTypesAreErrors) {
  EXPECT_NE(json_error({{"layer", 3}}).find("unknown config key 'layer'"), std::string::npos);
  EXPECT_NE(json_error({{"steps", "many"}}).find("steps has the wrong type"), std::string::npos);
  EXPECT_NE(json_error({{"precision", 16}}).find("precision has the wrong type"),
            std::string::npos);
  EXPECT_THROW(train_config_from_json(nlohmann::json::array()), ConfigError);
}

TEST(TrainConfig, NumbersMustFitTheirField) {
  using nlohmann::json;
  // Rejected rather than wrapped, truncated or overflowed (found by fuzzing, docs/RELIABILITY.md).
  for (const json& bad :
       {json{{"vocab", 4294967809u}}, json{{"vocab", 1e300}}, json{{"layers", 2.5}},
        json{{"seed", -1}}, json{{"steps", true}}, json{{"lr", 1e300}}, json{{"dropout", -1e39}}}) {
    const std::string e = json_error(bad);
    EXPECT_NE(e.find(bad.begin().key()), std::string::npos) << bad.dump() << ": " << e;
  }
  // Integral floats fit integer fields; integers fit float fields; the full uint64 seed range.
  const TrainConfig c = train_config_from_json(
      json{{"steps", 1000.0}, {"lr", 1}, {"seed", 18446744073709551615u}, {"warmup", 5}});
  EXPECT_EQ(c.steps, 1000);
  EXPECT_EQ(c.lr, 1.0f);
  EXPECT_EQ(c.seed, 18446744073709551615u);
  EXPECT_EQ(c.warmup, 5);
}

// A field's own rule is checked once, by its table entry: when a file or a flag sets it, and by
// validate() for a value set in code.
TEST(TrainConfig, EachFieldsRuleIsCheckedWhenReadAndByValidate) {
  EXPECT_NE(json_error({{"zero", 4}}).find("zero must be in [0, 3], got 4"), std::string::npos);
  EXPECT_NE(json_error({{"warmup", -5}}).find("warmup must be >= 0, got -5"), std::string::npos);
  EXPECT_NE(json_error({{"memory_limit", "lots"}}).find("lots"), std::string::npos);
  TrainConfig c;
  c.zero = 5;
  EXPECT_NE(config_error(c).find("zero must be in [0, 3], got 5"), std::string::npos);
  c = TrainConfig{};
  c.val_fraction = 1.0;
  EXPECT_NE(config_error(c).find("val_fraction must be in [0, 1), got 1"), std::string::npos);
  c = TrainConfig{};
  c.recompute = static_cast<nn::Recompute>(42);  // not a value of the enumeration
  EXPECT_NE(config_error(c).find("recompute holds a value that is none of none, selective, full"),
            std::string::npos)
      << config_error(c);
  TrainConfig{}.validate();
}

TEST(TrainConfig, ValidateNamesTheKeysOfRulesBetweenKeys) {
  TrainConfig c;
  c.heads = 5;
  EXPECT_NE(config_error(c).find("heads 5 does not divide dim 192"), std::string::npos)
      << config_error(c);
  c = TrainConfig{};
  c.micro_batch = 3;
  EXPECT_NE(config_error(c).find("micro_batch 3 must divide the per-rank batch 16"),
            std::string::npos);
  c = TrainConfig{};
  c.virtual_stages = 2;
  c.pp = 2;
  EXPECT_NE(config_error(c).find("virtual_stages 2 needs schedule interleaved"), std::string::npos)
      << config_error(c);
  c.schedule = parallel::ScheduleKind::Interleaved;
  c.validate();
}

TEST(TrainConfig, ZeroShardGroupIsAllHostOrADivisorOfTheGradientGroup) {
  TrainConfig c;
  c.dp = 4;
  c.zero = 3;
  for (const char* ok : {"all", "host", "1", "2", "4"}) {
    c.zero_shard_group = ok;
    c.validate();
  }
  c.zero_shard_group = "3";
  EXPECT_NE(config_error(c).find("zero_shard_group 3 must divide the 4 ranks"), std::string::npos)
      << config_error(c);
  for (const char* bad : {"node", "0", "-2", "2x"}) {
    c.zero_shard_group = bad;
    EXPECT_NE(config_error(c).find("zero_shard_group must be all, host or a number of ranks"),
              std::string::npos)
        << bad << ": " << config_error(c);
  }
  c.zero_shard_group = "2";
  c.zero = 0;
  EXPECT_NE(config_error(c).find("needs zero 1, 2 or 3"), std::string::npos) << config_error(c);
  c.zero_shard_group = "host";  // threads: one host, so no hybrid; with ZeRO 0 nothing to shard
  EXPECT_NE(config_error(c).find("needs zero 1, 2 or 3"), std::string::npos) << config_error(c);
}

TEST(TrainConfig, ChoicesNameTheAcceptedValues) {
  const std::pair<const char*, const char*> cases[] = {
      {"precision", "precision must be fp32 or bf16, got 'fp16'"},
      {"bf16_gemm", "bf16_gemm must be auto, onednn or emulated, got 'fp16'"},
      {"recompute", "recompute must be none, selective or full, got 'fp16'"},
      {"optimizer", "optimizer must be adamw or sgd, got 'fp16'"},
      {"schedule", "schedule must be gpipe, 1f1b, interleaved or zb-h1, got 'fp16'"},
      {"param_gather_dtype", "param_gather_dtype must be auto, fp32 or bf16, got 'fp16'"},
      {"activation_comm_dtype", "activation_comm_dtype must be auto, fp32 or bf16, got 'fp16'"},
      {"grad_reduce_dtype", "grad_reduce_dtype must be fp32 or bf16, got 'fp16'"},
      {"backend", "backend must be auto, inproc or mpi, got 'fp16'"},
  };
  for (const auto& [key, message] : cases) {
    const std::string e = json_error({{key, "fp16"}});
    EXPECT_NE(e.find(message), std::string::npos) << key << ": " << e;
  }
  const TrainConfig c =
      train_config_from_json(nlohmann::json{{"precision", "bf16"}, {"bf16_gemm", "emulated"}});
  EXPECT_EQ(c.precision, kernels::Precision::BF16);
  EXPECT_EQ(c.bf16_gemm, kernels::Bf16Gemm::Emulated);
}

// --param-gather-dtype and --activation-comm-dtype follow --precision unless given.
TEST(TrainConfig, WireDtypesDefaultToThePrecision) {
  const TrainConfig c;
  EXPECT_EQ(c.param_gather_dtype, WireDtype::Auto);
  EXPECT_EQ(c.activation_comm_dtype, WireDtype::Auto);
  EXPECT_EQ(resolve(WireDtype::Auto, kernels::Precision::F32), DType::F32);
  EXPECT_EQ(resolve(WireDtype::Auto, kernels::Precision::BF16), DType::BF16);
  EXPECT_EQ(resolve(WireDtype::Fp32, kernels::Precision::BF16), DType::F32);
  EXPECT_EQ(resolve(WireDtype::Bf16, kernels::Precision::F32), DType::BF16);
}

TEST(TrainConfig, IoTimeoutIsAPositiveNumberOfSeconds) {
  for (const double bad : {0.0, -1.0, 86400.0 * 366, std::nan("")}) {
    TrainConfig c;
    c.io_timeout = bad;
    EXPECT_NE(config_error(c).find("io_timeout must be a number of seconds in (0, 1 year]"),
              std::string::npos)
        << config_error(c);
  }
  TrainConfig c;
  c.io_timeout = 0.25;
  c.validate();
  EXPECT_EQ(train_config_from_json({{"io_timeout", 7.5}}).io_timeout, 7.5);
  EXPECT_EQ(train_config_from_json(nlohmann::json::object()).io_timeout, 3600);  // older configs
}

// The table is the one list of keys: each key once, with help, and its default survives being
// written and read back (as JSON and as command-line text).
TEST(ConfigFields, EveryKeyOnceWithHelpAndItsDefaultRoundTrips) {
  std::set<std::string> keys;
  const TrainConfig defaults;
  for (const ConfigField& f : train_config_fields()) {
    SCOPED_TRACE(f.key);
    EXPECT_TRUE(keys.insert(f.key).second) << "key listed twice";
    EXPECT_FALSE(f.help.empty());
    EXPECT_FALSE(f.group.empty());
    EXPECT_EQ(flag_of(f.key).rfind("--", 0), 0u);
    EXPECT_EQ(flag_of(f.key).find('_'), std::string::npos);
    TrainConfig c;
    f.set(c, f.get(defaults));
    EXPECT_EQ(f.get(c), f.get(defaults));
    const nlohmann::json v = f.get(defaults);
    const std::string text = v.is_string() ? v.get<std::string>() : v.dump();
    EXPECT_EQ(value_from_text(f, text), v);
    if (f.kind == ConfigField::Kind::Choice) {
      EXPECT_NE(std::find(f.choices.begin(), f.choices.end(), v.get<std::string>()),
                f.choices.end());
    }
  }
  EXPECT_EQ(keys.size(), to_json(defaults).size());
}

TEST(ConfigFields, CommandLineTextIsReadAsTheFieldsType) {
  auto field = [](const std::string& key) {
    for (const ConfigField& f : train_config_fields())
      if (f.key == key) return f;
    throw std::runtime_error("no field " + key);
  };
  EXPECT_EQ(value_from_text(field("layers"), "12"), 12);
  EXPECT_EQ(value_from_text(field("lr"), "3e-4"), 3e-4);
  EXPECT_EQ(value_from_text(field("overlap"), "false"), false);
  EXPECT_EQ(value_from_text(field("data"), "12"), "12");  // text stays text
  for (const char* bad : {"twelve", "0x10", "1e", ""}) {
    try {
      value_from_text(field("layers"), bad);
      ADD_FAILURE() << bad << " was read as a number";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("layers must be a number"), std::string::npos);
      EXPECT_NE(e.render(flag_of).find("--layers must be a number"), std::string::npos);
    }
  }
  EXPECT_THROW(value_from_text(field("overlap"), "maybe"), ConfigError);
}

// A library error names a configuration key; what() shows the key, the command its flag.
TEST(ConfigError, RendersMarkedKeysForEachReader) {
  const ConfigError e(config_key("micro_batch") + " 3 must divide " + config_key("batch") + " 8");
  EXPECT_STREQ(e.what(), "micro_batch 3 must divide batch 8");
  EXPECT_EQ(e.render(flag_of), "--micro-batch 3 must divide --batch 8");
  EXPECT_STREQ(ConfigError("no keys {here}").what(), "no keys {here}");
}

}  // namespace
}  // namespace tessera::train

namespace tessera::train {
namespace {

// A Llama-family model's config.json reads back as the model that wrote it: biases on q, k and v
// alone are Qwen2's (Llama's attention_bias would add one on o_proj too, and a resume would then
// look for o_proj.bias).
TEST(HfExport, BiasesReadBackAsTheyWereBuilt) {
  for (const auto& [qkv, o, type] :
       {std::tuple{false, false, "llama"}, std::tuple{true, false, "qwen2"},
        std::tuple{true, true, "llama"}}) {
    nn::GPTConfig c;
    c.arch = nn::Arch::Llama;
    c.n_layer = 2, c.n_embd = 32, c.n_head = 4, c.n_kv_head = 2, c.block_size = 16;
    c.vocab_size = 64, c.qkv_bias = qkv, c.o_bias = o;
    const nlohmann::json j = io::hf_config_to_json(to_hf_config(c));
    EXPECT_EQ(j["model_type"], type);
    const nn::GPTConfig back = from_hf_config(io::parse_hf_config(j, "config.json"), 0.0f);
    EXPECT_EQ(back.qkv_bias, qkv) << type;
    EXPECT_EQ(back.o_bias, o) << type;
  }
}

}  // namespace
}  // namespace tessera::train
