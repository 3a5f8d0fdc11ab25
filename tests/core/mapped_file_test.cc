#include "tessera/core/mapped_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <utility>

#include "tessera/core/error.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

class MappedFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tessera_mapped_file_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path write(const std::string& name, const std::string& bytes) const {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  static std::string error_of(const fs::path& p) {
    try {
      MappedFile m(p);
    } catch (const IoError& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

TEST_F(MappedFileTest, MapsContents) {
  const fs::path p = write("f.bin", std::string("abc\0def", 7));
  const MappedFile m(p);
  ASSERT_EQ(m.size(), 7u);
  EXPECT_EQ(m.bytes(), std::string_view("abc\0def", 7));
  EXPECT_EQ(std::to_integer<char>(m.data()[4]), 'd');
  EXPECT_EQ(m.path(), p);
}

TEST_F(MappedFileTest, EmptyFile) {
  const MappedFile m(write("empty", ""));
  EXPECT_EQ(m.size(), 0u);
  EXPECT_TRUE(m.bytes().empty());
}

TEST_F(MappedFileTest, DefaultAndMove) {
  MappedFile none;
  EXPECT_EQ(none.data(), nullptr);
  EXPECT_EQ(none.size(), 0u);
  MappedFile a(write("f", "hello"));
  MappedFile b(std::move(a));
  EXPECT_EQ(b.bytes(), "hello");
  EXPECT_EQ(a.size(), 0u);  // NOLINT(bugprone-use-after-move): moved-from is empty
  none = std::move(b);
  EXPECT_EQ(none.bytes(), "hello");
  EXPECT_EQ(none.path().filename(), "f");
}

TEST_F(MappedFileTest, ErrorsNameThePath) {
  const std::string missing = error_of(dir_ / "absent");
  EXPECT_NE(missing.find((dir_ / "absent").string()), std::string::npos) << missing;
  EXPECT_NE(missing.find("No such file"), std::string::npos) << missing;
  const std::string directory = error_of(dir_);
  EXPECT_NE(directory.find(dir_.string()), std::string::npos) << directory;
  EXPECT_NE(directory.find("not a regular file"), std::string::npos) << directory;
}

}  // namespace
}  // namespace tessera
