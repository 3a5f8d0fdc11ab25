// `tessera bench-comm`: an nccl-tests style table of collective timings on either backend.
#include <algorithm>
#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "tessera/comm/bench.h"
#include "tessera/comm/launch.h"

namespace tessera::app {

namespace {
DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::F32;
  if (s == "f64") return DType::F64;
  if (s == "bf16") return DType::BF16;
  if (s == "i32") return DType::I32;
  if (s == "i64") return DType::I64;
  throw ConfigError("--dtype must be f32, f64, bf16, i32 or i64, not '" + s + "'");
}
comm::Algorithm parse_algorithm(const std::string& s) {
  if (s == "auto") return comm::Algorithm::Auto;
  if (s == "small") return comm::Algorithm::Small;
  if (s == "direct") return comm::Algorithm::Direct;
  if (s == "ring") return comm::Algorithm::Ring;
  throw ConfigError("--algorithm must be auto, small, direct or ring, not '" + s + "'");
}
}  // namespace

void register_bench_comm(CLI::App& root, int& exit_code) {
  struct Args {
    int ranks = 2;
    std::string backend = "auto";
    std::string ops = "all";
    size_t min_bytes = 4;
    size_t max_bytes = size_t{256} << 20;
    int iters = 20;
    int min_iters = 5;
    int warmup = 5;
    std::string dtype = "f32";
    std::string algorithm = "auto";
    double timeout_s = 300;
    bool membw = true;
    int ranks_per_process = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = root.add_subcommand(
      "bench-comm",
      "Time collectives (nccl-tests style): bytes, elements, median time, algbw, busbw.\n"
      "busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for all_gather, reduce_scatter,\n"
      "all_to_all and all_to_allv, x 1 for broadcast and send_recv. send_recv is a ping-pong\n"
      "between ranks 0 and 1 whose time is one way (half the round trip); all_to_allv splits\n"
      "each rank's bytes over the ranks unevenly (fixed pseudo-random weights). Every size is\n"
      "checked for correctness before it is timed.\n"
      "Inproc: `tessera bench-comm --ranks 4` (ranks are threads). MPI: `mpirun -np 4 tessera\n"
      "bench-comm` (the MPI backend is chosen automatically under mpirun). Several ranks per\n"
      "process (the hierarchical backend): `mpirun -np 2 tessera bench-comm --ranks-per-process "
      "2`.");
  cmd->add_option("--ranks", a->ranks, "Number of ranks (threads) for the inproc backend")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--backend", a->backend, "auto (mpi under mpirun, else inproc), inproc or mpi")
      ->check(CLI::IsMember({"auto", "inproc", "mpi"}))
      ->capture_default_str();
  cmd->add_option("--ops", a->ops,
                  "all, or a comma-separated list of all_reduce, all_gather, reduce_scatter, "
                  "broadcast, all_to_all, all_to_allv, send_recv")
      ->capture_default_str();
  cmd->add_option("--min-bytes", a->min_bytes, "Smallest message (e.g. 4, 1KiB)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  cmd->add_option("--max-bytes", a->max_bytes, "Largest message (e.g. 256MiB); sizes double")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  cmd->add_option("--iters", a->iters,
                  "Timed iterations per size up to 1 MiB (proportionally fewer above)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--min-iters", a->min_iters, "Timed iterations at the largest sizes")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--warmup", a->warmup, "Untimed iterations per size")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  cmd->add_option("--dtype", a->dtype, "f32, f64, bf16, i32 or i64")->capture_default_str();
  cmd->add_option("--algorithm", a->algorithm, "all_reduce algorithm: auto, small, direct, ring")
      ->capture_default_str();
  cmd->add_option("--timeout-s", a->timeout_s, "Per-call timeout in seconds")
      ->capture_default_str();
  cmd->add_flag("!--no-membw", a->membw, "Skip the memory-bandwidth measurement");
  cmd->add_option("--ranks-per-process", a->ranks_per_process,
                  "Under mpirun: this many thread ranks in each process, on the hierarchical "
                  "backend (in memory inside a process, MPI between processes); 0: one rank per "
                  "process on the MPI backend")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  cmd->callback([a, &exit_code] {
    comm::BenchOptions o;
    o.ops = comm::parse_bench_ops(a->ops);
    o.min_bytes = a->min_bytes;
    o.max_bytes = a->max_bytes;
    o.iters = a->iters;
    o.min_iters = std::min(a->min_iters, a->iters);
    o.warmup = a->warmup;
    o.dtype = parse_dtype(a->dtype);
    o.algorithm = parse_algorithm(a->algorithm);
    comm::CommOptions co;
    co.timeout = comm::Timeout(static_cast<int64_t>(a->timeout_s * 1000));
    const comm::Backend b = comm::resolve_backend(comm::parse_backend(a->backend));
    if (a->membw && b == comm::Backend::Inproc) {
      std::cout << "# memory bandwidth (memcpy of 256 MiB, bytes copied per second): 1 thread "
                << comm::measure_memcpy_gbs() << " GB/s, " << a->ranks << " threads "
                << comm::measure_memcpy_gbs_threads(a->ranks) << " GB/s\n";
    }
    bool ok = true;
    auto bench = [&](comm::Communicator& c) {
      auto rows = comm::bench_collectives(c, o, c.rank() == 0 ? &std::cout : nullptr);
      if (c.rank() == 0)
        for (auto& r : rows) ok = ok && r.ok;
    };
    if (a->ranks_per_process > 0) {
      TESSERA_CHECK_AS(ConfigError, b == comm::Backend::Mpi,
                       "--ranks-per-process applies under mpirun (without it --ranks sets the "
                       "number of thread ranks)");
      comm::run_hierarchical(a->ranks_per_process, bench, co);
    } else {
      comm::run_ranks(b, a->ranks, bench, co);
    }
    if (!ok) std::cerr << "tessera bench-comm: some results were wrong (see the check column)\n";
    exit_code = ok ? 0 : 1;
  });
}

}  // namespace tessera::app
