#include "tessera/data/token_file.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "tessera/core/error.h"
#include "test_util.h"

namespace tessera::data {
namespace {

using testing::read_file;
using testing::TempDir;
using testing::write_file;

template <typename Fn>
std::string io_error_message(Fn&& fn) {
  try {
    fn();
  } catch (const IoError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected IoError";
  return "";
}

TEST(TokenFile, WriteReadRoundTripUint16) {
  TempDir dir;
  std::vector<uint32_t> tokens(1000);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 37) % 512);
  write_token_file(dir / "t.tsrtok", tokens, 512);
  EXPECT_TRUE(has_token_file_magic(dir / "t.tsrtok"));
  EXPECT_EQ(std::filesystem::file_size(dir / "t.tsrtok"), kTokenFileHeaderBytes + 2000);
  auto f = TokenFile::open(dir / "t.tsrtok");
  EXPECT_EQ(f->format(), TokenFile::Format::kTessera);
  EXPECT_EQ(f->size(), 1000);
  EXPECT_EQ(f->token_bytes(), 2);
  EXPECT_EQ(f->vocab_size(), 512u);
  for (int64_t i = 0; i < f->size(); ++i) ASSERT_EQ(f->get(i), tokens[static_cast<std::size_t>(i)]);
  std::vector<int32_t> buf(10);
  f->read(995, 5, buf.data());
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(buf[static_cast<std::size_t>(i)],
              static_cast<int32_t>(tokens[995 + static_cast<std::size_t>(i)]));
  EXPECT_THROW(f->read(996, 5, buf.data()), Error);
  EXPECT_EQ(f->max_id(), 511u);
}

TEST(TokenFile, WriteReadRoundTripUint32AndEmpty) {
  TempDir dir;
  std::vector<uint32_t> tokens{0, 65535, 65536, 100000, 7};
  write_token_file(dir / "big.tsrtok", tokens, 100001);
  auto f = TokenFile::open(dir / "big.tsrtok");
  EXPECT_EQ(f->token_bytes(), 4);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    EXPECT_EQ(f->get(static_cast<int64_t>(i)), tokens[i]);
  write_token_file(dir / "empty.tsrtok", {}, 256);
  EXPECT_EQ(TokenFile::open(dir / "empty.tsrtok")->size(), 0);
}

TEST(TokenFile, WriterRejectsIdsOutOfRange) {
  TempDir dir;
  std::vector<uint32_t> tokens{1, 2, 512};
  EXPECT_THROW(write_token_file(dir / "t.tsrtok", tokens, 512), ConfigError);
}

TEST(TokenFile, TruncatedFileIsIoErrorNamingTheFile) {
  TempDir dir;
  std::vector<uint32_t> tokens(100, 3);
  write_token_file(dir / "t.tsrtok", tokens, 512);
  std::string bytes = read_file(dir / "t.tsrtok");
  write_file(dir / "t.tsrtok", bytes.substr(0, bytes.size() - 3));
  std::string msg = io_error_message([&] { TokenFile::open(dir / "t.tsrtok"); });
  EXPECT_NE(msg.find((dir / "t.tsrtok").string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  write_file(dir / "t.tsrtok", bytes.substr(0, 20));
  msg = io_error_message([&] { TokenFile::open(dir / "t.tsrtok"); });
  EXPECT_NE(msg.find("header"), std::string::npos) << msg;
}

TEST(TokenFile, CorruptPayloadOrHeaderIsIoError) {
  TempDir dir;
  std::vector<uint32_t> tokens(100, 3);
  write_token_file(dir / "t.tsrtok", tokens, 512);
  const std::string good = read_file(dir / "t.tsrtok");

  std::string bad = good;
  bad[kTokenFileHeaderBytes + 10] ^= 1;  // flip a payload bit
  write_file(dir / "t.tsrtok", bad);
  std::string msg = io_error_message([&] { TokenFile::open(dir / "t.tsrtok"); });
  EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;
  EXPECT_NE(msg.find((dir / "t.tsrtok").string()), std::string::npos) << msg;
  // Lazy open skips the check until asked.
  auto lazy = TokenFile::open(dir / "t.tsrtok", {.verify_checksum = false});
  EXPECT_THROW(lazy->verify_checksum(), IoError);

  bad = good;
  bad[12] = 3;  // token width 3
  write_file(dir / "t.tsrtok", bad);
  msg = io_error_message([&] { TokenFile::open(dir / "t.tsrtok"); });
  EXPECT_NE(msg.find("width"), std::string::npos) << msg;

  bad = good;
  bad[0] = 'X';
  write_file(dir / "t.tsrtok", bad);
  msg = io_error_message([&] { TokenFile::open(dir / "t.tsrtok"); });
  EXPECT_NE(msg.find("magic"), std::string::npos) << msg;

  msg = io_error_message([&] { TokenFile::open(dir / "missing.tsrtok"); });
  EXPECT_NE(msg.find("missing.tsrtok"), std::string::npos) << msg;
}

TEST(TokenFile, RawUint16BinLikeNanoGpt) {
  TempDir dir;
  std::string bytes;
  for (uint32_t t : {50256u, 1u, 258u}) {
    bytes.push_back(static_cast<char>(t & 0xff));
    bytes.push_back(static_cast<char>(t >> 8));
  }
  write_file(dir / "train.bin", bytes);
  auto f = TokenFile::open_raw_uint16(dir / "train.bin");
  EXPECT_EQ(f->format(), TokenFile::Format::kRawUint16);
  ASSERT_EQ(f->size(), 3);
  EXPECT_EQ(f->get(0), 50256u);
  EXPECT_EQ(f->get(1), 1u);
  EXPECT_EQ(f->get(2), 258u);
  EXPECT_NO_THROW(check_token_ids(*f, 50257));

  write_file(dir / "odd.bin", bytes + "x");
  const std::string msg = io_error_message([&] { TokenFile::open_raw_uint16(dir / "odd.bin"); });
  EXPECT_NE(msg.find("odd.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("odd number"), std::string::npos) << msg;
}

TEST(TokenSource, OutOfRangeIdNamesPositionAndId) {
  TokenVector v({1, 2, 3, 700, 5}, "tokens.bin");
  EXPECT_NO_THROW(check_token_ids(v, 701));
  try {
    check_token_ids(v, 512);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("700"), std::string::npos) << msg;
    EXPECT_NE(msg.find("position 3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tokens.bin"), std::string::npos) << msg;
  }
}

TEST(TokenSource, UnigramEntropy) {
  EXPECT_DOUBLE_EQ(unigram_entropy(TokenVector({5, 5, 5, 5})), 0.0);
  EXPECT_NEAR(unigram_entropy(TokenVector({0, 1, 2, 3, 0, 1, 2, 3})), std::log(4.0), 1e-12);
  EXPECT_NEAR(unigram_entropy(TokenVector({0, 1, 70000, 70000})),
              -(0.25 * std::log(0.25) * 2 + 0.5 * std::log(0.5)), 1e-12);
  EXPECT_NEAR(unigram_entropy(TokenVector({9, 9, 0, 1}), 2, 4), std::log(2.0), 1e-12);
  EXPECT_EQ(unigram_entropy(TokenVector({})), 0.0);
}

}  // namespace
}  // namespace tessera::data
