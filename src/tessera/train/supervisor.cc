#include "tessera/train/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "tessera/comm/options.h"
#include "tessera/core/error.h"
#include "tessera/io/checkpoint.h"
#include "tessera/train/attempt_report.h"
#include "tessera/train/stop_request.h"

extern char** environ;

namespace tessera::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

volatile std::sig_atomic_t g_signal = 0;   // the last stop signal the supervisor received
volatile std::sig_atomic_t g_signals = 0;  // how many

extern "C" void on_stop_signal(int signo) {
  g_signal = signo;
  g_signals = g_signals + 1;
}

// SIGINT, SIGTERM and SIGUSR1 are passed on to the attempt instead of ending the supervisor.
class ForwardedSignals {
 public:
  ForwardedSignals() {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; ++i) ::sigaction(kSignals[i], &sa, &old_[i]);
  }
  ~ForwardedSignals() {
    for (int i = 0; i < 3; ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
  }
  ForwardedSignals(const ForwardedSignals&) = delete;
  ForwardedSignals& operator=(const ForwardedSignals&) = delete;

 private:
  static constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGUSR1};
  struct sigaction old_[3];
};

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// This program's path (the same path again after a rebuild replaced the file).
std::string this_executable() {
  std::error_code ec;
  std::string p = fs::read_symlink("/proc/self/exe", ec).string();
  if (ec) return "/proc/self/exe";
  constexpr std::string_view deleted = " (deleted)";
  if (p.ends_with(deleted)) p.resize(p.size() - deleted.size());
  return p;
}

// A fresh directory for the supervisor's files (attempt reports and heartbeats).
std::string make_work_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      (tmp && *tmp ? std::string(tmp) : std::string("/tmp")) + "/tessera-supervisor-XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr)
    throw IoError(detail::concat("cannot create the supervisor's directory ", pattern, ": ",
                                 std::strerror(errno)));
  return std::string(buf.data());
}

// The environment of an attempt: this process's, with the supervisor's variables replaced.
std::vector<std::string> attempt_environment(const std::map<std::string, std::string>& set) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view entry(*e);
    const std::string name(entry.substr(0, entry.find('=')));
    if (!set.contains(name)) env.emplace_back(entry);
  }
  for (const auto& [k, v] : set) env.push_back(k + "=" + v);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (std::string& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Starts `argv` with `env` in a process group of its own (so that a terminal's Ctrl-C reaches only
// the supervisor, which passes it on once). Returns its pid.
pid_t spawn(std::vector<std::string> argv, std::vector<std::string> env) {
  std::vector<char*> a = c_strings(argv), e = c_strings(env);
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(detail::concat("cannot start an attempt: fork: ", std::strerror(errno)));
  if (pid == 0) {
    ::setpgid(0, 0);
    for (int s : {SIGINT, SIGTERM, SIGUSR1}) ::signal(s, SIG_DFL);
    ::execve(a[0], a.data(), e.data());
    const char* why = std::strerror(errno);
    [[maybe_unused]] ssize_t n = ::write(2, "tessera: cannot start an attempt: ", 34);
    n = ::write(2, a[0], std::strlen(a[0]));
    n = ::write(2, ": ", 2);
    n = ::write(2, why, std::strlen(why));
    n = ::write(2, "\n", 1);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also in the parent: no race with the first kill()
  return pid;
}

// What rank 0 last reported in `path`: the step the attempt started from and the step it is at
// ({-1, -1} when nothing yet).
std::pair<int64_t, int64_t> read_heartbeat(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {-1, -1};
  char buf[96] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  ::close(fd);
  long long start = -1, step = -1;
  if (n <= 0 || std::sscanf(buf, "start %lld step %lld", &start, &step) != 2) return {-1, -1};
  return {start, step};
}

struct Attempt {
  int status = 0;           // as a shell reports it: the exit code, or 128 + the signal
  bool hung = false;        // ended by the supervisor for making no progress
  int forwarded = 0;        // the stop signal passed on to it (0: none)
  int64_t start_step = -1;  // the step it started from (-1: it never started training)
  int64_t last_step = -1;   // the last step it reported
};

std::string status_text(int status) {
  if (status > 128 && status < 128 + 65)
    if (const char* name = ::sigabbrev_np(status - 128))
      return detail::concat("killed by SIG", name);
  return detail::concat("exit status ", status);
}

std::string first_line(const std::string& s) {
  return s.substr(0, s.find('\n'));
}

std::string latest_checkpoint_name(const std::string& save) {
  if (save.empty()) return "";
  std::error_code ec;
  if (!fs::exists(fs::path(save) / io::kLatestFile, ec)) return "";
  std::optional<fs::path> latest = io::find_latest_checkpoint(save);
  return latest ? latest->filename().string() : "";
}

// Waits for the attempt, passing stop signals on and ending it when it reports no progress for
// `hang` seconds.
Attempt watch(pid_t pid, int attempt, const std::string& heartbeat, double hang, bool under_mpirun,
              std::optional<Clock::time_point> failed_at, std::FILE* log) {
  Attempt a;
  auto last_progress = Clock::now();
  // Reads the heartbeat; says when the attempt trains its first step after a failure.
  auto observe = [&](Clock::time_point now) {
    const auto [start, step] = read_heartbeat(heartbeat);
    if (step == a.last_step) return;
    if (a.start_step < 0 && step >= 0) {
      a.start_step = start;
      if (failed_at) {
        std::fprintf(log,
                     "tessera: attempt %d is training again %.1f s after the failure (from "
                     "step %lld)\n",
                     attempt, seconds_between(*failed_at, now), static_cast<long long>(start));
        std::fflush(log);
      }
    }
    a.last_step = step;
    last_progress = now;
  };
  int seen_signals = g_signals;
  Clock::time_point kill_at = Clock::time_point::max();  // SIGKILL then, after a SIGTERM
  for (;;) {
    int st = 0;
    const pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) {
      // The steps it took since the last poll (an attempt can train and end within one).
      observe(Clock::now());
      a.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      return a;
    }
    if (r < 0 && errno != EINTR) {
      a.status = 1;
      return a;
    }
    const auto now = Clock::now();
    if (g_signals != seen_signals) {  // pass each stop signal on once
      seen_signals = g_signals;
      a.forwarded = g_signal;
      // Open MPI passes SIGUSR1 on to every rank at once (stop_request.h).
      ::kill(-pid, under_mpirun ? SIGUSR1 : a.forwarded);
      if (g_signals >= 2) ::kill(-pid, SIGKILL);  // a second signal ends it at once, as without
    }
    observe(now);
    if (!a.hung && a.forwarded == 0 && seconds_between(last_progress, now) > hang) {
      std::fprintf(log,
                   "tessera: the attempt reported no step for %.0f s (--hang-timeout; last "
                   "step %lld): ending it\n",
                   hang, static_cast<long long>(a.last_step));
      std::fflush(log);
      a.hung = true;
      ::kill(-pid, SIGTERM);
      kill_at = now + std::chrono::seconds(10);
    }
    if (now >= kill_at) {
      ::kill(-pid, SIGKILL);
      kill_at = Clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

double default_hang_timeout(const TrainConfig& cfg) {
  comm::CommOptions o;
  if (cfg.comm_timeout > 0)
    o.timeout = comm::Timeout(static_cast<int64_t>(cfg.comm_timeout * 1000.0));
  const double comm_s = std::chrono::duration<double>(comm::resolve_options(o).timeout).count();
  return cfg.io_timeout + 2 * comm_s;
}

// `name` as an executable path: itself when it holds a '/', else the first match on PATH ("" when
// there is none).
std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  std::istringstream dirs(std::getenv("PATH") ? std::getenv("PATH") : "");
  for (std::string d; std::getline(dirs, d, ':');)
    if (::access((d + "/" + name).c_str(), X_OK) == 0) return d + "/" + name;
  return "";
}

std::vector<std::string> split_words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

}  // namespace

bool supervised() {
  const char* s = std::getenv("TESSERA_SUPERVISED");
  return s != nullptr && std::string(s) == "1";
}

int shrunk_dp(const TrainConfig& cfg, int lost) {
  for (int d = cfg.dp - lost; d >= std::max(1, cfg.min_dp); --d) {
    TrainConfig c = cfg;
    c.dp = d;
    try {
      c.validate();
      return d;
    } catch (const ConfigError&) {
    }
  }
  return 0;
}

int supervise(const TrainConfig& cfg, const std::vector<std::string>& command, std::FILE* log) {
  TESSERA_CHECK(!command.empty(), "supervise needs a command line");
  const double hang = cfg.hang_timeout > 0 ? cfg.hang_timeout : default_hang_timeout(cfg);
  // What starts an attempt, resolved once: execve does not search PATH, and a launcher that is
  // not there is a configuration error before any attempt.
  const std::string program = this_executable();
  std::vector<std::string> launcher = split_words(cfg.mpirun);
  const bool under_mpirun = !launcher.empty();
  if (under_mpirun) {
    launcher[0] = find_program(launcher[0]);
    TESSERA_CHECK_AS(ConfigError, !launcher[0].empty(), config_key("mpirun"), " '", cfg.mpirun,
                     "': '", split_words(cfg.mpirun)[0], "' is not a program on PATH");
  }
  const std::string work = make_work_dir();
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{work};
  ForwardedSignals signals;
  if (cfg.save.empty())
    std::fprintf(log,
                 "tessera: warning: --max-restarts without --save: each restart starts from "
                 "step 0\n");
  std::fprintf(log,
               "tessera: supervising the run: up to %d restart%s from the newest checkpoint%s%s\n",
               cfg.max_restarts, cfg.max_restarts == 1 ? "" : "s", cfg.save.empty() ? "" : " in ",
               cfg.save.c_str());
  std::fflush(log);

  TrainConfig current = cfg;         // its dp shrinks when replicas are dropped
  std::map<int, int> exited_streak;  // world rank -> attempts in a row in which it left
  std::optional<Clock::time_point> failed_at;
  int restarts = 0;
  int stalled = 0;  // failed attempts in a row that trained no step
  for (int attempt = 0;; ++attempt) {
    const std::string reports = detail::concat(work, "/attempt-", attempt);
    const std::string heartbeat = reports + ".heartbeat";
    fs::create_directories(reports);
    // [mpirun OPTIONS -np N -x VAR...] tessera train FLAGS [--dp D] [--resume DIR]
    std::vector<std::string> argv = launcher;
    if (under_mpirun) {
      // With --ranks-per-process R each process runs R ranks.
      const int processes = current.world() / std::max(1, current.ranks_per_process);
      argv.insert(argv.end(), {"-np", std::to_string(processes)});
      for (const char* v :
           {"TESSERA_SUPERVISED", "TESSERA_ATTEMPT", "TESSERA_HEARTBEAT", "TESSERA_FAILURE_DIR"})
        argv.insert(argv.end(), {"-x", v});
    }
    argv.push_back(program);
    argv.insert(argv.end(), command.begin() + 1, command.end());
    if (current.dp != cfg.dp) argv.insert(argv.end(), {"--dp", std::to_string(current.dp)});
    if (attempt > 0 && !latest_checkpoint_name(cfg.save).empty())
      argv.insert(argv.end(), {"--resume", cfg.save});
    const pid_t pid = spawn(argv, attempt_environment({{"TESSERA_SUPERVISED", "1"},
                                                       {"TESSERA_ATTEMPT", std::to_string(attempt)},
                                                       {"TESSERA_HEARTBEAT", heartbeat},
                                                       {"TESSERA_FAILURE_DIR", reports}}));
    const auto started = Clock::now();
    Attempt a = watch(pid, attempt, heartbeat, hang, under_mpirun, failed_at, log);
    const auto ended = Clock::now();
    if (a.status == 0) {
      if (restarts > 0)
        std::fprintf(log, "tessera: the run finished after %d restart%s\n", restarts,
                     restarts == 1 ? "" : "s");
      std::fflush(log);
      return 0;
    }
    // A stop by signal, the supervisor's or one sent to the attempt itself: not a failure.
    const bool stopped = a.forwarded != 0 || a.status == 128 + SIGINT ||
                         a.status == 128 + SIGTERM || a.status == 128 + SIGUSR1;
    if (stopped && !a.hung) {
      std::fflush(log);
      return a.status;
    }
    const AttemptFailure failure = read_attempt_failure(reports);
    const std::string where = a.last_step < 0 ? std::string("before its first step")
                                              : detail::concat("at step ", a.last_step);
    std::fprintf(log, "tessera: attempt %d failed %s after %.1f s (%s)%s%s\n", attempt,
                 where.c_str(), seconds_between(started, ended), status_text(a.status).c_str(),
                 failure.message.empty() ? "" : ": ", first_line(failure.message).c_str());
    if (failure.config_error()) {
      std::fprintf(log, "tessera: not restarting: a configuration error fails again\n");
      std::fflush(log);
      return a.status;
    }
    if (restarts >= cfg.max_restarts) {
      std::fprintf(log, "tessera: giving up after %d restart%s (--max-restarts %d)\n", restarts,
                   restarts == 1 ? "" : "s", cfg.max_restarts);
      std::fflush(log);
      return a.status;
    }
    failed_at = ended;
    // Ranks that left in this attempt and the one before are taken as lost for good: their
    // replicas are dropped when --min-dp allows.
    std::set<int> lost_replicas;
    std::vector<int> lost_ranks;
    for (int r = 0; r < current.world(); ++r) {
      const auto it = failure.fates.find(r);
      const bool exited = it != failure.fates.end() && it->second == RankFate::Exited;
      exited_streak[r] = exited ? exited_streak[r] + 1 : 0;
      if (exited_streak[r] >= 2) {
        lost_ranks.push_back(r);
        lost_replicas.insert((r / (current.cp * current.tp)) % current.dp);
      }
    }
    if (!lost_replicas.empty() && cfg.min_dp > 0) {
      const int lost = static_cast<int>(lost_replicas.size());
      const int d = shrunk_dp(current, lost);
      std::string ranks;
      for (int r : lost_ranks) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      if (d > 0) {
        std::fprintf(log,
                     "tessera: world rank%s %s left in two attempts in a row: dropping %d "
                     "data-parallel replica%s, going on at dp %d (was %d; --batch %d kept, %d "
                     "micro-batch%s of %d per replica)\n",
                     lost_ranks.size() == 1 ? "" : "s", ranks.c_str(), lost, lost == 1 ? "" : "s",
                     d, current.dp, cfg.batch, cfg.batch / (d * cfg.micro_batch),
                     cfg.batch / (d * cfg.micro_batch) == 1 ? "" : "es", cfg.micro_batch);
        current.dp = d;
        exited_streak.clear();
      } else {
        std::fprintf(log,
                     "tessera: world rank%s %s left in two attempts in a row, but no dp from %d "
                     "(--min-dp) to %d fits --batch %d and the layout: restarting as it was\n",
                     lost_ranks.size() == 1 ? "" : "s", ranks.c_str(), cfg.min_dp,
                     current.dp - lost, cfg.batch);
      }
    }
    ++restarts;
    // Back off in a crash loop: an attempt that trained a step is restarted at once; after one
    // that did not, wait 1, 2, 4, ... s (at most 30 s) as such attempts follow each other.
    const bool progressed = a.start_step >= 0 && a.last_step > a.start_step;
    stalled = progressed ? 0 : stalled + 1;
    const int delay = stalled == 0 ? 0 : std::min(30, 1 << std::min(stalled - 1, 5));
    const std::string from = latest_checkpoint_name(cfg.save);
    std::fprintf(log, "tessera: restart %d of %d%s: %s\n", restarts, cfg.max_restarts,
                 delay > 0 ? detail::concat(" in ", delay, " s").c_str() : "",
                 from.empty() ? "from step 0 (no checkpoint yet)"
                              : detail::concat("from ", cfg.save, "/", from).c_str());
    std::fflush(log);
    for (int i = 0; i < delay * 20 && g_signals == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (g_signals != 0) return 128 + g_signal;
  }
}

}  // namespace tessera::train
