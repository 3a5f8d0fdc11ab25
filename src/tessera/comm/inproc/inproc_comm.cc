// The in-process backend: ranks are threads; collectives read peers' buffers in place.
#include <algorithm>
#include <cstdint>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <cstring>
#include <numeric>
#include <thread>

#include "tessera/comm/errors.h"
#include "tessera/comm/inproc/group.h"
#include "tessera/comm/inproc/world.h"
#include "tessera/comm/reduce.h"

namespace tessera::comm {
namespace inproc {
namespace {

using detail::OpDesc;
using detail::OpType;
using Clock = std::chrono::steady_clock;

// Balanced partition of `count` elements into n chunks: chunk c is [begin(c), begin(c+1)).
struct Chunks {
  size_t count;
  int n;
  size_t begin(int c) const { return count / n * c + std::min<size_t>(c, count % n); }
  size_t len(int c) const { return begin(c + 1) - begin(c); }
};

// Values of the per-rank `step` counter inside collective `seq`: seq << 24 plus completed units.
constexpr int kStepShift = 24;
inline uint64_t step_base(uint64_t seq) {
  return seq << kStepShift;
}

class InprocCommunicator final : public Communicator {
 public:
  InprocCommunicator(std::shared_ptr<Group> g, int rank)
      : Communicator(g->opts), g_(std::move(g)), rank_(rank) {}
  ~InprocCommunicator() override { stop_progress_thread(); }

  int rank() const override { return rank_; }
  int size() const override { return g_->n; }
  std::string_view backend() const override { return "inproc"; }
  int world_rank() const override { return g_->world_ranks[rank_]; }

 protected:
  void execute(const OpDesc& d) override;
  std::unique_ptr<Communicator> do_split(int color, int key, const std::string& child_name,
                                         Timeout timeout) override;
  void on_failure(const std::exception_ptr& e) override;
  bool world_failed() const override { return g_->world->poisoned.load(std::memory_order_acquire); }

 private:
  void collective(const OpDesc& d);
  void all_reduce_small(const OpDesc& d);
  void all_reduce_direct(const OpDesc& d, const WaitCtx& ctx);
  void all_reduce_ring(const OpDesc& d, const WaitCtx& ctx);
  void all_gather(const OpDesc& d);
  void reduce_scatter(const OpDesc& d);
  void broadcast(const OpDesc& d);
  void all_to_all(const OpDesc& d);
  void all_to_allv(const OpDesc& d);
  void send(const OpDesc& d);
  void recv(const OpDesc& d);
  void send_recv(const OpDesc& d);
  // Point to point: takes the oldest message from `src` with `tag` out of this rank's mailbox
  // into `dst` (`count` elements of d.dtype, else MismatchError); false when there is none yet.
  // `lk` holds this rank's mailbox lock (released while a lent message is copied).
  bool take(std::unique_lock<std::mutex>& lk, const OpDesc& d, int src, int tag, size_t count,
            void* dst);
  // A rank that stopped waiting for a lent message to be consumed: takes it back out of the
  // destination's mailbox, or waits (bounded) until the receiver that took it has copied it.
  void withdraw(const OpDesc& d, std::atomic<bool>& consumed);
  // After a failure inside collective `seq`: waits (bounded) until every peer that has arrived at
  // `seq` has left it, so no peer still reads this rank's buffers when the error reaches the
  // caller.
  void quiesce(uint64_t seq);
  const SlotData& peer(int p, uint64_t seq) const { return g_->slot(p, seq); }

  std::shared_ptr<Group> g_;
  int rank_;
  std::vector<unsigned char> tmp_;  // in-place all_to_all(v) copy of the input
};

void InprocCommunicator::on_failure(const std::exception_ptr& e) {
  g_->world->poison(detail::concat("rank ", rank_, " of communicator '", name(), "' (world rank ",
                                   g_->world_ranks[rank_], ") failed: ", what_of(e)));
}

void InprocCommunicator::execute(const OpDesc& d) {
  if (g_->world->poisoned.load(std::memory_order_acquire))  // entering a poisoned world
    throw PeerFailedError(where(d) + " not run: " + g_->world->poison_reason());
  if (d.type == OpType::Send) return send(d);
  if (d.type == OpType::Recv) return recv(d);
  if (d.type == OpType::SendRecv) return send_recv(d);
  try {
    collective(d);
  } catch (...) {
    on_failure(std::current_exception());
    g_->publish(g_->done[rank_], d.seq);
    quiesce(d.seq);
    throw;
  }
}

void InprocCommunicator::quiesce(uint64_t seq) {
  auto until = Clock::now() + std::chrono::seconds(10);
  for (int p = 0; p < g_->n; ++p) {
    while (g_->arrived[p].v.load(std::memory_order_acquire) >= seq &&
           g_->done[p].v.load(std::memory_order_acquire) < seq && Clock::now() < until)
      std::this_thread::yield();
  }
}

void InprocCommunicator::collective(const OpDesc& d) {
  Group& g = *g_;
  const uint64_t s = d.seq;
  WaitCtx ctx{&g, rank_, &d, {}, Clock::now() + d.timeout};
  SlotData& me = g.slot(rank_, s);
  me.fp = detail::fingerprint_of(d);
  me.send = d.send;
  me.recv = d.recv;
  me.send_counts = d.send_counts.data();
  me.recv_counts = d.recv_counts.data();
  me.algo = -1;
  const size_t bytes = d.count * dtype_size(d.dtype);

  Algorithm algo = d.algorithm;
  if (d.type == OpType::AllReduce) {
    if (algo == Algorithm::Auto)
      algo = bytes <= g.staging_bytes
                 ? Algorithm::Small
                 : (g.n <= g.opts.direct_max_ranks ? Algorithm::Direct : Algorithm::Ring);
    if (algo == Algorithm::Small && bytes > g.staging_bytes) algo = Algorithm::Direct;
    if (algo == Algorithm::Small && bytes) std::memcpy(me.staging, d.send, bytes);
    me.algo = static_cast<int>(algo);
  }
  if ((d.type == OpType::AllToAll || d.type == OpType::AllToAllV) && d.send == d.recv &&
      d.count > 0) {
    const size_t in_bytes =
        d.count * dtype_size(d.dtype) * (d.type == OpType::AllToAll ? static_cast<size_t>(g.n) : 1);
    tmp_.resize(in_bytes);
    std::memcpy(tmp_.data(), d.send, in_bytes);
    me.send = tmp_.data();
  }

  g.publish(g.arrived[rank_], s);
  wait_counters(ctx, g.arrived.get(), s);

  std::vector<detail::Fingerprint> fps(g.n);
  for (int p = 0; p < g.n; ++p) fps[p] = peer(p, s).fp;
  detail::check_fingerprints(fps, g.opts.name, rank_);
  for (int p = 0; p < g.n; ++p)
    if (peer(p, s).algo != me.algo)
      throw MismatchError(detail::concat(where(d), ": ranks chose different algorithms (rank ", p,
                                         ": ",
                                         algorithm_name(static_cast<Algorithm>(peer(p, s).algo)),
                                         ", rank ", rank_, ": ", algorithm_name(algo), ")"));

  bool zero_copy = true;
  switch (d.type) {
    case OpType::AllReduce:
      if (algo == Algorithm::Small) {
        all_reduce_small(d);
        zero_copy = false;
      } else if (algo == Algorithm::Ring) {
        all_reduce_ring(d, ctx);
      } else {
        all_reduce_direct(d, ctx);
      }
      break;
    case OpType::AllGather:
      all_gather(d);
      break;
    case OpType::ReduceScatter:
      reduce_scatter(d);
      break;
    case OpType::Broadcast:
      broadcast(d);
      break;
    case OpType::AllToAll:
      all_to_all(d);
      break;
    case OpType::AllToAllV:
      all_to_allv(d);
      break;
    case OpType::Barrier:
      zero_copy = false;
      break;
    default:
      throw CommUsageError("unexpected op");
  }
  g.publish(g.done[rank_], s);
  // Zero-copy ops: peers may still read this rank's buffers until they are done.
  if (zero_copy) wait_counters(ctx, g.done.get(), s, -1, "to finish reading this rank's buffers");
}

void InprocCommunicator::all_reduce_small(const OpDesc& d) {
  const int n = g_->n;
  std::vector<const void*> srcs(n);
  for (int p = 0; p < n; ++p) srcs[p] = peer(p, d.seq).staging;
  detail::reduce_n(d.recv, srcs.data(), n, d.count, d.dtype, d.op, n);
}

namespace {
// Claims the next block of collective `seq` from the group's queue; returns false when none is
// left. The first claim of a collective finds the previous collective's tag and restarts at 0.
bool claim_block(Counter& queue, uint64_t seq, uint64_t nblocks, uint64_t& block) {
  const uint64_t tag = (seq & 0xffffffffu) << 32;
  uint64_t v = queue.v.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t next = (v & ~uint64_t{0xffffffffu}) == tag ? (v & 0xffffffffu) : 0;
    if (next >= nblocks) return false;
    if (queue.v.compare_exchange_weak(v, tag | (next + 1), std::memory_order_relaxed)) {
      block = next;
      return true;
    }
  }
}
}  // namespace

// The message is cut into blocks (about 8 per rank, so the queue tag's 32-bit block index never
// overflows) that ranks claim from a shared queue, so a rank that the OS deschedules does not hold
// the others up: the ones running take over its share. A rank reduces its block reading every
// rank's input in place and writes the result straight into every rank's output ("push"); from
// CommOptions::stream_min_bytes on one 64-byte line at a time with non-temporal stores, below
// that through an L1 block and normal stores that leave the result in cache. A block is touched by
// the rank that claimed it alone, and is read from every input before it is written to any
// output, so this is safe in place too and needs no barrier between the phases; the done-barrier
// after the op keeps every buffer alive until all writes have landed (the store fence orders them
// before it). The result does not depend on which rank reduced a block (sources are combined in
// rank order). Streaming moves the minimum: one read of each input and one write of each output,
// with no read-for-ownership (a normal store first reads the line it overwrites).
void InprocCommunicator::all_reduce_direct(const OpDesc& d, const WaitCtx& ctx) {
  (void)ctx;
  const int n = g_->n;
  const size_t es = dtype_size(d.dtype);
  // About 8 blocks per rank, each at least 16 KiB and a multiple of 64 bytes.
  const size_t line = std::max<size_t>(1, 64 / es);
  size_t block = std::max<size_t>((16 * 1024) / es, d.count / (8 * static_cast<size_t>(n)));
  block = (block + line - 1) / line * line;
  const uint64_t nblocks = (d.count + block - 1) / block;
  const bool streaming = d.count * es >= g_->opts.stream_min_bytes;
  std::vector<const void*> srcs(n);
  std::vector<void*> dsts(n);
  uint64_t b = 0;
  while (claim_block(g_->blocks_claimed, d.seq, nblocks, b)) {
    const size_t a = b * block, m = std::min(block, d.count - a);
    for (int p = 0; p < n; ++p) {
      srcs[p] = static_cast<const unsigned char*>(peer(p, d.seq).send) + a * es;
      dsts[p] = static_cast<unsigned char*>(peer(p, d.seq).recv) + a * es;
    }
    detail::reduce_n_to(dsts.data(), n, streaming, srcs.data(), n, m, d.dtype, d.op, n);
  }
  if (streaming) detail::store_fence();
}

// Ring ReduceScatter then ring AllGather, every chunk cut into segments so that a rank works on
// segment i of step g while its right neighbour already consumes segment i-1 of step g-1. At step
// g (0 <= g < 2n-2) rank r works on chunk (r - g - 1) mod n: for g < n-1 it adds its input to the
// left neighbour's partial sum; for g >= n-1 it copies the left neighbour's finished chunk.
void InprocCommunicator::all_reduce_ring(const OpDesc& d, const WaitCtx& ctx) {
  Group& g = *g_;
  const int n = g.n;
  const int r = rank_;
  const int left = (r + n - 1) % n, right = (r + 1) % n;
  const size_t es = dtype_size(d.dtype);
  Chunks ch{d.count, n};
  const size_t max_chunk_bytes = ch.len(0) * es;
  const size_t nseg = std::max<size_t>(1, (max_chunk_bytes + g.opts.ring_segment_bytes - 1) /
                                              std::max<size_t>(1, g.opts.ring_segment_bytes));
  const uint64_t base = step_base(d.seq);
  const auto* my_send = static_cast<const unsigned char*>(d.send);
  auto* my_recv = static_cast<unsigned char*>(d.recv);
  const auto* left_send = static_cast<const unsigned char*>(peer(left, d.seq).send);
  const auto* left_recv = static_cast<const unsigned char*>(peer(left, d.seq).recv);
  for (int step = 0; step < 2 * n - 2; ++step) {
    const int c = ((r - step - 1) % n + n) % n;
    const size_t cb = ch.begin(c), cl = ch.len(c);
    for (size_t i = 0; i < nseg; ++i) {
      const size_t a = cb + cl * i / nseg, e = cb + cl * (i + 1) / nseg;
      const uint64_t unit = static_cast<uint64_t>(step) * nseg + i;
      if (step > 0)  // the left neighbour has produced this segment
        wait_counters(ctx, g.step.get(), base + unit - nseg + 1, left, "(ring neighbour)");
      if (step >= n - 1)  // the right neighbour has consumed what this segment overwrites
        wait_counters(ctx, g.step.get(), base + unit - static_cast<uint64_t>(n - 1) * nseg + 1,
                      right, "(ring neighbour)");
      if (e > a) {
        if (step < n - 1) {
          const void* srcs[2] = {(step == 0 ? left_send : left_recv) + a * es, my_send + a * es};
          detail::reduce_n(my_recv + a * es, srcs, 2, e - a, d.dtype, d.op, step == n - 2 ? n : 0);
        } else {
          std::memcpy(my_recv + a * es, left_recv + a * es, (e - a) * es);
        }
      }
      g.publish(g.step[r], base + unit + 1);
    }
  }
}

void InprocCommunicator::all_gather(const OpDesc& d) {
  const size_t bytes = d.count * dtype_size(d.dtype);
  auto* out = static_cast<unsigned char*>(d.recv);
  for (int k = 0; k < g_->n; ++k) {
    const int p = (rank_ + k) % g_->n;
    const void* src = p == rank_ ? d.send : peer(p, d.seq).send;
    if (bytes && src != out + p * bytes) std::memcpy(out + p * bytes, src, bytes);
  }
}

void InprocCommunicator::reduce_scatter(const OpDesc& d) {
  const int n = g_->n;
  const size_t bytes = d.count * dtype_size(d.dtype);
  std::vector<const void*> srcs(n);
  for (int p = 0; p < n; ++p)
    srcs[p] = static_cast<const unsigned char*>(peer(p, d.seq).send) + rank_ * bytes;
  detail::reduce_n(d.recv, srcs.data(), n, d.count, d.dtype, d.op, n);
}

void InprocCommunicator::broadcast(const OpDesc& d) {
  if (rank_ != d.root && d.count)
    std::memcpy(d.recv, peer(d.root, d.seq).send, d.count * dtype_size(d.dtype));
}

void InprocCommunicator::all_to_all(const OpDesc& d) {
  const size_t bytes = d.count * dtype_size(d.dtype);
  auto* out = static_cast<unsigned char*>(d.recv);
  for (int k = 0; k < g_->n; ++k) {
    const int p = (rank_ + k) % g_->n;
    if (bytes)
      std::memcpy(out + p * bytes,
                  static_cast<const unsigned char*>(peer(p, d.seq).send) + rank_ * bytes, bytes);
  }
}

void InprocCommunicator::all_to_allv(const OpDesc& d) {
  const int n = g_->n;
  const size_t es = dtype_size(d.dtype);
  // Every rank checks every pair, so all ranks agree on whether to fail.
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (peer(i, d.seq).send_counts[j] != peer(j, d.seq).recv_counts[i])
        throw MismatchError(detail::concat(where(d), ": rank ", i, " sends ",
                                           peer(i, d.seq).send_counts[j], " elements to rank ", j,
                                           ", which expects ", peer(j, d.seq).recv_counts[i]));
  auto* out = static_cast<unsigned char*>(d.recv);
  size_t out_off = 0;
  for (int p = 0; p < n; ++p) {
    const SlotData& ps = peer(p, d.seq);
    size_t in_off = 0;
    for (int j = 0; j < rank_; ++j) in_off += ps.send_counts[j];
    const size_t len = ps.send_counts[rank_];
    if (len)
      std::memcpy(out + out_off * es, static_cast<const unsigned char*>(ps.send) + in_off * es,
                  len * es);
    out_off += len;
  }
}

// Point to point. send is eager: it copies the message into the destination's mailbox and
// completes at once. send_recv lends its buffer: the receiver copies straight out of it (one copy
// instead of two, no allocation) and send_recv returns once that copy is done and its own receive
// has completed. Both post before they wait, so exchanges in pairs or rings cannot deadlock.
void InprocCommunicator::send(const OpDesc& d) {
  Message m;
  m.src = rank_;
  m.tag = d.tag;
  m.dtype = d.dtype;
  m.count = d.count;
  const size_t bytes = d.count * dtype_size(d.dtype);
  m.data.resize(bytes);
  if (bytes) std::memcpy(m.data.data(), d.send, bytes);
  if (g_->world->poisoned.load(std::memory_order_acquire))
    throw PeerFailedError(where(d) + " aborted: " + g_->world->poison_reason());
  Mailbox& mb = g_->mail[d.peer];
  {
    std::lock_guard lk(mb.mu);
    mb.q.push_back(std::move(m));
    mb.changed();
  }
  mb.cv.notify_all();
}

bool InprocCommunicator::take(std::unique_lock<std::mutex>& lk, const OpDesc& d, int src, int tag,
                              size_t count, void* dst) {
  Mailbox& mb = g_->mail[rank_];
  for (auto it = mb.q.begin(); it != mb.q.end(); ++it) {
    if (it->src != src || it->tag != tag) continue;
    if (it->dtype != d.dtype || it->count != count)
      throw MismatchError(detail::concat(
          where(d), ": rank ", src, " sent ", dtype_name(it->dtype), " x ", it->count, " with tag ",
          tag, ", this rank expects ", dtype_name(d.dtype), " x ", count));
    const size_t bytes = count * dtype_size(d.dtype);
    if (!it->consumed) {  // eager
      if (bytes) std::memcpy(dst, it->data.data(), bytes);
      mb.q.erase(it);
      return true;
    }
    // Lent: out of the queue (so the sender cannot take it back), copy without holding the lock,
    // then tell the sender, under its mailbox lock, that its buffer is free.
    const void* from = it->lent;
    std::atomic<bool>* consumed = it->consumed;
    mb.q.erase(it);
    lk.unlock();
    if (bytes) std::memcpy(dst, from, bytes);
    Mailbox& back = g_->mail[src];
    {
      std::lock_guard l(back.mu);
      consumed->store(true, std::memory_order_release);
      back.changed();
    }
    back.cv.notify_all();
    lk.lock();
    return true;
  }
  return false;
}

void InprocCommunicator::recv(const OpDesc& d) {
  Mailbox& mb = g_->mail[rank_];
  const WaitCtx ctx{g_.get(), rank_, &d, {}, Clock::now() + d.timeout};
  const WorldState& w = *g_->world;
  bool got = false;
  std::unique_lock lk(mb.mu);
  wait_until(
      ctx, [&] { return got || (got = take(lk, d, d.peer, d.tag, d.count, d.recv)); },
      [&] {
        if (!w.exited[g_->world_ranks[d.peer]].load(std::memory_order_acquire)) return false;
        // The message may have arrived just before the peer exited: look once more.
        if ((got = take(lk, d, d.peer, d.tag, d.count, d.recv))) return true;
        throw PeerFailedError(detail::concat(where(d), ": rank ", d.peer,
                                             " returned from its function without sending"));
      },
      [&] { return detail::concat("rank ", d.peer, " to send"); },
      [&](int iter) { mb.idle(lk, iter, ctx.deadline, w.oversubscribed); });
}

void InprocCommunicator::send_recv(const OpDesc& d) {
  if (d.peer == rank_) return exchange_with_self(d);  // validated: recv_peer == rank_ too
  const bool sending = d.peer >= 0, receiving = d.recv_peer >= 0;
  WorldState& w = *g_->world;
  std::atomic<bool> consumed{false};
  if (sending) {
    Message m;
    m.src = rank_;
    m.tag = d.tag;
    m.dtype = d.dtype;
    m.count = d.count;
    m.lent = d.send;
    m.consumed = &consumed;
    Mailbox& out = g_->mail[d.peer];
    {
      std::lock_guard lk(out.mu);
      out.q.push_back(std::move(m));
      out.changed();
    }
    out.cv.notify_all();
  }
  Mailbox& mb = g_->mail[rank_];
  const WaitCtx ctx{g_.get(), rank_, &d, {}, Clock::now() + d.timeout};
  bool got = !receiving;
  // Receivers set `consumed` under this mailbox's lock, which is held while it is read here.
  auto sent = [&] { return !sending || consumed.load(std::memory_order_acquire); };
  try {
    std::unique_lock lk(mb.mu);
    wait_until(
        ctx,
        [&] {
          if (!got) got = take(lk, d, d.recv_peer, d.recv_tag, d.recv_count, d.recv);
          return got && sent();
        },
        [&] {
          if (!got && w.exited[g_->world_ranks[d.recv_peer]].load(std::memory_order_acquire)) {
            got = take(lk, d, d.recv_peer, d.recv_tag, d.recv_count, d.recv);
            if (!got)
              throw PeerFailedError(detail::concat(where(d), ": rank ", d.recv_peer,
                                                   " returned from its function without sending"));
            return true;
          }
          if (!sent() && w.exited[g_->world_ranks[d.peer]].load(std::memory_order_acquire))
            throw PeerFailedError(detail::concat(where(d), ": rank ", d.peer,
                                                 " returned from its function without receiving"));
          return false;
        },
        [&] {
          std::string missing;
          if (!got) missing = detail::concat("rank ", d.recv_peer, " to send");
          if (!sent())
            missing += detail::concat(got ? "" : " and for ", "rank ", d.peer,
                                      " to receive this rank's message");
          return missing;
        },
        [&](int iter) { mb.idle(lk, iter, ctx.deadline, w.oversubscribed); });
  } catch (...) {
    if (sending) withdraw(d, consumed);
    throw;
  }
}

void InprocCommunicator::withdraw(const OpDesc& d, std::atomic<bool>& consumed) {
  {
    Mailbox& out = g_->mail[d.peer];
    std::lock_guard lk(out.mu);
    for (auto it = out.q.begin(); it != out.q.end(); ++it)
      if (it->consumed == &consumed) {
        out.q.erase(it);
        return;
      }
  }
  // Taken: the receiver is copying out of the send buffer (a memcpy, so this ends quickly).
  Mailbox& mb = g_->mail[rank_];
  std::unique_lock lk(mb.mu);
  mb.cv.wait_for(lk, std::chrono::seconds(10),
                 [&] { return consumed.load(std::memory_order_acquire); });
}

std::unique_ptr<Communicator> InprocCommunicator::do_split(int color, int key,
                                                           const std::string& child_name,
                                                           Timeout timeout) {
  Group& g = *g_;
  const uint64_t s = seq_issued();
  OpDesc d;
  d.type = OpType::Split;
  d.seq = s;
  d.timeout = timeout;
  WaitCtx ctx{&g, rank_, &d, {}, Clock::now() + timeout};
  SlotData& me = g.slot(rank_, s);
  me.fp = detail::fingerprint_of(d);
  me.color = color;
  me.key = key;
  std::shared_ptr<Group> result;
  int new_rank = -1;
  try {
    g.publish(g.arrived[rank_], s);
    wait_counters(ctx, g.arrived.get(), s);
    std::vector<detail::Fingerprint> fps(g.n);
    for (int p = 0; p < g.n; ++p) fps[p] = peer(p, s).fp;
    detail::check_fingerprints(fps, g.opts.name, rank_);
    if (color >= 0) {
      std::vector<std::pair<int, int>> members;  // (key, old rank)
      for (int p = 0; p < g.n; ++p)
        if (peer(p, s).color == color) members.push_back({peer(p, s).key, p});
      std::sort(members.begin(), members.end());
      const int leader = members[0].second;
      for (size_t i = 0; i < members.size(); ++i)
        if (members[i].second == rank_) new_rank = static_cast<int>(i);
      if (leader == rank_) {
        std::vector<int> world_ranks;
        for (auto& m : members) world_ranks.push_back(g.world_ranks[m.second]);
        me.split_result = std::make_shared<Group>(g.world, std::move(world_ranks), child_name);
        g.publish(g.step[rank_], step_base(s) + 1);
        result = me.split_result;
      } else {
        wait_counters(ctx, g.step.get(), step_base(s) + 1, leader, "to create the new group");
        result = peer(leader, s).split_result;
      }
    }
    g.publish(g.done[rank_], s);
    wait_counters(ctx, g.done.get(), s, -1, "to finish the split");
    me.split_result.reset();
  } catch (...) {
    on_failure(std::current_exception());
    g.publish(g.done[rank_], s);
    quiesce(s);
    throw;
  }
  if (!result) return nullptr;
  return std::make_unique<InprocCommunicator>(std::move(result), new_rank);
}

}  // namespace
}  // namespace inproc

// ---- InprocWorld --------------------------------------------------------------------------------

std::shared_ptr<InprocWorld> InprocWorld::create(int size, const CommOptions& opts) {
  if (size < 1)
    throw CommUsageError(detail::concat("an inproc world needs at least one rank, not ", size));
  auto s = std::make_shared<inproc::WorldState>();
  s->size = size;
  s->opts = resolve_options(opts);
  s->exited = std::make_unique<std::atomic<bool>[]>(size);
  for (int i = 0; i < size; ++i) s->exited[i].store(false);
  unsigned hw = std::thread::hardware_concurrency();
  s->oversubscribed = hw == 0 || static_cast<unsigned>(size) > hw;
  return std::make_shared<InprocWorld>(std::move(s));
}

int InprocWorld::size() const {
  return state_->size;
}
const CommOptions& InprocWorld::options() const {
  return state_->opts;
}

std::unique_ptr<Communicator> InprocWorld::communicator(int rank) {
  if (rank < 0 || rank >= state_->size)
    throw CommUsageError(
        detail::concat("rank ", rank, " is not in an inproc world of size ", state_->size));
  std::lock_guard lk(state_->mu);
  if (!world_group_) {
    std::vector<int> ranks(state_->size);
    std::iota(ranks.begin(), ranks.end(), 0);
    world_group_ = std::make_shared<inproc::Group>(state_, std::move(ranks), state_->opts.name);
  }
  return std::make_unique<inproc::InprocCommunicator>(world_group_, rank);
}

void InprocWorld::fail(int rank, const std::string& reason) {
  state_->poison(detail::concat("world rank ", rank, " failed: ", reason));
}

void InprocWorld::exited(int rank) {
  state_->exited[rank].store(true, std::memory_order_release);
}

bool InprocWorld::poisoned() const {
  return state_->poisoned.load();
}

}  // namespace tessera::comm
