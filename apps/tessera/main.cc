// The `tessera` command: train, eval, sample, bench-comm, schedule, plot, plan, doctor.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "tessera/comm/errors.h"
#include "tessera/comm/launch.h"
#include "tessera/core/error.h"
#include "tessera/kernels/blas_setup.h"
#include "tessera/train/attempt_report.h"
#include "tessera/train/train_config.h"

namespace tessera::app {
namespace {
const char* program = "tessera";
std::vector<std::string> arguments;
}  // namespace
const char* program_path() {
  return program;
}
const std::vector<std::string>& command_line() {
  return arguments;
}
}  // namespace tessera::app

namespace {
// A rank whose wait timed out stays this long before it leaves. Under mpirun the first rank out
// has the job ended; the rank it waited for may itself be waiting for the rank that actually
// failed, with a deadline a few milliseconds later, and it is that peer's error (and flight
// recorder dump) that names the failed host. PyTorch's watchdog waits for its peers' dumps alike.
constexpr std::chrono::milliseconds peer_report_grace{1000};

// Under mpirun a failed process leaves without MPI_Finalize, which would wait for peers that
// may be gone or stuck: mpirun sees the status and ends the job (docs/COMM.md).
int leave(int status, bool timed_out = false) {
  if (tessera::comm::launched_by_mpi()) {
    std::fflush(nullptr);
    if (timed_out) std::this_thread::sleep_for(peer_report_grace);
    std::_Exit(status);
  }
  return status;
}
// The kind of error, as a supervisor's report names it (train/attempt_report.h).
const char* kind_of(const tessera::Error& e) {
  if (dynamic_cast<const tessera::IoError*>(&e)) return "io";
  if (dynamic_cast<const tessera::comm::CommError*>(&e)) return "comm";
  return "other";
}
}  // namespace

int main(int argc, char** argv) {
  if (argc > 0) tessera::app::program = argv[0];
  tessera::app::arguments.assign(argv, argv + argc);
  tessera::kernels::use_fast_blas_kernels(argv);
  CLI::App root{"tessera: train transformer language models on many devices"};
  root.require_subcommand(1);
  root.set_version_flag("--version", "tessera " TESSERA_VERSION_STRING);
  int exit_code = 0;
  tessera::app::register_train(root, exit_code);
  tessera::app::register_eval(root, exit_code);
  tessera::app::register_sample(root, exit_code);
  tessera::app::register_bench_comm(root, exit_code);
  tessera::app::register_schedule(root, exit_code);
  tessera::app::register_plot(root, exit_code);
  tessera::app::register_plan(root, exit_code);
  tessera::app::register_doctor(root, exit_code);
  try {
    root.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return root.exit(e);
  } catch (const tessera::ConfigError& e) {
    // Configuration keys as the flags that set them ("micro_batch" -> "--micro-batch").
    const std::string text = e.render(tessera::train::flag_of);
    std::fprintf(stderr, "tessera: error: %s\n", text.c_str());
    tessera::train::report_process_error("config", text);  // for a supervisor, if any
    return leave(1);
  } catch (const tessera::InternalError& e) {
    std::fprintf(stderr, "tessera: %s\n", e.what());  // "internal error at file:line: ..."
    tessera::train::report_process_error("internal", e.what());
    return leave(2);
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "tessera: error: %s\n", e.what());
    tessera::train::report_process_error(kind_of(e), e.what());
    return leave(1, dynamic_cast<const tessera::comm::TimeoutError*>(&e) != nullptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera: internal error: %s\n", e.what());
    tessera::train::report_process_error("internal", e.what());
    return leave(2);
  }
  return exit_code;
}
