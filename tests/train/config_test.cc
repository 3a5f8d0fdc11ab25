#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
#include "tessera/train/train_config.h"

namespace tessera::train {
namespace {

TEST(TrainConfig, JsonRoundTripAndDefaults) {
  TrainConfig c;
  c.layers = 7;
  c.lr = 1e-4f;
  c.data = "x.txt";
  TrainConfig d = train_config_from_json(to_json(c));
  EXPECT_EQ(d.layers, 7);
  EXPECT_EQ(d.lr, 1e-4f);
  EXPECT_EQ(d.data, "x.txt");
  TrainConfig e = train_config_from_json(nlohmann::json::object({{"dim", 64}}));
  EXPECT_EQ(e.dim, 64);
  EXPECT_EQ(e.layers, TrainConfig{}.layers);
}

TEST(TrainConfig, UnknownKeysAndWrongTypesAreErrors) {
  EXPECT_THROW(train_config_from_json({{"layer", 3}}), ConfigError);
  try {
    train_config_from_json({{"steps", "many"}});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("steps"), std::string::npos);
  }
  EXPECT_THROW(train_config_from_json(nlohmann::json::array()), ConfigError);
}

TEST(TrainConfig, NumbersMustFitTheirField) {
  using nlohmann::json;
  // Rejected rather than wrapped, truncated or overflowed (found by fuzzing, docs/RELIABILITY.md).
  for (const json& bad :
       {json{{"vocab", 4294967809u}}, json{{"vocab", 1e300}}, json{{"layers", 2.5}},
        json{{"seed", -1}}, json{{"steps", true}}, json{{"lr", 1e300}}, json{{"dropout", -1e39}}}) {
    try {
      train_config_from_json(bad);
      ADD_FAILURE() << bad.dump() << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(bad.begin().key()), std::string::npos) << e.what();
    }
  }
  // Integral floats fit integer fields; integers fit float fields; the full uint64 seed range.
  const TrainConfig c = train_config_from_json(
      json{{"steps", 1000.0}, {"lr", 1}, {"seed", 18446744073709551615u}, {"warmup", -5}});
  EXPECT_EQ(c.steps, 1000);
  EXPECT_EQ(c.lr, 1.0f);
  EXPECT_EQ(c.seed, 18446744073709551615u);
  EXPECT_EQ(c.warmup, -5);
}

TEST(TrainConfig, ValidateNamesTheProblem) {
  TrainConfig c;
  c.heads = 5;
  try {
    c.validate();
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--heads 5 does not divide --dim"), std::string::npos);
  }
  c = TrainConfig{};
  c.micro_batch = 3;
  EXPECT_THROW(c.validate(), ConfigError);
  c = TrainConfig{};
  c.optimizer = "adam";
  EXPECT_THROW(c.validate(), ConfigError);
  c = TrainConfig{};
  c.val_fraction = 1.0;
  EXPECT_THROW(c.validate(), ConfigError);
  c = TrainConfig{};
  c.recompute = "some";
  try {
    c.validate();
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--recompute must be none, selective or full, got 'some'"),
              std::string::npos);
  }
  TrainConfig{}.validate();
}

TEST(TrainConfig, IoTimeoutIsAPositiveNumberOfSeconds) {
  for (const double bad : {0.0, -1.0, 86400.0 * 366, std::nan("")}) {
    TrainConfig c;
    c.io_timeout = bad;
    try {
      c.validate();
      FAIL() << bad;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--io-timeout must be a number of seconds in (0, 1 "
                                           "year]"),
                std::string::npos)
          << e.what();
    }
  }
  TrainConfig c;
  c.io_timeout = 0.25;
  c.validate();
  EXPECT_EQ(train_config_from_json({{"io_timeout", 7.5}}).io_timeout, 7.5);
  EXPECT_EQ(train_config_from_json(nlohmann::json::object()).io_timeout, 3600);  // older configs
}

TEST(TrainConfig, PrecisionNamesTheAcceptedValues) {
  TrainConfig c;
  c.precision = "fp16";
  try {
    c.validate();
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--precision must be fp32 or bf16, got 'fp16'"),
              std::string::npos)
        << e.what();
  }
  c = TrainConfig{};
  c.bf16_gemm = "amx";
  try {
    c.validate();
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--bf16-gemm must be auto, onednn or emulated"),
              std::string::npos)
        << e.what();
  }
  c = train_config_from_json(nlohmann::json{{"precision", "bf16"}, {"bf16_gemm", "emulated"}});
  EXPECT_EQ(c.precision, "bf16");
  EXPECT_EQ(c.bf16_gemm, "emulated");
  c.validate();
  EXPECT_EQ(TrainConfig{}.precision, "fp32");  // fp32 stays the default
}

// --param-gather-dtype and --activation-comm-dtype follow --precision unless given; a bad value is
// a ConfigError naming the flag before any work starts.
TEST(TrainConfig, CommDtypesDefaultToThePrecisionAndNameTheFlag) {
  TrainConfig c;
  EXPECT_EQ(c.param_gather_dtype, "auto");
  EXPECT_EQ(c.activation_comm_dtype, "auto");
  EXPECT_EQ(comm_dtype(c.param_gather_dtype, "fp32", "--param-gather-dtype"), DType::F32);
  EXPECT_EQ(comm_dtype(c.param_gather_dtype, "bf16", "--param-gather-dtype"), DType::BF16);
  EXPECT_EQ(comm_dtype("fp32", "bf16", "--param-gather-dtype"), DType::F32);
  EXPECT_EQ(comm_dtype("bf16", "fp32", "--param-gather-dtype"), DType::BF16);
  for (const char* flag : {"--param-gather-dtype", "--activation-comm-dtype"}) {
    c = TrainConfig{};
    (std::string(flag) == "--param-gather-dtype" ? c.param_gather_dtype : c.activation_comm_dtype) =
        "fp16";
    try {
      c.validate();
      FAIL() << flag;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(flag) +
                                           " must be auto (the --precision), fp32 or bf16, got "
                                           "'fp16'"),
                std::string::npos)
          << e.what();
    }
  }
  c = train_config_from_json(
      nlohmann::json{{"param_gather_dtype", "fp32"}, {"activation_comm_dtype", "bf16"}});
  EXPECT_EQ(c.param_gather_dtype, "fp32");
  EXPECT_EQ(c.activation_comm_dtype, "bf16");
  c.validate();
}

}  // namespace
}  // namespace tessera::train
