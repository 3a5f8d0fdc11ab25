#include "test_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>

namespace tessera::data::testing {

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = "tessera_data_" + std::to_string(::getpid()) + "_" +
                     std::to_string(counter++) + "_" + (info ? info->name() : "x");
  path_ = std::filesystem::path(::testing::TempDir()) / name;
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string small_corpus() {
  static const char* kSentences[] = {
      "The quick brown fox jumps over the lazy dog.\n",
      "A journey of a thousand miles begins with a single step.\n",
      "To be, or not to be, that is the question.\n",
      "All that glitters is not gold; don't judge a book by its cover.\n",
      "In 1969, 600 million people watched the landing on the moon.\n",
      "There's no place like home, there's no place like home!\n",
      "    Indented lines\tand tabs\tshould survive   intact.\n",
  };
  std::string s;
  for (int rep = 0; rep < 30; ++rep)
    for (int i = 0; i < 7; ++i) s += kSentences[(i * 3 + rep) % 7];
  return s;
}

}  // namespace tessera::data::testing
