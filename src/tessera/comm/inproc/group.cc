#include "tessera/comm/inproc/group.h"

#include <thread>

#include "tessera/comm/errors.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TESSERA_CPU_RELAX() _mm_pause()
#else
#define TESSERA_CPU_RELAX() ((void)0)
#endif

namespace tessera::comm::inproc {

void WorldState::poison(const std::string& why) {
  {
    std::lock_guard lk(mu);
    if (poisoned.load()) return;
    reason = why;
    poisoned.store(true, std::memory_order_seq_cst);
  }
}

std::string WorldState::poison_reason() const {
  std::lock_guard lk(mu);
  return reason;
}

Group::Group(std::shared_ptr<WorldState> w, std::vector<int> ranks, std::string name)
    : world(std::move(w)), n(static_cast<int>(ranks.size())), world_ranks(std::move(ranks)) {
  opts = world->opts;
  opts.name = std::move(name);
  staging_bytes = (opts.small_max_bytes + 63) / 64 * 64;
  arrived = std::make_unique<Counter[]>(n);
  step = std::make_unique<Counter[]>(n);
  done = std::make_unique<Counter[]>(n);
  slots.resize(static_cast<size_t>(n) * 2);
  staging_mem = std::make_unique<unsigned char[]>(slots.size() * staging_bytes + 64);
  auto base = reinterpret_cast<uintptr_t>(staging_mem.get());
  auto* aligned = reinterpret_cast<unsigned char*>((base + 63) / 64 * 64);
  for (size_t i = 0; i < slots.size(); ++i) slots[i].staging = aligned + i * staging_bytes;
  mail = std::make_unique<Mailbox[]>(n);
}

void Mailbox::idle(std::unique_lock<std::mutex>& lk, int iter,
                   std::chrono::steady_clock::time_point deadline, bool oversubscribed) {
  if (iter < 200) {
    const uint64_t v = version.load(std::memory_order_acquire);
    lk.unlock();
    if (iter == 0) {
      const int spins = oversubscribed ? 64 : 20000;
      for (int i = 0; i < spins && version.load(std::memory_order_acquire) == v; ++i)
        TESSERA_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
    lk.lock();
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  if (now < deadline)
    cv.wait_for(lk, std::min<std::chrono::steady_clock::duration>(std::chrono::milliseconds(2),
                                                                  deadline - now));
}

std::string WaitCtx::describe() const {
  return desc ? detail::op_context(*desc, g->opts.name, rank, g->n)
              : detail::op_context(what, g->opts.name, rank, g->n);
}

static std::string rank_list(const std::vector<int>& r) {
  std::string s = r.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < r.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(r[i]);
  }
  return s;
}

void wait_counters(const WaitCtx& ctx, const Counter* c, uint64_t target, int only,
                   std::string_view phase) {
  Group& g = *ctx.g;
  const WorldState& w = *g.world;
  const int lo = only >= 0 ? only : 0;
  const int hi = only >= 0 ? only + 1 : g.n;
  int first_missing = lo;
  auto ready = [&]() {
    for (int p = first_missing; p < hi; ++p) {
      if (c[p].v.load(std::memory_order_acquire) < target) {
        first_missing = p;
        return false;
      }
    }
    first_missing = hi;
    return true;
  };
  // A peer that returned from its function will never arrive.
  auto peer_left = [&]() {
    for (int p = first_missing; p < hi; ++p) {
      if (w.exited[g.world_ranks[p]].load(std::memory_order_acquire) &&
          c[p].v.load(std::memory_order_acquire) < target)
        throw PeerFailedError(detail::concat(ctx.describe(), ": rank ", p, " (world rank ",
                                             g.world_ranks[p],
                                             ") returned from its function "
                                             "without completing this call"));
    }
    return false;
  };
  auto missing = [&]() {
    std::vector<int> m;
    for (int p = lo; p < hi; ++p)
      if (c[p].v.load(std::memory_order_acquire) < target) m.push_back(p);
    return m.empty() ? std::string() : detail::concat(rank_list(m), " ", phase);
  };
  // Spin (fewer pauses when there are more ranks than cores), then yield 200 times, then sleep.
  auto idle = [&](int iter) {
    if (iter == 0) {
      const int spins = w.oversubscribed ? 64 : 20000;
      for (int i = 0; i < spins && !ready(); ++i) TESSERA_CPU_RELAX();
      return;
    }
    if (iter <= 200) {
      std::this_thread::yield();
      return;
    }
    g.sleepers.fetch_add(1, std::memory_order_seq_cst);
    {
      std::unique_lock lk(g.mu);
      bool ok = true;
      for (int p = first_missing; p < hi; ++p)
        if (c[p].v.load(std::memory_order_seq_cst) < target) ok = false;
      const auto now = std::chrono::steady_clock::now();
      if (!ok && now < ctx.deadline)
        g.cv.wait_for(lk, std::min<std::chrono::steady_clock::duration>(
                              std::chrono::milliseconds(2), ctx.deadline - now));
    }
    g.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  };
  wait_until(ctx, ready, peer_left, missing, idle);
}

}  // namespace tessera::comm::inproc
