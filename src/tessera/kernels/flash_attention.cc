#include "tessera/kernels/flash_attention.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/kernels/dropout.h"
#include "tessera/kernels/gemm.h"
#include "tessera/kernels/parallel_rows.h"
#include "tessera/kernels/precision.h"
#include "tessera/kernels/vec_math.h"

namespace tessera::kernels {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Query rows per tile.
constexpr int kQueryTile = 64;
// OpenBLAS (0.3.21, interface/gemm.c) runs a GEMM with M * N * K <= 65536 * 4 on the calling
// thread, whatever openblas_set_num_threads says; above it, on its thread pool. The tiles keep
// every tile GEMM (query tile x key tile x head size, in each of the three orders) at or below it,
// so that pieces running on several threads do not each start OpenBLAS's threads (the thread count
// is process-wide: lowering it here would change the GEMMs of ranks that are other threads).
constexpr int64_t kOneThreadGemm = 65536 * 4;

// Keys per tile for head size hs: as many as keep a tile GEMM on one thread (64 at hs = 64),
// a multiple of 8, at least 8. A function of hs alone, so the sums' order never depends on the
// thread count.
int key_tile(int hs) {
  const int64_t fit = kOneThreadGemm / (int64_t{kQueryTile} * hs);
  return static_cast<int>(std::clamp<int64_t>(fit / 8 * 8, 8, 64));
}

// Global positions: p[i], or i where p is null.
struct Positions {
  const int64_t* p;
  int64_t operator[](int64_t i) const { return p != nullptr ? p[i] : i; }
};

// The smallest and largest position in each tile of `tile` rows.
struct PosRange {
  int64_t lo, hi;
};
std::vector<PosRange> tile_ranges(Positions pos, int n, int tile) {
  std::vector<PosRange> r;
  for (int i0 = 0; i0 < n; i0 += tile) {
    PosRange x{pos[i0], pos[i0]};
    for (int i = i0 + 1; i < std::min(n, i0 + tile); ++i) {
      x.lo = std::min(x.lo, pos[i]);
      x.hi = std::max(x.hi, pos[i]);
    }
    r.push_back(x);
  }
  return r;
}

// How much of a (query tile, key tile) pair the causal mask lets through.
enum class Seen { None, All, Some };
Seen seen(bool causal, PosRange q, PosRange k) {
  if (!causal || k.hi <= q.lo) return Seen::All;
  if (k.lo > q.hi) return Seen::None;
  return Seen::Some;
}

// Everything a call's tiles need, checked once.
struct Plan {
  int B, Tq, Tk, NH, KV, G, hs, kt;  // kt: keys per tile
  int nqt, nkt;                      // query and key tiles
  float scale;
  Positions qp, kp;
  std::vector<PosRange> qr, kr;
  bool causal;
  // Dropout
  bool dropping = false;
  float p = 0, keep_scale = 1;
  uint64_t seed = 0, stream = 0;
  int64_t first_sample = 0, L = 0;
  int head_offset = 0, nh_global = 0;

  // The dropout mask's index of (b, h, query i, key 0 position): add the key's position.
  uint64_t mask_row(int b, int h, int64_t qpos) const {
    const uint64_t g = static_cast<uint64_t>(first_sample + b) * static_cast<uint64_t>(nh_global) +
                       static_cast<uint64_t>(head_offset + h);
    return (g * static_cast<uint64_t>(L) + static_cast<uint64_t>(qpos)) * static_cast<uint64_t>(L);
  }
};

int checked_ld(int64_t ld, int64_t width, const char* what) {
  TESSERA_CHECK_AS(ShapeError, ld >= width && ld <= std::numeric_limits<int>::max(),
                   "flash_attention: ", what, " stride ", ld, " must be in [", width, ", 2^31)");
  return static_cast<int>(ld);
}

Plan make_plan(const FlashAttention& a) {
  const AttentionHeads& h = a.heads;
  TESSERA_CHECK_AS(ShapeError, h.q > 0 && h.kv > 0 && h.size > 0 && h.q % h.kv == 0,
                   "flash_attention: ", h.kv, " key/value heads must divide ", h.q,
                   " query heads (of size ", h.size, ")");
  TESSERA_CHECK_AS(ShapeError, a.B >= 0 && a.Tq >= 0 && a.Tk >= 0, "flash_attention: B ", a.B,
                   ", Tq ", a.Tq, ", Tk ", a.Tk, " must not be negative");
  Plan p;
  p.B = a.B;
  p.Tq = a.Tq;
  p.Tk = a.Tk;
  p.NH = h.q;
  p.KV = h.kv;
  p.G = h.q / h.kv;
  p.hs = h.size;
  p.kt = key_tile(h.size);
  p.nqt = (a.Tq + kQueryTile - 1) / kQueryTile;
  p.nkt = (a.Tk + p.kt - 1) / p.kt;
  p.scale = 1.0f / std::sqrt(static_cast<float>(h.size));
  p.qp = Positions{a.q_pos};
  p.kp = Positions{a.k_pos};
  p.qr = tile_ranges(p.qp, a.Tq, kQueryTile);
  p.kr = tile_ranges(p.kp, a.Tk, p.kt);
  p.causal = a.causal;
  if (a.drop.p > 0.0f) {
    p.dropping = true;
    p.p = a.drop.p;
    p.keep_scale = dropout_scale(a.drop.p);
    p.seed = a.drop.seed;
    p.stream = a.drop.stream;
    p.first_sample = a.drop.first_sample;
    p.head_offset = a.drop.head_offset;
    p.nh_global = a.drop.n_head_global > 0 ? a.drop.n_head_global : h.q;
    p.L = a.drop.seq_len > 0 ? a.drop.seq_len : a.Tq;
  }
  return p;
}

// Runs fn(piece, scratch) for every piece in [0, n) on the calling rank's compute threads (its
// BLAS threads, train::set_compute_threads; as parallel_rows), each thread taking the next piece
// from a shared counter. A piece computes and writes its outputs alone, in a fixed order, so the
// result is bitwise the same on any number of threads. The helpers run in the caller's GEMM mode.
// Scratch: a few tiles per thread (std::vector, outside the allocator's accounting: at most
// ~100 KB a thread, gone when the call returns). The first exception of any piece is rethrown here
// once every thread is done.
struct Scratch {
  std::vector<float> s, p, d;  // [kQueryTile, kt] tiles
  std::vector<float> m, l;     // [kQueryTile] running maximum and sum
  std::vector<uint64_t> row;   // [kQueryTile] dropout mask index of each query row
};

template <class Fn>
void for_each_piece(int64_t n, const Plan& plan, Fn&& fn) {
  if (n <= 0) return;
  const int64_t threads = std::clamp<int64_t>(openblas_get_num_threads(), 1, n);
  const GemmMode mode = current_gemm_mode();
  std::atomic<int64_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  auto work = [&] {
    try {
      GemmModeScope scope(mode);
      Scratch s;
      const size_t tile = static_cast<size_t>(kQueryTile) * static_cast<size_t>(plan.kt);
      s.s.resize(tile);
      s.p.resize(tile);
      s.d.resize(tile);
      s.m.resize(kQueryTile);
      s.l.resize(kQueryTile);
      s.row.resize(kQueryTile);
      for (int64_t piece; (piece = next.fetch_add(1)) < n;) fn(piece, s);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(n);
    }
  };
  std::vector<std::thread> helpers;
  for (int64_t t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (std::thread& t : helpers) t.join();
  if (error) std::rethrow_exception(error);
}

// Sets row i of the tile s[rows, c] (stride ld) to 0 where key j is not seen (k_pos > q_pos) and
// returns the maximum over the seen keys (-inf when none is seen).
inline float masked_row_max(float* s, int c, const int64_t* kpos, int64_t j0, int64_t qpos) {
  float mx = kNegInf;
  if (kpos != nullptr) {
    const int64_t* kp = kpos + j0;
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < c; ++j) {
      const bool vis = kp[j] <= qpos;
      s[j] = vis ? s[j] : kNegInf;
      mx = std::max(mx, s[j]);
    }
  } else {
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < c; ++j) {
      const bool vis = j0 + j <= qpos;
      s[j] = vis ? s[j] : kNegInf;
      mx = std::max(mx, s[j]);
    }
  }
  return mx;
}

// s[j] = e^(s[j] - m) where s[j] is finite, 0 where it is -inf (a key not seen); returns the sum.
inline float exp_row(float* s, int c, float m, bool masked) {
  float sum = 0.0f;
  if (masked) {
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < c; ++j) {
      const float e = s[j] == kNegInf ? 0.0f : detail::exp_f(s[j] - m);
      s[j] = e;
      sum += e;
    }
  } else {
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < c; ++j) {
      const float e = detail::exp_f(s[j] - m);
      s[j] = e;
      sum += e;
    }
  }
  return sum;
}

// d[j] = keep(j) ? keep_scale : 0 for the keys j0 .. j0 + c of a query row (mask index base +
// k_pos).
inline void dropout_row(float* d, int c, const Plan& plan, uint64_t base, int64_t j0) {
  for (int j = 0; j < c; ++j) {
    const uint64_t idx = base + static_cast<uint64_t>(plan.kp[j0 + j]);
    d[j] = philox_uniform(plan.seed, plan.stream, idx) > plan.p ? plan.keep_scale : 0.0f;
  }
}

}  // namespace

void flash_attention_forward(const FlashAttention& a, float* out, int64_t ldo, float* lse,
                             bool merge) {
  const Plan plan = make_plan(a);
  const int hs = plan.hs, NH = plan.NH, Tq = plan.Tq, Tk = plan.Tk, kt = plan.kt;
  const int lq = checked_ld(a.ldq, int64_t{NH} * hs, "query");
  const int lkv = checked_ld(a.ldkv, int64_t{plan.KV} * hs, "key/value");
  const int lo = checked_ld(ldo, int64_t{NH} * hs, "output");
  const int64_t pieces = int64_t{plan.B} * NH * plan.nqt;
  // Piece (b, h, query tile), the tiles of a head from the last (the most keys, under the causal
  // mask) to the first so that the shared counter hands out the long pieces first.
  for_each_piece(pieces, plan, [&](int64_t piece, Scratch& sc) {
    const int qt = plan.nqt - 1 - static_cast<int>(piece % plan.nqt);
    const int64_t bh = piece / plan.nqt;
    const int h = static_cast<int>(bh % NH), b = static_cast<int>(bh / NH);
    const int g = h / plan.G;
    const int i0 = qt * kQueryTile, r = std::min(Tq, i0 + kQueryTile) - i0;
    const float* q = a.q + (int64_t{b} * Tq + i0) * a.ldq + int64_t{h} * hs;
    float* o = out + (int64_t{b} * Tq + i0) * ldo + int64_t{h} * hs;
    float* lrow = lse + (int64_t{b} * NH + h) * Tq + i0;
    float* m = sc.m.data();
    float* l = sc.l.data();
    // The running state (m, l, o): o / l is the output over the keys so far and m + log l its
    // log-sum-exp; a merged partial result enters as m = lse, l = 1, o = out.
    for (int i = 0; i < r; ++i) {
      float* oi = o + int64_t{i} * ldo;
      if (merge && lrow[i] != kNegInf) {
        m[i] = lrow[i];
        l[i] = 1.0f;
      } else {
        m[i] = kNegInf;
        l[i] = 0.0f;
        std::fill(oi, oi + hs, 0.0f);
      }
      if (plan.dropping) sc.row[i] = plan.mask_row(b, h, plan.qp[i0 + i]);
    }
    for (int kti = 0; kti < plan.nkt; ++kti) {
      const Seen vis = seen(plan.causal, plan.qr[qt], plan.kr[kti]);
      if (vis == Seen::None) continue;
      const int j0 = kti * kt, c = std::min(Tk, j0 + kt) - j0;
      const float* k = a.k + (int64_t{b} * Tk + j0) * a.ldkv + int64_t{g} * hs;
      const float* v = a.v + (int64_t{b} * Tk + j0) * a.ldkv + int64_t{g} * hs;
      float* s = sc.s.data();
      // S[r, c] = scale * Q K^T
      gemm(false, true, r, c, hs, plan.scale, q, lq, k, lkv, 0.0f, s, kt);
      for (int i = 0; i < r; ++i) {
        float* si = s + int64_t{i} * kt;
        float mx;
        if (vis == Seen::Some) {
          mx = masked_row_max(si, c, a.k_pos, j0, plan.qp[i0 + i]);
        } else {
          mx = kNegInf;
#pragma omp simd reduction(max : mx)
          for (int j = 0; j < c; ++j) mx = std::max(mx, si[j]);
        }
        if (mx == kNegInf) {  // the row sees none of these keys
          std::fill(si, si + c, 0.0f);
          continue;
        }
        const float m_new = std::max(m[i], mx);
        const float sum = exp_row(si, c, m_new, vis == Seen::Some);
        if (m_new != m[i]) {
          const float alpha = m[i] == kNegInf ? 0.0f : detail::exp_f(m[i] - m_new);
          float* oi = o + int64_t{i} * ldo;
#pragma omp simd
          for (int x = 0; x < hs; ++x) oi[x] *= alpha;
          l[i] *= alpha;
          m[i] = m_new;
        }
        l[i] += sum;
        if (plan.dropping) {
          float* d = sc.d.data();
          dropout_row(d, c, plan, sc.row[i], j0);
#pragma omp simd
          for (int j = 0; j < c; ++j) si[j] *= d[j];
        }
      }
      // O[r, hs] += P V
      gemm(false, false, r, hs, c, 1.0f, s, kt, v, lkv, 1.0f, o, lo);
    }
    for (int i = 0; i < r; ++i) {
      float* oi = o + int64_t{i} * ldo;
      if (l[i] == 0.0f) {
        std::fill(oi, oi + hs, 0.0f);
        lrow[i] = kNegInf;
        continue;
      }
      const float inv = 1.0f / l[i];
#pragma omp simd
      for (int x = 0; x < hs; ++x) oi[x] *= inv;
      lrow[i] = m[i] + std::log(l[i]);
    }
  });
}

void flash_attention_delta(float* delta, const float* out, int64_t ldo, const float* dout,
                           int64_t lddo, int B, int Tq, const AttentionHeads& heads) {
  const int NH = heads.q, hs = heads.size;
  parallel_rows(int64_t{B} * Tq, int64_t{NH} * hs, [&](int64_t first, int64_t end) {
    for (int64_t row = first; row < end; ++row) {
      const int64_t b = row / Tq, i = row % Tq;
      for (int h = 0; h < NH; ++h) {
        const float* o = out + row * ldo + int64_t{h} * hs;
        const float* d = dout + row * lddo + int64_t{h} * hs;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int x = 0; x < hs; ++x) sum += o[x] * d[x];
        delta[(b * NH + h) * Tq + i] = sum;
      }
    }
  });
}

void flash_attention_backward(const FlashAttention& a, const float* dout, int64_t lddo,
                              const float* lse, const float* delta, float* dq, int64_t lddq,
                              float* dk, float* dv, int64_t lddkv) {
  const Plan plan = make_plan(a);
  const int hs = plan.hs, NH = plan.NH, Tq = plan.Tq, Tk = plan.Tk, kt = plan.kt;
  const int lq = checked_ld(a.ldq, int64_t{NH} * hs, "query");
  const int lkv = checked_ld(a.ldkv, int64_t{plan.KV} * hs, "key/value");
  const int ldo = checked_ld(lddo, int64_t{NH} * hs, "output gradient");
  const int ldq = checked_ld(lddq, int64_t{NH} * hs, "query gradient");
  const int ldkv = checked_ld(lddkv, int64_t{plan.KV} * hs, "key/value gradient");
  // Piece (b, key/value head g) with all of g's query heads: the only writer of its dK, dV and of
  // its query heads' dQ. Within it: key tiles, then query heads, then query tiles (dK, dV of the
  // key tile stay in cache; dQ of a query tile sums the key tiles in order).
  for_each_piece(int64_t{plan.B} * plan.KV, plan, [&](int64_t piece, Scratch& sc) {
    const int g = static_cast<int>(piece % plan.KV), b = static_cast<int>(piece / plan.KV);
    for (int kti = 0; kti < plan.nkt; ++kti) {
      const int j0 = kti * kt, c = std::min(Tk, j0 + kt) - j0;
      const int64_t kv_off = (int64_t{b} * Tk + j0);
      const float* k = a.k + kv_off * a.ldkv + int64_t{g} * hs;
      const float* v = a.v + kv_off * a.ldkv + int64_t{g} * hs;
      float* dkt = dk + kv_off * lddkv + int64_t{g} * hs;
      float* dvt = dv + kv_off * lddkv + int64_t{g} * hs;
      for (int h = g * plan.G; h < (g + 1) * plan.G; ++h) {
        const float* lrow = lse + (int64_t{b} * NH + h) * Tq;
        const float* drow = delta + (int64_t{b} * NH + h) * Tq;
        for (int qt = 0; qt < plan.nqt; ++qt) {
          const Seen vis = seen(plan.causal, plan.qr[qt], plan.kr[kti]);
          if (vis == Seen::None) continue;
          const int i0 = qt * kQueryTile, r = std::min(Tq, i0 + kQueryTile) - i0;
          const int64_t q_off = int64_t{b} * Tq + i0;
          const float* q = a.q + q_off * a.ldq + int64_t{h} * hs;
          const float* go = dout + q_off * lddo + int64_t{h} * hs;
          float* dqt = dq + q_off * lddq + int64_t{h} * hs;
          float* s = sc.s.data();   // S, then P
          float* pd = sc.p.data();  // P with dropout
          float* dp = sc.d.data();  // dP, then dS
          // S[r, c] = scale * Q K^T, then P = e^(S - lse) (0 where not seen)
          gemm(false, true, r, c, hs, plan.scale, q, lq, k, lkv, 0.0f, s, kt);
          for (int i = 0; i < r; ++i) {
            float* si = s + int64_t{i} * kt;
            const float li = lrow[i0 + i];
            if (li == kNegInf) {
              std::fill(si, si + c, 0.0f);
              continue;
            }
            if (vis == Seen::Some) masked_row_max(si, c, a.k_pos, j0, plan.qp[i0 + i]);
            exp_row(si, c, li, vis == Seen::Some);
          }
          if (plan.dropping) {
            // pd = the mask factors (keep_scale or 0), drawn at the global coordinates
            for (int i = 0; i < r; ++i) {
              float* pi = pd + int64_t{i} * kt;
              dropout_row(pi, c, plan, plan.mask_row(b, h, plan.qp[i0 + i]), j0);
            }
          }
          // dP[r, c] = dO V^T
          gemm(false, true, r, c, hs, 1.0f, go, ldo, v, lkv, 0.0f, dp, kt);
          if (plan.dropping) {
            // pd holds the mask factors: dP *= mask, then pd = P * mask.
            for (int i = 0; i < r; ++i) {
              float* pi = pd + int64_t{i} * kt;
              float* di = dp + int64_t{i} * kt;
              const float* si = s + int64_t{i} * kt;
#pragma omp simd
              for (int j = 0; j < c; ++j) {
                di[j] *= pi[j];
                pi[j] *= si[j];
              }
            }
          }
          // dV[c, hs] += Pd^T dO
          gemm(true, false, c, hs, r, 1.0f, plan.dropping ? pd : s, kt, go, ldo, 1.0f, dvt, ldkv);
          // dS = P * (dP - delta)
          for (int i = 0; i < r; ++i) {
            float* di = dp + int64_t{i} * kt;
            const float* si = s + int64_t{i} * kt;
            const float de = drow[i0 + i];
#pragma omp simd
            for (int j = 0; j < c; ++j) di[j] = si[j] * (di[j] - de);
          }
          // dQ[r, hs] += scale * dS K; dK[c, hs] += scale * dS^T Q
          gemm(false, false, r, hs, c, plan.scale, dp, kt, k, lkv, 1.0f, dqt, ldq);
          gemm(true, false, c, hs, r, plan.scale, dp, kt, q, lq, 1.0f, dkt, ldkv);
        }
      }
    }
  });
}

}  // namespace tessera::kernels
