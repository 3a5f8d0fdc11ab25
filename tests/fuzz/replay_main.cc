// Replays inputs through a fuzz target without libFuzzer: `replay_<target> PATH...` runs every
// file named, and every file under each directory named (recursively, in name order), through
// LLVMFuzzerTestOneInput once. CTest runs it on tests/fuzz/corpus/<target>/ and
// tests/fuzz/regressions/<target>/, so the normal build and the sanitizer build check every saved
// input in seconds. Exit status 0 when all inputs pass; a crash, a sanitizer report or an escaped
// exception names the input that caused it. Paths that do not exist are skipped, but at least
// one input must be found.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz_util.h"

#if defined(__SANITIZE_ADDRESS__)
#define TESSERA_REPLAY_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TESSERA_REPLAY_SANITIZED 1
#endif
#endif
#ifdef TESSERA_REPLAY_SANITIZED
#include <sanitizer/common_interface_defs.h>
#endif

namespace {

namespace fs = std::filesystem;

// The input being run, for the crash report (read by signal handlers: a plain C string).
const char* g_current = nullptr;

void say_current() {
  if (g_current == nullptr) return;
  const char prefix[] = "\nreplay: the input that failed: ";
  ssize_t ignored = ::write(2, prefix, sizeof prefix - 1);
  ignored = ::write(2, g_current, std::strlen(g_current));
  ignored = ::write(2, "\n", 1);
  (void)ignored;
}

void on_fatal_signal(int sig) {
  say_current();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void install_crash_reporting() {
  // Under AddressSanitizer its own handlers report the crash; the death callback adds the name.
#ifdef TESSERA_REPLAY_SANITIZED
  __sanitizer_set_death_callback(say_current);
#else
  // On an alternate stack, so that a stack overflow (deep recursion) is reported too.
  static char alt_stack[1 << 16];
  stack_t ss{};
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof alt_stack;
  ::sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_handler = on_fatal_signal;
  sa.sa_flags = SA_ONSTACK | SA_RESETHAND;
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) ::sigaction(sig, &sa, nullptr);
#endif
  ::signal(SIGABRT, on_fatal_signal);  // abort(): a failed property or std::terminate
}

// Adds the file, or the files under the directory; a path that does not exist adds nothing (a
// target without regressions has no regressions/<target>/ directory).
bool collect(const fs::path& p, std::vector<fs::path>& out) {
  std::error_code ec;
  if (!fs::exists(p, ec)) return true;
  if (fs::is_regular_file(p, ec)) {
    out.push_back(p);
    return true;
  }
  if (!fs::is_directory(p, ec)) return false;
  for (fs::recursive_directory_iterator it(p, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec)) out.push_back(it->path());
  }
  return !ec;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE_OR_DIRECTORY...\n", argv[0]);
    return 2;
  }
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    if (!collect(argv[i], inputs)) {
      std::fprintf(stderr, "replay: %s is neither a file nor a readable directory\n", argv[i]);
      return 2;
    }
  }
  std::sort(inputs.begin(), inputs.end());
  if (inputs.empty()) {
    std::fprintf(stderr, "replay: no inputs found\n");
    return 2;
  }
  install_crash_reporting();
  const auto start = std::chrono::steady_clock::now();
  for (const fs::path& p : inputs) {
    std::ifstream f(p, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (!f.good() && !f.eof()) {
      std::fprintf(stderr, "replay: cannot read %s\n", p.c_str());
      return 2;
    }
    const std::string name = p.string();
    g_current = name.c_str();
    try {
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "replay: %s: an exception escaped the target: %s\n", name.c_str(),
                   e.what());
      return 1;
    } catch (...) {
      std::fprintf(stderr, "replay: %s: a non-standard exception escaped the target\n",
                   name.c_str());
      return 1;
    }
    g_current = nullptr;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("replay: %zu inputs passed in %.2f s\n", inputs.size(), s);
  return 0;
}
