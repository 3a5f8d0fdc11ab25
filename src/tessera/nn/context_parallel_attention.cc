#include "tessera/nn/context_parallel_attention.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/core/tensor.h"
#include "tessera/core/trace.h"
#include "tessera/kernels/flash_attention.h"
#include "tessera/nn/moe_exchange.h"

namespace tessera::nn {

namespace k = tessera::kernels;

namespace {

// Transient buffers of one call (the current allocator's Buffers).
Tensor cp_buffer(int64_t n, const char* name) {
  return Tensor::zeros({std::max<int64_t>(n, 1)}, DType::F32, MemCategory::Buffers, name);
}

void copy_floats(float* dst, const float* src, int64_t n) {
  if (n > 0) std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(n));
}

// The backward's softmax row term, [B, heads.q, T]: the caller's lent_delta, or allocated.
class Delta {
 public:
  explicit Delta(const ContextAttention& a) : p_(a.lent_delta) {
    if (p_ != nullptr) return;
    own_ = cp_buffer(int64_t{a.B} * a.T * a.heads.q, "cp.delta");
    p_ = own_.f32();
  }
  float* f32() const { return p_; }

 private:
  Tensor own_;
  float* p_;
};

// The ring's K/V blocks and dK/dV parts, `floats` each: whole blocks of the memory the caller
// lends (ContextAttention::lent) while one is free, allocated Buffers otherwise. A block returns
// its slot when it is destroyed or assigned to; `zeroed` blocks (a part the kernel accumulates
// into) start at zero, as an allocated one does.
class BlockPool {
 public:
  class Block {
   public:
    Block() = default;
    Block(Block&& o) noexcept { *this = std::move(o); }
    Block& operator=(Block&& o) noexcept {
      if (this != &o) {
        release();
        own_ = std::move(o.own_);
        p_ = std::exchange(o.p_, nullptr);
        pool_ = std::exchange(o.pool_, nullptr);
        slot_ = std::exchange(o.slot_, -1);
      }
      return *this;
    }
    Block(const Block&) = delete;
    Block& operator=(const Block&) = delete;
    ~Block() { release(); }
    float* f32() const { return p_; }

   private:
    friend class BlockPool;
    void release() {
      if (pool_ != nullptr && slot_ >= 0) pool_->free_[static_cast<size_t>(slot_)] = true;
      own_ = Tensor();
      p_ = nullptr, pool_ = nullptr, slot_ = -1;
    }
    Tensor own_;
    float* p_ = nullptr;
    BlockPool* pool_ = nullptr;
    int slot_ = -1;
  };

  BlockPool(const ContextAttention& a, int64_t floats)
      : base_(a.lent),
        floats_(floats),
        free_(static_cast<size_t>(a.lent != nullptr && floats > 0 ? a.lent_floats / floats : 0),
              true) {}
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  Block take(const char* name, bool zeroed = false) {
    Block b;
    for (size_t i = 0; i < free_.size(); ++i)
      if (free_[i]) {
        free_[i] = false;
        b.pool_ = this, b.slot_ = static_cast<int>(i);
        b.p_ = base_ + static_cast<int64_t>(i) * floats_;
        if (zeroed) std::memset(b.p_, 0, sizeof(float) * static_cast<size_t>(floats_));
        return b;
      }
    b.own_ = cp_buffer(floats_, name);
    b.p_ = b.own_.f32();
    return b;
  }

 private:
  float* base_;
  int64_t floats_;
  std::vector<bool> free_;
};

// The positions of every rank's rows, rank after rank ([n T]): what a rank holding another rank's
// keys (or the whole sequence, head-split) gives the kernel.
std::vector<int64_t> positions_of_all(const ContextAttention& a) {
  const int n = a.cp->size();
  std::vector<int64_t> all;
  all.reserve(static_cast<size_t>(n) * a.T);
  for (int s = 0; s < n; ++s) {
    const std::vector<int64_t> p = context_positions(a.seq_len, n, s);
    TESSERA_ASSERT(static_cast<int>(p.size()) == a.T, "a context-parallel rank holds ", p.size(),
                   " rows of each sequence, the call ", a.T);
    all.insert(all.end(), p.begin(), p.end());
  }
  const int64_t* mine = all.data() + static_cast<size_t>(a.cp->rank()) * a.T;
  TESSERA_CHECK_AS(ShapeError, std::equal(mine, mine + a.T, a.positions),
                   "a context-parallel batch's positions must be its cp rank's load-balanced ones "
                   "(nn::context_positions(seq_len, cp, cp_rank)): every rank places the others' "
                   "keys by them");
  return all;
}

// The kernel's dropout for heads starting at global head `first_head`.
k::AttentionDropout heads_dropout(const ContextAttention& a, int first_head) {
  k::AttentionDropout d = a.drop;
  d.head_offset = first_head;
  d.n_head_global = a.n_head;
  d.seq_len = a.seq_len;
  return d;
}

// This rank's queries (qkv rows, B x T) against keys and values kv[B, Tk, ldkv] at k_pos.
k::FlashAttention local_queries(const ContextAttention& a, const float* qkv, const float* kv,
                                int Tk, int64_t ldkv, const int64_t* k_pos) {
  k::FlashAttention f;
  f.B = a.B, f.Tq = a.T, f.Tk = Tk;
  f.heads = a.heads;
  f.q = qkv;
  f.ldq = a.heads.row_width();
  f.k = kv;
  f.v = kv + int64_t{a.heads.kv} * a.heads.size;
  f.ldkv = ldkv;
  f.q_pos = a.positions;
  f.k_pos = k_pos;
  f.causal = true;
  f.drop = heads_dropout(a, a.head_offset);
  return f;
}

// ---- All-gather ------------------------------------------------------------------------------

// K and V of every row of the sequences: [B, n T, 2 KV], rows in rank order (k_pos says where).
Tensor gather_kv(const ContextAttention& a, const float* qkv) {
  const int n = a.cp->size();
  const int64_t R = int64_t{a.B} * a.T, W = a.heads.row_width(),
                Qw = int64_t{a.heads.q} * a.heads.size,
                KV2 = 2 * int64_t{a.heads.kv} * a.heads.size;
  Tensor mine = cp_buffer(R * KV2, "cp.kv"), all = cp_buffer(n * R * KV2, "cp.kv_gathered");
  for (int64_t i = 0; i < R; ++i) copy_floats(mine.f32() + i * KV2, qkv + i * W + Qw, KV2);
  a.cp->group.all_gather(mine.f32(), all.f32(), static_cast<size_t>(R * KV2), DType::F32).wait();
  if (a.B == 1) return all;  // [n, T] is [1, n T] already
  Tensor full = cp_buffer(n * R * KV2, "cp.kv_whole");
  for (int s = 0; s < n; ++s)
    for (int b = 0; b < a.B; ++b)
      copy_floats(full.f32() + (int64_t{b} * n + s) * a.T * KV2,
                  all.f32() + (s * R + int64_t{b} * a.T) * KV2, a.T * KV2);
  return full;
}

void allgather_forward(const ContextAttention& a, const float* qkv, float* atty, float* lse) {
  const int n = a.cp->size();
  const std::vector<int64_t> pos = positions_of_all(a);
  const Tensor kv = gather_kv(a, qkv);
  const int64_t KV2 = 2 * int64_t{a.heads.kv} * a.heads.size;
  k::flash_attention_forward(local_queries(a, qkv, kv.f32(), n * a.T, KV2, pos.data()), atty,
                             int64_t{a.heads.q} * a.heads.size, lse);
}

void allgather_backward(const ContextAttention& a, const float* qkv, const float* atty,
                        const float* lse, const float* datty, float* dqkv) {
  const int n = a.cp->size();
  const int64_t R = int64_t{a.B} * a.T, W = a.heads.row_width(),
                Qw = int64_t{a.heads.q} * a.heads.size,
                KV2 = 2 * int64_t{a.heads.kv} * a.heads.size;
  const std::vector<int64_t> pos = positions_of_all(a);
  const Tensor kv = gather_kv(a, qkv);  // again: the forward kept nothing of it
  const Delta delta(a);
  k::flash_attention_delta(delta.f32(), atty, Qw, datty, Qw, a.B, a.T, a.heads);
  std::memset(dqkv, 0, sizeof(float) * static_cast<size_t>(R * W));
  Tensor dkv = cp_buffer(n * R * KV2, "cp.dkv_whole");
  k::flash_attention_backward(local_queries(a, qkv, kv.f32(), n * a.T, KV2, pos.data()), datty, Qw,
                              lse, delta.f32(), dqkv, W, dkv.f32(),
                              dkv.f32() + int64_t{a.heads.kv} * a.heads.size, KV2);
  // Back to rank order, then each rank's rows summed over the group to their owner.
  Tensor by_rank = dkv;
  if (a.B > 1) {
    by_rank = cp_buffer(n * R * KV2, "cp.dkv_gathered");
    for (int s = 0; s < n; ++s)
      for (int b = 0; b < a.B; ++b)
        copy_floats(by_rank.f32() + (s * R + int64_t{b} * a.T) * KV2,
                    dkv.f32() + (int64_t{b} * n + s) * a.T * KV2, a.T * KV2);
  }
  Tensor mine = cp_buffer(R * KV2, "cp.dkv");
  a.cp->group.reduce_scatter(by_rank.f32(), mine.f32(), static_cast<size_t>(R * KV2), DType::F32)
      .wait();
  for (int64_t i = 0; i < R; ++i) copy_floats(dqkv + i * W + Qw, mine.f32() + i * KV2, KV2);
}

// ---- Ring --------------------------------------------------------------------------------------

constexpr int kKvTag = 1, kAccTag = 2;

// Posts `send` to the next rank and a block of the same size from the previous one into `recv`,
// asynchronously on the group's progress thread (recorded on the timeline's comm track).
PendingExchange pass_on(const ContextAttention& a, const float* send, float* recv, int64_t count,
                        int tag, const std::string& what) {
  comm::Communicator& g = a.cp->group;
  const int n = g.size(), r = g.rank();
  comm::SendRecvOptions o;
  o.async = true;
  o.send_tag = o.recv_tag = tag;
  return PendingExchange(g.send_recv(send, static_cast<size_t>(count), (r + 1) % n, recv,
                                     static_cast<size_t>(count), (r + n - 1) % n, DType::F32, o),
                         "cp " + what + " " + a.label, "cp");
}

void ring_forward(const ContextAttention& a, const float* qkv, float* atty, float* lse) {
  const int n = a.cp->size(), r = a.cp->rank();
  const int64_t R = int64_t{a.B} * a.T, W = a.heads.row_width(),
                Qw = int64_t{a.heads.q} * a.heads.size,
                KV2 = 2 * int64_t{a.heads.kv} * a.heads.size;
  const std::vector<int64_t> pos = positions_of_all(a);
  BlockPool pool(a, R * KV2);
  BlockPool::Block cur = pool.take("cp.kv_block"), next = pool.take("cp.kv_block");
  for (int64_t i = 0; i < R; ++i) copy_floats(cur.f32() + i * KV2, qkv + i * W + Qw, KV2);
  for (int i = 0; i < n; ++i) {
    const int src = (r - i + n) % n;  // whose keys this rank holds now
    PendingExchange kv;
    if (i + 1 < n) kv = pass_on(a, cur.f32(), next.f32(), R * KV2, kKvTag, "k/v");
    {
      TraceSpan span("ring attention " + a.label + " block " + std::to_string(i), "forward");
      k::flash_attention_forward(
          local_queries(a, qkv, cur.f32(), a.T, KV2, pos.data() + int64_t{src} * a.T), atty, Qw,
          lse, i > 0);
    }
    kv.wait();
    std::swap(cur, next);
  }
}

// Posts `send` to rank `to` and a block of the same size from rank `from` into `recv`, as
// pass_on.
PendingExchange exchange_with(const ContextAttention& a, const float* send, int to, float* recv,
                              int from, int64_t count, int tag, const std::string& what) {
  comm::SendRecvOptions o;
  o.async = true;
  o.send_tag = o.recv_tag = tag;
  return PendingExchange(a.cp->group.send_recv(send, static_cast<size_t>(count), to, recv,
                                               static_cast<size_t>(count), from, DType::F32, o),
                         "cp " + what + " " + a.label, "cp");
}

// The K/V blocks travel the ring again, as in the forward. The dK, dV of the keys this rank holds
// at step i (rank r - i's) go straight to their owner, which adds them to its own keys' part (the
// kernel's, in dqkv) in step order: the sum a travelling accumulator would carry, own part first,
// then ranks r + 1, r + 2, ..., without the accumulators' two blocks a rank would hold (nor their
// last hop). Step i's part travels while the kernel computes step i + 1. Held at once: at n = 2
// two blocks (the K/V block and its incoming one, or a part going and the one coming), at n = 3
// four, from n = 4 five (the held and incoming K/V blocks, this step's part, the previous part
// going and the one coming); those that fit whole in the caller's lent memory are not allocated
// (BlockPool).
void ring_backward(const ContextAttention& a, const float* qkv, const float* atty, const float* lse,
                   const float* datty, float* dqkv) {
  const int n = a.cp->size(), r = a.cp->rank();
  const int64_t R = int64_t{a.B} * a.T, W = a.heads.row_width(),
                Qw = int64_t{a.heads.q} * a.heads.size, KV = int64_t{a.heads.kv} * a.heads.size,
                KV2 = 2 * KV;
  const std::vector<int64_t> pos = positions_of_all(a);
  const Delta delta(a);
  k::flash_attention_delta(delta.f32(), atty, Qw, datty, Qw, a.B, a.T, a.heads);
  std::memset(dqkv, 0, sizeof(float) * static_cast<size_t>(R * W));
  BlockPool pool(a, R * KV2);
  BlockPool::Block cur = pool.take("cp.kv_block");
  for (int64_t i = 0; i < R; ++i) copy_floats(cur.f32() + i * KV2, qkv + i * W + Qw, KV2);
  // The previous step's part on its way to its owner; this rank's keys' part coming.
  BlockPool::Block going, coming;
  PendingExchange parts;
  auto add_coming = [&] {
    parts.wait();
    for (int64_t i = 0; i < R; ++i) {
      float* d = dqkv + i * W + Qw;
      const float* c = coming.f32() + i * KV2;
      for (int64_t e = 0; e < KV2; ++e) d[e] += c[e];
    }
    going = BlockPool::Block();
    coming = BlockPool::Block();
  };
  for (int i = 0; i < n; ++i) {
    const int src = (r - i + n) % n;  // whose keys this rank holds now
    BlockPool::Block next;
    PendingExchange kv;
    if (i + 1 < n) {
      next = pool.take("cp.kv_block");
      kv = pass_on(a, cur.f32(), next.f32(), R * KV2, kKvTag, "k/v (backward)");
    }
    // This rank's own keys (step 0): their part straight into dqkv; another rank's: a part to send.
    BlockPool::Block part;
    float* dk = dqkv + Qw;
    int64_t ld = W;
    if (i > 0) {
      part = pool.take("cp.dkv_part", true);  // the kernel accumulates
      dk = part.f32(), ld = KV2;
    }
    {
      TraceSpan span("ring attention backward " + a.label + " block " + std::to_string(i),
                     "backward");
      k::flash_attention_backward(
          local_queries(a, qkv, cur.f32(), a.T, KV2, pos.data() + int64_t{src} * a.T), datty, Qw,
          lse, delta.f32(), dqkv, W, dk, dk + KV, ld);
    }
    kv.wait();
    cur = std::move(next);  // the held block is done with (after the last step, nothing is held)
    if (i > 0) {
      if (parts.posted()) add_coming();
      going = std::move(part);
      coming = pool.take("cp.dkv_part");
      parts =
          exchange_with(a, going.f32(), src, coming.f32(), (r + i) % n, R * KV2, kAccTag, "dk/dv");
    }
  }
  if (parts.posted()) add_coming();  // the last step's part for this rank's keys
}

// ---- Ulysses -----------------------------------------------------------------------------------

// The head split: rank j of n takes query heads [j qh, (j + 1) qh) and the key/value heads they
// read, [kv_first(j), kv_first(j) + kvh).
struct HeadSplit {
  int n = 1, qh = 0, kvh = 0, share = 1;  // share: ranks per key/value head (replicated: n / kv)
  int D = 0;
  int kv_first(int j) const { return share > 1 ? j / share : j * kvh; }
  k::AttentionHeads heads() const { return {qh, kvh, D}; }
  int64_t width() const { return heads().row_width(); }
};

HeadSplit head_split(const ContextAttention& a) {
  const int n = a.cp->size();
  check_context_heads(CpComm::Ulysses, n, a.heads);
  HeadSplit h;
  h.n = n, h.qh = a.heads.q / n, h.D = a.heads.size;
  if (a.heads.kv % n == 0) {
    h.kvh = a.heads.kv / n;
  } else {
    h.kvh = 1;
    h.share = n / a.heads.kv;
  }
  return h;
}

// The columns of one row a head-split rank j receives: (offset, floats) runs of a row laid out as
// `row` (qkv: [q | k | v]; out: [q]).
struct Runs {
  int64_t off[3] = {0, 0, 0}, len[3] = {0, 0, 0};
  int count = 0;
};
Runs qkv_columns(const ContextAttention& a, const HeadSplit& h, int j) {
  const int64_t D = h.D, Qw = int64_t{a.heads.q} * D, KV = int64_t{a.heads.kv} * D;
  const int64_t kv0 = int64_t{h.kv_first(j)} * D;
  Runs c;
  c.count = 3;
  c.off[0] = int64_t{j} * h.qh * D, c.len[0] = int64_t{h.qh} * D;
  c.off[1] = Qw + kv0, c.len[1] = int64_t{h.kvh} * D;
  c.off[2] = Qw + KV + kv0, c.len[2] = int64_t{h.kvh} * D;
  return c;
}
Runs q_columns(const HeadSplit& h, int j) {
  Runs c;
  c.count = 1;
  c.off[0] = int64_t{j} * h.qh * h.D, c.len[0] = int64_t{h.qh} * h.D;
  return c;
}

// Sequence-split rows src[B T, ld] to head-split out[B, n T, w]: rank j receives the columns
// cols(j) of every rank's rows (all-to-all), placed at their sequence's rows s T + t.
template <class Cols>
void to_heads(const ContextAttention& a, const float* src, int64_t ld, const Cols& cols, int64_t w,
              float* out) {
  const int n = a.cp->size();
  const int64_t R = int64_t{a.B} * a.T;
  Tensor send = cp_buffer(n * R * w, "cp.ulysses_send"),
         recv = cp_buffer(n * R * w, "cp.ulysses_recv");
  for (int j = 0; j < n; ++j) {
    const Runs c = cols(j);
    for (int64_t i = 0; i < R; ++i) {
      float* d = send.f32() + (j * R + i) * w;
      for (int x = 0; x < c.count; ++x) {
        copy_floats(d, src + i * ld + c.off[x], c.len[x]);
        d += c.len[x];
      }
    }
  }
  a.cp->group.all_to_all(send.f32(), recv.f32(), static_cast<size_t>(R * w), DType::F32).wait();
  for (int s = 0; s < n; ++s)
    for (int b = 0; b < a.B; ++b)
      copy_floats(out + (int64_t{b} * n + s) * a.T * w, recv.f32() + (s * R + int64_t{b} * a.T) * w,
                  a.T * w);
}

// Head-split rows in[B, n T, w] back to sequence-split dst[B T, ld]: rank s receives from each
// rank j its rows' values of the columns cols(j), assigned (add: added, in rank order).
template <class Cols>
void from_heads(const ContextAttention& a, const float* in, int64_t w, const Cols& cols, float* dst,
                int64_t ld, bool add) {
  const int n = a.cp->size();
  const int64_t R = int64_t{a.B} * a.T;
  Tensor send = cp_buffer(n * R * w, "cp.ulysses_send"),
         recv = cp_buffer(n * R * w, "cp.ulysses_recv");
  for (int s = 0; s < n; ++s)
    for (int b = 0; b < a.B; ++b)
      copy_floats(send.f32() + (s * R + int64_t{b} * a.T) * w, in + (int64_t{b} * n + s) * a.T * w,
                  a.T * w);
  a.cp->group.all_to_all(send.f32(), recv.f32(), static_cast<size_t>(R * w), DType::F32).wait();
  for (int j = 0; j < n; ++j) {
    const Runs c = cols(j);
    for (int64_t i = 0; i < R; ++i) {
      const float* f = recv.f32() + (j * R + i) * w;
      for (int x = 0; x < c.count; ++x) {
        float* d = dst + i * ld + c.off[x];
        if (add)
          for (int64_t e = 0; e < c.len[x]; ++e) d[e] += f[e];
        else
          copy_floats(d, f, c.len[x]);
        f += c.len[x];
      }
    }
  }
}

// The whole sequence's attention of the head-split rank's heads.
k::FlashAttention head_split_call(const ContextAttention& a, const HeadSplit& h, const float* qkv_h,
                                  const std::vector<int64_t>& pos) {
  k::FlashAttention f;
  f.B = a.B, f.Tq = f.Tk = h.n * a.T;
  f.heads = h.heads();
  f.q = qkv_h;
  f.ldq = f.ldkv = h.width();
  f.k = qkv_h + int64_t{h.qh} * h.D;
  f.v = f.k + int64_t{h.kvh} * h.D;
  f.q_pos = f.k_pos = pos.data();
  f.causal = true;
  f.drop = heads_dropout(a, a.head_offset + a.cp->rank() * h.qh);
  return f;
}

void ulysses_forward(const ContextAttention& a, const float* qkv, float* atty, float* lse) {
  const HeadSplit h = head_split(a);
  const int64_t Rn = int64_t{a.B} * a.T * h.n, W = a.heads.row_width(), Wh = h.width(),
                Qh = int64_t{h.qh} * h.D;
  const std::vector<int64_t> pos = positions_of_all(a);
  Tensor qkv_h = cp_buffer(Rn * Wh, "cp.ulysses_qkv");
  to_heads(
      a, qkv, W, [&](int j) { return qkv_columns(a, h, j); }, Wh, qkv_h.f32());
  Tensor out_h = cp_buffer(Rn * Qh, "cp.ulysses_out");
  k::flash_attention_forward(head_split_call(a, h, qkv_h.f32(), pos), out_h.f32(), Qh, lse);
  from_heads(
      a, out_h.f32(), Qh, [&](int j) { return q_columns(h, j); }, atty, int64_t{a.heads.q} * h.D,
      false);
}

void ulysses_backward(const ContextAttention& a, const float* qkv, const float* atty,
                      const float* lse, const float* datty, float* dqkv) {
  const HeadSplit h = head_split(a);
  const int n = h.n;
  const int64_t R = int64_t{a.B} * a.T, Rn = R * n, W = a.heads.row_width(), Wh = h.width(),
                Qw = int64_t{a.heads.q} * h.D, Qh = int64_t{h.qh} * h.D;
  const std::vector<int64_t> pos = positions_of_all(a);
  Tensor qkv_h = cp_buffer(Rn * Wh, "cp.ulysses_qkv");
  to_heads(
      a, qkv, W, [&](int j) { return qkv_columns(a, h, j); }, Wh, qkv_h.f32());
  Tensor dout_h = cp_buffer(Rn * Qh, "cp.ulysses_dout");
  to_heads(
      a, datty, Qw, [&](int j) { return q_columns(h, j); }, Qh, dout_h.f32());
  // The softmax row term, on this rank's rows (it needs only a row's own out and dout), then to
  // the head split: [B, heads, T] -> [B, qh, n T].
  const Delta delta(a);
  Tensor delta_h = cp_buffer(Rn * h.qh, "cp.delta_heads");
  k::flash_attention_delta(delta.f32(), atty, Qw, datty, Qw, a.B, a.T, a.heads);
  {
    const int64_t per = int64_t{a.B} * h.qh * a.T;  // one rank's block
    Tensor send = cp_buffer(n * per, "cp.ulysses_send"),
           recv = cp_buffer(n * per, "cp.ulysses_recv");
    for (int j = 0; j < n; ++j)
      for (int b = 0; b < a.B; ++b)
        copy_floats(send.f32() + j * per + int64_t{b} * h.qh * a.T,
                    delta.f32() + (int64_t{b} * a.heads.q + int64_t{j} * h.qh) * a.T,
                    int64_t{h.qh} * a.T);
    a.cp->group.all_to_all(send.f32(), recv.f32(), static_cast<size_t>(per), DType::F32).wait();
    for (int s = 0; s < n; ++s)
      for (int b = 0; b < a.B; ++b)
        for (int hh = 0; hh < h.qh; ++hh)
          copy_floats(delta_h.f32() + (int64_t{b} * h.qh + hh) * n * a.T + int64_t{s} * a.T,
                      recv.f32() + s * per + (int64_t{b} * h.qh + hh) * a.T, a.T);
  }
  Tensor dqkv_h = cp_buffer(Rn * Wh, "cp.ulysses_dqkv");
  float* dk = dqkv_h.f32() + Qh;
  k::flash_attention_backward(head_split_call(a, h, qkv_h.f32(), pos), dout_h.f32(), Qh, lse,
                              delta_h.f32(), dqkv_h.f32(), Wh, dk, dk + int64_t{h.kvh} * h.D, Wh);
  std::memset(dqkv, 0, sizeof(float) * static_cast<size_t>(R * W));
  // Query heads are disjoint; a replicated key/value head sums its ranks' parts.
  from_heads(
      a, dqkv_h.f32(), Wh, [&](int j) { return qkv_columns(a, h, j); }, dqkv, W, true);
}

}  // namespace

void check_context_heads(CpComm comm, int n, const kernels::AttentionHeads& heads) {
  if (comm != CpComm::Ulysses || n == 1) return;
  TESSERA_CHECK_AS(
      ConfigError, heads.q % n == 0 && (heads.kv % n == 0 || n % heads.kv == 0),
      config_key("cp_comm"), " ulysses splits each rank's attention heads over the ",
      config_key("cp"), " ranks: ", config_key("cp"), " ", n, " must divide the ", heads.q,
      " query heads of a tensor-parallel rank, and divide its ", heads.kv,
      " key/value heads or be a multiple of them (then the ranks whose query heads read one "
      "key/value head each receive it, and their gradients are summed); choose ",
      config_key("cp"), " accordingly, or ", config_key("cp_comm"), " allgather or ring");
}

void context_attention_forward(const ContextAttention& a, const float* qkv, float* atty,
                               float* lse) {
  TESSERA_ASSERT(a.cp != nullptr && a.cp->size() > 1 && a.positions != nullptr &&
                     a.seq_len == int64_t{a.T} * a.cp->size(),
                 "a context-parallel attention of ", a.T, " rows of sequences of ", a.seq_len);
  switch (a.cp->comm) {
    case CpComm::AllGather:
      return allgather_forward(a, qkv, atty, lse);
    case CpComm::Ring:
      return ring_forward(a, qkv, atty, lse);
    case CpComm::Ulysses:
      return ulysses_forward(a, qkv, atty, lse);
  }
}

void context_attention_backward(const ContextAttention& a, const float* qkv, const float* atty,
                                const float* lse, const float* datty, float* dqkv) {
  switch (a.cp->comm) {
    case CpComm::AllGather:
      return allgather_backward(a, qkv, atty, lse, datty, dqkv);
    case CpComm::Ring:
      return ring_backward(a, qkv, atty, lse, datty, dqkv);
    case CpComm::Ulysses:
      return ulysses_backward(a, qkv, atty, lse, datty, dqkv);
  }
}

}  // namespace tessera::nn
