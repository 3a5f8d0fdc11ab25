// Saving on a full disk or past the file size limit (docs/RELIABILITY.md): a save that fails
// part-way throws an IoError naming the path and the system's reason, leaves no partial file or
// directory behind, and the previous checkpoint stays the one `latest` names and loads.
//
// Each case runs in a forked child: the tmpfs cases in a private mount namespace (so the small
// file system disappears with the child, whatever happens), the RLIMIT_FSIZE case with SIGXFSZ
// ignored so that write() fails with EFBIG instead of killing the process. The tmpfs cases are
// skipped where mounting is not permitted (not root, or a container without CAP_SYS_ADMIN).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <functional>
#include <set>
#include <sstream>
#include <thread>

#include "tessera/io/atomic_file.h"
#include "tessera/io/checkpoint.h"
#include "test_util.h"

namespace tessera::io {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct ChildResult {
  int exit_code = -1;  // -1: killed by a signal or timed out
  std::string report;  // what the child's function returned (or its exception)
};

// Runs `fn` in a forked child and returns what it returned. The child is killed after `limit`.
ChildResult run_in_child(const std::function<std::string()>& fn,
                         std::chrono::seconds limit = std::chrono::seconds(60)) {
  int fds[2];
  if (::pipe(fds) != 0) return {-1, std::string("pipe: ") + std::strerror(errno)};
  const pid_t pid = ::fork();
  if (pid < 0) return {-1, std::string("fork: ") + std::strerror(errno)};
  if (pid == 0) {
    ::close(fds[0]);
    std::string out;
    int code = 0;
    try {
      out = fn();
    } catch (const std::exception& e) {
      out = std::string("FAIL: exception in the child: ") + e.what();
      code = 3;
    }
    for (size_t done = 0; done < out.size();) {
      const ssize_t n = ::write(fds[1], out.data() + done, out.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::_exit(code);
  }
  ::close(fds[1]);
  const auto deadline = Clock::now() + limit;
  ChildResult r;
  char buf[4096];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;  // EOF: the child is exiting
    r.report.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      r.report += "\nFAIL: the child did not finish in time and was killed";
      return r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// In a child: a private mount namespace, then a tmpfs of `bytes` at `dir`. "" on success, else
// why it is not possible here.
std::string mount_tmpfs(const fs::path& dir, size_t bytes) {
  if (::unshare(CLONE_NEWNS) != 0) return std::string("unshare: ") + std::strerror(errno);
  if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    return std::string("making mounts private: ") + std::strerror(errno);
  const std::string opts = "size=" + std::to_string(bytes);
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, opts.c_str()) != 0)
    return std::string("mount -t tmpfs: ") + std::strerror(errno);
  return "";
}

// Shrinks or grows the tmpfs at `dir` (its contents must fit).
std::string resize_tmpfs(const fs::path& dir, size_t bytes) {
  const std::string opts = "size=" + std::to_string(bytes);
  if (::mount("tmpfs", dir.c_str(), "tmpfs", MS_REMOUNT, opts.c_str()) != 0)
    return std::string("remount: ") + std::strerror(errno);
  return "";
}

size_t used_bytes(const fs::path& dir) {
  struct statvfs s {};
  if (::statvfs(dir.c_str(), &s) != 0) return 0;
  return static_cast<size_t>(s.f_blocks - s.f_bfree) * s.f_frsize;
}

std::vector<std::string> entries_of(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

// A checkpoint big enough to span many pages: ~64 KB of weights, ~128 KB of optimizer state.
Checkpoint make(int64_t step) {
  Checkpoint c;
  c.step = step;
  c.config = {.n_layer = 1, .n_head = 2, .n_embd = 64, .n_positions = 16, .vocab_size = 256};
  const float s = static_cast<float>(step);
  c.model = {{"wte.weight", Tensor::from(std::vector<float>(256 * 64, s), {256, 64})}};
  c.optimizer = {
      {"exp_avg.wte.weight", Tensor::from(std::vector<float>(256 * 64, -s), {256, 64})},
      {"exp_avg_sq.wte.weight", Tensor::from(std::vector<float>(256 * 64, s), {256, 64})}};
  c.state = {{"sampler", {{"epoch", 0}, {"index", step}}}};
  return c;
}

// What must hold in `ckdir` after a save of step 200 over a complete step 100, whether it
// succeeded or failed: no staging directory or temporary left, `latest` names a complete
// checkpoint (100, or 200 if the save got that far) and that checkpoint loads with verified
// checksums. Returns "" or what is wrong.
std::string check_consistent(const fs::path& ckdir, bool saved) {
  std::ostringstream bad;
  const auto names = entries_of(ckdir);
  for (const std::string& n : names) {
    if (n != "latest" && n != "step-00000100" && n != "step-00000200")
      bad << "leftover entry '" << n << "'; ";
  }
  const std::string latest = read_file(ckdir / kLatestFile);
  const int64_t want = latest == "step-00000200\n" ? 200 : 100;
  if (saved && want != 200) bad << "the save succeeded but latest is '" << latest << "'; ";
  if (!saved && latest != "step-00000100\n" && latest != "step-00000200\n")
    bad << "latest is '" << latest << "'; ";
  const LoadedCheckpoint c = load_checkpoint(ckdir);
  if (c.step != want) bad << "loaded step " << c.step << ", latest names " << want << "; ";
  if (c.model.read_f32("wte.weight").data<float>()[0] != static_cast<float>(want))
    bad << "the weights of step " << want << " are not the saved ones; ";
  return bad.str();
}

class FullDiskTest : public testing::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    disk_ = dir_ / "disk";
    fs::create_directories(disk_);
  }
  // Runs `fn` in a child with a tmpfs at disk_; skips the test where that is not permitted.
  void with_tmpfs(size_t bytes, const std::function<std::string()>& fn) {
    const ChildResult r = run_in_child([&]() -> std::string {
      if (std::string why = mount_tmpfs(disk_, bytes); !why.empty()) return "SKIP: " + why;
      return fn();
    });
    if (r.report.starts_with("SKIP: ")) GTEST_SKIP() << "no tmpfs here: " << r.report.substr(6);
    EXPECT_EQ(r.exit_code, 0) << r.report;
    EXPECT_EQ(r.report.find("FAIL"), std::string::npos) << r.report;
    if (std::getenv("TESSERA_SHOW_ERRORS")) std::cerr << r.report;
  }
  fs::path disk_;
};

TEST_F(FullDiskTest, WriteFileAtomicKeepsTheOldFileAndNoTemporary) {
  with_tmpfs(64 * 1024, [&]() -> std::string {
    std::ostringstream out;
    const fs::path path = disk_ / "f.txt";
    write_file_atomic(path, "old contents");
    try {
      write_file_atomic(path, std::string(256 * 1024, 'x'));
      out << "FAIL: a write larger than the disk succeeded\n";
    } catch (const IoError& e) {
      const std::string msg = e.what();
      out << "error: " << msg << "\n";
      if (msg.find(path.string()) == std::string::npos) out << "FAIL: the path is not named\n";
      if (msg.find("No space left on device") == std::string::npos)
        out << "FAIL: the system's reason is not given\n";
    }
    if (read_file(path) != "old contents") out << "FAIL: the old contents changed\n";
    if (entries_of(disk_) != std::vector<std::string>{"f.txt"})
      out << "FAIL: leftovers: " << joined(entries_of(disk_)) << "\n";
    if (used_bytes(disk_) > 8192) out << "FAIL: the temporary's space was not freed\n";
    return out.str();
  });
}

// Fills the disk at every point of a save: for each size from "the first checkpoint just fits"
// up to "the second one fits too", in steps of one page, save step 100, shrink the tmpfs to that
// size, save step 200, check the directory, then give the disk room and save 200 again.
TEST_F(FullDiskTest, SaveCheckpointAtEveryPointOfAFullDisk) {
  with_tmpfs(8 << 20, [&]() -> std::string {
    std::ostringstream out;
    const fs::path ckdir = disk_ / "ckpt";
    int failures = 0;
    bool succeeded = false;
    std::set<std::string> failed_in;
    for (size_t extra = 0; extra <= (1u << 20) && !succeeded; extra += 4096) {
      fs::remove_all(ckdir);
      if (std::string why = resize_tmpfs(disk_, 8 << 20); !why.empty()) return "FAIL: " + why;
      save_checkpoint(ckdir, make(100));
      if (std::string why = resize_tmpfs(disk_, used_bytes(disk_) + extra); !why.empty())
        return "FAIL: " + why;
      try {
        save_checkpoint(ckdir, make(200));
        succeeded = true;
      } catch (const IoError& e) {
        ++failures;
        const std::string msg = e.what();
        if (failures == 1) out << "first error: " << msg << "\n";
        if (msg.find(ckdir.string()) == std::string::npos)
          out << "FAIL (" << extra << " bytes free): the path is not named: " << msg << "\n";
        if (msg.find("No space left on device") == std::string::npos)
          out << "FAIL (" << extra << " bytes free): the reason is not given: " << msg << "\n";
        // "... cannot write <path>: ..." names the file being written when space ran out.
        const size_t at = msg.find("cannot write ");
        if (at != std::string::npos) {
          const size_t begin = at + std::string_view("cannot write ").size();
          failed_in.insert(fs::path(msg.substr(begin, msg.find(": ", begin) - begin)).filename());
        }
      }
      if (std::string bad = check_consistent(ckdir, succeeded); !bad.empty())
        out << "FAIL (" << extra << " bytes free): " << bad << "\n";
      if (!succeeded) {
        // Room again: the next save works and leaves nothing of the failed one behind.
        if (std::string why = resize_tmpfs(disk_, 8 << 20); !why.empty()) return "FAIL: " + why;
        save_checkpoint(ckdir, make(200));
        if (std::string bad = check_consistent(ckdir, true); !bad.empty())
          out << "FAIL (retry after " << extra << " bytes free): " << bad << "\n";
      }
    }
    out << failures << " failed saves before one fit, in:";
    for (const std::string& f : failed_in) out << " " << f;
    out << "\n";
    // Every file of a save ran out of space at some size: every step of the save was tried.
    const std::set<std::string> all = {kModelFile, kOptimizerFile, kConfigFile, kStateFile,
                                       kLatestFile};
    if (failed_in != all) out << "FAIL: expected failures in every file of a save\n";
    if (!succeeded) out << "FAIL: the save never fitted\n";
    return out.str();
  });
}

TEST_F(FullDiskTest, SaveCheckpointOverTheFileSizeLimit) {
  // No privileges needed: RLIMIT_FSIZE makes write() fail with EFBIG once a file would exceed
  // the limit (SIGXFSZ ignored). The weights (64 KB) fit under it, the optimizer state does not.
  const fs::path ckdir = dir_ / "ckpt";
  save_checkpoint(ckdir, make(100));
  const ChildResult r = run_in_child([&]() -> std::string {
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit lim{100 * 1024, 100 * 1024};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return std::string("FAIL: setrlimit");
    try {
      save_checkpoint(ckdir, make(200));
      return "FAIL: the save succeeded";
    } catch (const IoError& e) {
      return e.what();
    }
  });
  EXPECT_EQ(r.exit_code, 0) << r.report;
  EXPECT_NE(r.report.find((ckdir / "step-00000200.tmp" / kOptimizerFile).string()),
            std::string::npos)
      << r.report;
  EXPECT_NE(r.report.find("File too large"), std::string::npos) << r.report;
  EXPECT_EQ(entries_of(ckdir), (std::vector<std::string>{"latest", "step-00000100"}));
  EXPECT_EQ(check_consistent(ckdir, false), "");
  save_checkpoint(ckdir, make(200));  // without the limit it works, nothing in the way
  EXPECT_EQ(check_consistent(ckdir, true), "");
}

}  // namespace
}  // namespace tessera::io
