// Backend factory: the only file that knows whether the MPI backend was compiled in.
#include "tessera/comm/launch.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "tessera/comm/inproc/world.h"

#ifdef TESSERA_HAVE_MPI
#include "tessera/comm/mpi/hier_comm.h"
#include "tessera/comm/mpi/mpi_comm.h"
#endif

namespace tessera::comm {

std::unique_ptr<Communicator> one_rank(const CommOptions& opts) {
  CommOptions o = opts;
  if (o.name.empty() || o.name == CommOptions{}.name) o.name = "one rank";
  return InprocWorld::create(1, o)->communicator(0);
}

std::vector<std::exception_ptr> run_inproc_each(int world_size,
                                                const std::function<void(Communicator&)>& fn,
                                                const CommOptions& opts) {
  auto world = InprocWorld::create(world_size, opts);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < world_size; ++r) comms.push_back(world->communicator(r));
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(*comms[r]);
        comms[r].reset();  // finishes queued asynchronous work first
      } catch (const InjectedExit&) {
        errors[r] = std::current_exception();  // the rank left: marked exited, not failed
      } catch (const std::exception& e) {
        errors[r] = std::current_exception();
        world->fail(r, e.what());
      } catch (...) {
        errors[r] = std::current_exception();
        world->fail(r, "unknown exception");
      }
      world->exited(r);
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

namespace {

// The error to report of the ranks' `errors`, `when[r]` the order in which rank r failed: a
// PeerFailedError is usually the consequence of another rank's failure, so the first error of any
// other type is the cause, if there is one; else the first in time.
void rethrow_first(const std::vector<std::exception_ptr>& errors, const std::vector<int>& when) {
  auto is_consequence = [](const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const PeerFailedError&) {
      return true;
    } catch (...) {
      return false;
    }
  };
  int first = -1;
  for (int r = 0; r < static_cast<int>(errors.size()); ++r) {
    if (!errors[r]) continue;
    const bool better =
        first < 0 || (is_consequence(errors[first]) && !is_consequence(errors[r])) ||
        (is_consequence(errors[first]) == is_consequence(errors[r]) && when[r] < when[first]);
    if (better) first = r;
  }
  if (first >= 0) std::rethrow_exception(errors[first]);
}

}  // namespace

void run_inproc(int world_size, const std::function<void(Communicator&)>& fn,
                const CommOptions& opts) {
  // Order errors by time: the first failure is usually the cause, the others its consequences.
  std::atomic<int> clock{0};
  std::vector<int> when(world_size, -1);
  auto errors = run_inproc_each(
      world_size,
      [&](Communicator& c) {
        try {
          fn(c);
        } catch (...) {
          when[c.rank()] = clock.fetch_add(1);
          throw;
        }
      },
      opts);
  rethrow_first(errors, when);
}

void run_hierarchical(int ranks_per_process, const std::function<void(Communicator&)>& fn,
                      const CommOptions& opts) {
#ifdef TESSERA_HAVE_MPI
  auto world = mpi::make_hier_world(ranks_per_process, resolve_options(opts));
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int t = 0; t < ranks_per_process; ++t) comms.push_back(mpi::hier_communicator(world, t));
  std::atomic<int> clock{0};
  std::vector<int> when(ranks_per_process, -1);
  std::vector<std::exception_ptr> errors(ranks_per_process);
  std::vector<std::thread> threads;
  for (int t = 0; t < ranks_per_process; ++t)
    threads.emplace_back([&, t] {
      try {
        fn(*comms[t]);
        comms[t].reset();  // finishes queued asynchronous work first
      } catch (const std::exception& e) {
        errors[t] = std::current_exception();
        when[t] = clock.fetch_add(1);
        mpi::hier_fail(*world, e.what());
      } catch (...) {
        errors[t] = std::current_exception();
        when[t] = clock.fetch_add(1);
        mpi::hier_fail(*world, "unknown exception");
      }
    });
  for (auto& th : threads) th.join();
  comms.clear();
  rethrow_first(errors, when);
#else
  (void)ranks_per_process;
  (void)fn;
  (void)opts;
  throw CommError(
      "several ranks per process need the MPI backend: tessera was built without MPI (install "
      "libopenmpi-dev and reconfigure with -DTESSERA_MPI=ON)");
#endif
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

bool mpi_available() {
#ifdef TESSERA_HAVE_MPI
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Communicator> mpi_world(const CommOptions& opts) {
#ifdef TESSERA_HAVE_MPI
  return mpi::make_world(resolve_options(opts));
#else
  (void)opts;
  throw CommError(
      "the MPI backend is not available: tessera was built without MPI (install libopenmpi-dev "
      "and reconfigure with -DTESSERA_MPI=ON)");
#endif
}

Backend parse_backend(std::string_view s) {
  if (s == "auto") return Backend::Auto;
  if (s == "inproc") return Backend::Inproc;
  if (s == "mpi") return Backend::Mpi;
  throw ConfigError(detail::concat("unknown backend '", s, "' (expected auto, inproc or mpi)"));
}

Backend resolve_backend(Backend b) {
  if (b == Backend::Auto)
    return launched_by_mpi() && mpi_available() ? Backend::Mpi : Backend::Inproc;
  if (b == Backend::Mpi && !mpi_available())
    throw CommError("--backend mpi: tessera was built without MPI");
  return b;
}

void run_ranks(Backend b, int inproc_ranks, const std::function<void(Communicator&)>& fn,
               const CommOptions& opts) {
  if (resolve_backend(b) == Backend::Mpi) {
    auto comm = mpi_world(opts);
    fn(*comm);
    return;
  }
  run_inproc(inproc_ranks, fn, opts);
}

}  // namespace tessera::comm
