#include "tessera/io/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <set>
#include <thread>
#include <vector>

#include "test_util.h"

namespace tessera::io {
namespace {

using testing::expect_error;
using testing::slurp;
using testing::spit;
namespace fs = std::filesystem;

class AtomicFileTest : public testing::TempDirTest {
 protected:
  // Entries of dir_ other than `keep` (leftover temporaries).
  std::vector<std::string> others(const std::string& keep) const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.path().filename() != keep) out.push_back(e.path().filename().string());
    }
    return out;
  }
};

TEST_F(AtomicFileTest, WritesAndReplaces) {
  const auto path = dir_ / "f.txt";
  const FileDigest d = write_file_atomic(path, "first");
  EXPECT_EQ(d.bytes, 5u);
  EXPECT_EQ(d.crc32, crc32_update(0, "first", 5));
  EXPECT_EQ(read_file(path), "first");
  write_file_atomic(path, "second, longer");
  EXPECT_EQ(read_file(path), "second, longer");
  EXPECT_TRUE(others("f.txt").empty());
}

TEST_F(AtomicFileTest, MissingParentDirectory) {
  const auto path = dir_ / "no" / "such" / "f.txt";
  expect_error<IoError>([&] { write_file_atomic(path, "x"); },
                        {path.string(), "No such file or directory"});
}

TEST_F(AtomicFileTest, ParentIsARegularFile) {
  // Tests run as root, so permissions cannot make a directory unwritable; a file can.
  spit(dir_ / "file", "I am a file");
  const auto path = dir_ / "file" / "inner";
  expect_error<IoError>([&] { write_file_atomic(path, "x"); }, {path.string(), "Not a directory"});
  EXPECT_EQ(slurp(dir_ / "file"), "I am a file");
}

TEST_F(AtomicFileTest, AbandonedWriterLeavesOldFileAndNoTemporary) {
  const auto path = dir_ / "f.txt";
  write_file_atomic(path, "old");
  {
    AtomicFileWriter w(path);
    w.write("new content that is never committed");
    EXPECT_TRUE(fs::exists(w.temp_path()));
    EXPECT_EQ(w.temp_path().parent_path(), dir_);
  }
  EXPECT_EQ(read_file(path), "old");
  EXPECT_TRUE(others("f.txt").empty());
}

TEST_F(AtomicFileTest, WriteFailureMidFileKeepsOldFile) {
  // Simulate a full disk: a file size limit makes write() fail with EFBIG.
  const auto path = dir_ / "f.txt";
  write_file_atomic(path, "old contents");
  struct rlimit old_limit;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old_limit;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string error;
  try {
    write_file_atomic(path, std::string(100000, 'x'));
  } catch (const IoError& e) {
    error = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(error.find(path.string()), std::string::npos) << error;
  EXPECT_NE(error.find("File too large"), std::string::npos) << error;
  EXPECT_EQ(read_file(path), "old contents");
  EXPECT_TRUE(others("f.txt").empty());
}

// Files past the 4 MiB staging buffer are written in aligned chunks (O_DIRECT where the file
// system takes it) and a buffered tail: every byte lands, in order, whatever the pieces.
TEST_F(AtomicFileTest, LargeFileInOddPiecesIsWrittenExactly) {
  const auto path = dir_ / "big.bin";
  std::string want(10 * (1 << 20) + 12345, '\0');
  for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<char>((i * 2654435761u) >> 13);
  AtomicFileWriter w(path);
  size_t at = 0;
  for (size_t piece : {size_t{1}, size_t{4095}, size_t{3} << 20, size_t{4} << 20, size_t{7}}) {
    w.write(want.data() + at, piece);
    at += piece;
  }
  w.write(want.data() + at, want.size() - at);
  const FileDigest d = w.commit();
  EXPECT_EQ(d.bytes, want.size());
  EXPECT_EQ(d.crc32, crc32_update(0, want.data(), want.size()));
  EXPECT_TRUE(read_file(path) == want);
  EXPECT_TRUE(others("big.bin").empty());
}

// A failure after some chunks went out directly: the same error, the old file kept.
TEST_F(AtomicFileTest, WriteFailureMidLargeFileKeepsOldFile) {
  const auto path = dir_ / "f.bin";
  write_file_atomic(path, "old contents");
  struct rlimit old_limit;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old_limit;
  small.rlim_cur = 6 << 20;  // inside the second 4 MiB chunk
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string error;
  try {
    write_file_atomic(path, std::string(9 << 20, 'x'));
  } catch (const IoError& e) {
    error = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(error.find("File too large"), std::string::npos) << error;
  EXPECT_EQ(read_file(path), "old contents");
  EXPECT_TRUE(others("f.bin").empty());
}

TEST_F(AtomicFileTest, RenameFailureKeepsTargetAndRemovesTemporary) {
  // The target is a non-empty directory, so rename() fails after the data was written.
  const auto path = dir_ / "d";
  fs::create_directories(path / "child");
  expect_error<IoError>([&] { write_file_atomic(path, "x"); }, {path.string(), "renaming"});
  EXPECT_TRUE(fs::is_directory(path / "child"));
  EXPECT_TRUE(others("d").empty());
}

TEST_F(AtomicFileTest, TemporaryNamesAreUniquePerCallAndThread) {
  const auto path = dir_ / "f.txt";
  std::vector<std::string> names(64);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < names.size(); ++i) {
    threads.emplace_back([&, i] {
      AtomicFileWriter w(path);
      names[i] = w.temp_path().string();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size());
  EXPECT_TRUE(others("f.txt").empty());
}

TEST_F(AtomicFileTest, ConcurrentWritersOfTheSameContent) {
  // E.g. ranks preparing the same cache: every writer succeeds, the file is complete.
  const auto path = dir_ / "f.txt";
  const std::string contents(10000, 'c');
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      for (int j = 0; j < 10; ++j) write_file_atomic(path, contents);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(read_file(path), contents);
  EXPECT_TRUE(others("f.txt").empty());
}

TEST_F(AtomicFileTest, ReadFileErrorsNameThePath) {
  expect_error<IoError>([&] { read_file(dir_ / "absent"); }, {"absent", "No such file"});
}

}  // namespace
}  // namespace tessera::io
