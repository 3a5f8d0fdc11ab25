// How the tiles are computed. Measured with OpenBLAS 0.3.21's SkylakeX kernels on one core of the
// development machine, on 64 x 64 x 64 tiles (a GPT-2 head): the small-matrix kernels that OpenBLAS
// uses at these sizes run NN and TN products of contiguous tiles in cache at ~145 GFLOP/s and NT
// products at ~90, and lose about a third when an operand's rows lie at a model's stride (the
// packed qkv's 2304 floats fall into a few cache sets) or stream from L3. So every operand of a
// tile GEMM is a packed tile that is reused: the forward packs each key tile (K^T, V) once for the
// kQueryTilesPerPiece query tiles of its piece, and their Q^T once; the backward packs a block of
// kKeyTilesPerBlock key tiles (K^T, V^T, K) once and each query tile's Q and dO once a block.
//   forward   S^T = K Q^T (TN), so that the online softmax of a query runs down a column
//             (maxima and sums across rows, no reduction across a vector); O += P V (TN on P^T)
//   backward  S = Q K^T, dP = dO V^T, dQ += dS K (NN); dV^T += dO^T P, dK^T += Q^T dS (TN; a key
//             tile's transposed sums are added to dk and dv once a block)
// Transposes go through OpenBLAS's somatcopy (2x a plain loop).
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

// Query rows per tile, and query tiles per forward piece (a piece packs each key tile once for
// all of its query tiles).
constexpr int kQueryTile = 64;
constexpr int kQueryTilesPerPiece = 8;
// Key tiles per block of the backward (packed together, with their dK and dV sums: 640 KB a
// thread at head size 64, which stay in L2 while the query tiles stream past once a block).
constexpr int kKeyTilesPerBlock = 8;
// OpenBLAS (0.3.21, interface/gemm.c) runs a GEMM with M * N * K <= 65536 * 4 on the calling
// thread, whatever openblas_set_num_threads says; above it, on its thread pool (and, at these
// sizes, through its slower general path). The tiles keep every tile GEMM (query tile x key tile x
// head size, in each order) at or below it, so that pieces running on several threads do not each
// start OpenBLAS's threads (the thread count is process-wide: lowering it here would change the
// GEMMs of ranks that are other threads).
constexpr int64_t kOneThreadGemm = 65536 * 4;

// Keys per tile for head size hs: as many as keep a tile GEMM on one thread (64 at hs = 64), a
// multiple of 8, at least 8. A function of hs alone, so that the order of the sums never depends
// on the thread count.
int flash_key_tile(int hs) {
  const int64_t fit = kOneThreadGemm / (int64_t{kQueryTile} * hs);
  return static_cast<int>(std::clamp<int64_t>(fit / 8 * 8, 8, 64));
}

// Global positions: p[i], or i where p is null.
struct RowPositions {
  const int64_t* p;
  int64_t operator[](int64_t i) const { return p != nullptr ? p[i] : i; }
};

// The smallest and largest position in each tile of `tile` rows.
struct PosRange {
  int64_t lo, hi;
};
std::vector<PosRange> tile_pos_ranges(RowPositions pos, int n, int tile) {
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
enum class PairSeen { None, All, Some };
PairSeen pair_seen(bool causal, PosRange q, PosRange k) {
  if (!causal || k.hi <= q.lo) return PairSeen::All;
  if (k.lo > q.hi) return PairSeen::None;
  return PairSeen::Some;
}

// Everything a call's tiles need, checked once.
struct FlashPlan {
  int B, Tq, Tk, NH, KV, G, hs, kt;  // kt: keys per tile
  int nqt, nkt;                      // query and key tiles
  float scale;
  RowPositions qp, kp;
  std::vector<PosRange> qr, kr;
  bool causal;
  // Dropout
  bool dropping = false;
  float p = 0, keep_scale = 1;
  uint64_t seed = 0, stream = 0;
  int64_t first_sample = 0, L = 0;
  int head_offset = 0, nh_global = 0;

  PairSeen seen(int qt, int kti) const { return pair_seen(causal, qr[qt], kr[kti]); }
  // The dropout mask's index of (b, h, the query at qpos, the key at position 0): add the key's
  // position.
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

FlashPlan make_plan(const FlashAttention& a) {
  const AttentionHeads& h = a.heads;
  TESSERA_CHECK_AS(ShapeError, h.q > 0 && h.kv > 0 && h.size > 0 && h.q % h.kv == 0,
                   "flash_attention: ", h.kv, " key/value heads must divide ", h.q,
                   " query heads (of size ", h.size, ")");
  TESSERA_CHECK_AS(ShapeError, a.B >= 0 && a.Tq >= 0 && a.Tk >= 0, "flash_attention: B ", a.B,
                   ", Tq ", a.Tq, ", Tk ", a.Tk, " must not be negative");
  FlashPlan p;
  p.B = a.B;
  p.Tq = a.Tq;
  p.Tk = a.Tk;
  p.NH = h.q;
  p.KV = h.kv;
  p.G = h.q / h.kv;
  p.hs = h.size;
  p.kt = flash_key_tile(h.size);
  p.nqt = (a.Tq + kQueryTile - 1) / kQueryTile;
  p.nkt = (a.Tk + p.kt - 1) / p.kt;
  p.scale = 1.0f / std::sqrt(static_cast<float>(h.size));
  p.qp = RowPositions{a.q_pos};
  p.kp = RowPositions{a.k_pos};
  p.qr = tile_pos_ranges(p.qp, a.Tq, kQueryTile);
  p.kr = tile_pos_ranges(p.kp, a.Tk, p.kt);
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

// A thread's tiles: std::vector, outside the allocator's accounting (under 1 MB a thread at head
// size 64, sized to stay in L2; allocated by each call and freed when it returns).
struct TileScratch {
  // Packed key and value tiles, one in the forward (K^T [hs, kt], V [kt, hs] in kc), a block of
  // kKeyTilesPerBlock in the backward (K^T, V^T [hs, kt], K [kt, hs] each).
  std::vector<float> kt, vt, kc;
  std::vector<float> s, d, pd;  // [kQueryTile, kt]: scores or P, dP or dS, dropped P or mask
  // forward: O [rows, hs]; backward: the block's dK^T, dV^T [hs, kt] each
  std::vector<float> acc1, acc2;
  // forward: the piece's query tiles transposed, [hs, kQueryTile] each; backward: Q, dO and dQ
  // (over the block's keys) of a query tile, [kQueryTile, hs] each
  std::vector<float> qt;
  std::vector<float> m, l;               // the running maximum and sum of the piece's rows
  std::vector<float> cmax, csum, alpha;  // [kQueryTile]: a tile's column maxima, sums, rescaling
  std::vector<int64_t> qpos;             // [kQueryTile]: a query tile's positions
  std::vector<uint64_t> row;             // the dropout mask index of the piece's rows
};

// Runs fn(piece, scratch) for every piece in [0, n) on the calling rank's compute threads (its
// BLAS threads, train::set_compute_threads, as parallel_rows), each thread taking the next piece
// from a shared counter. A piece computes and writes its outputs alone, in a fixed order, so the
// result is bitwise the same on any number of threads. Every thread's tile GEMMs run in fp32,
// whatever the caller's GEMM mode (flash_attention.h).
// The first exception of any piece is rethrown here once every thread is done. The threads' scratch
// belongs to the calling thread and lives on between calls, zeroed at each: allocated afresh at
// every call, glibc handed it back to the kernel at the call's end and took new (transparent huge)
// pages at the next, each zeroed by the kernel (2% of a bf16 step's time on one thread).
template <class Fn>
void for_each_piece(int64_t n, const FlashPlan& plan, Fn&& fn) {
  if (n <= 0) return;
  const int64_t threads = std::clamp<int64_t>(openblas_get_num_threads(), 1, n);
  std::atomic<int64_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  thread_local std::vector<TileScratch> calling_threads_scratch;
  // The helpers must reach the calling thread's (a thread_local named in the lambda would be
  // each helper's own).
  std::vector<TileScratch>& scratch = calling_threads_scratch;
  if (scratch.size() < static_cast<size_t>(threads)) scratch.resize(static_cast<size_t>(threads));
  auto work = [&](int64_t thread) {
    try {
      GemmModeScope fp32(GemmMode{});
      TileScratch& s = scratch[static_cast<size_t>(thread)];
      const size_t tile = static_cast<size_t>(plan.kt) * static_cast<size_t>(plan.hs);
      const size_t rows = static_cast<size_t>(kQueryTile) * kQueryTilesPerPiece;
      const size_t block = tile * kKeyTilesPerBlock;
      s.kt.assign(block, 0);
      s.vt.assign(block, 0);
      s.kc.assign(block, 0);
      s.s.assign(static_cast<size_t>(kQueryTile) * static_cast<size_t>(plan.kt), 0);
      s.d.assign(s.s.size(), 0);
      s.pd.assign(std::max(s.s.size(), tile), 0);
      s.acc1.assign(std::max(block, rows * static_cast<size_t>(plan.hs)), 0);
      s.acc2.assign(block, 0);
      s.qt.assign(std::max<size_t>(rows, 3 * kQueryTile) * static_cast<size_t>(plan.hs), 0);
      s.cmax.assign(kQueryTile, 0);
      s.csum.assign(kQueryTile, 0);
      s.alpha.assign(kQueryTile, 0);
      s.qpos.assign(kQueryTile, 0);
      s.m.assign(rows, 0);
      s.l.assign(rows, 0);
      s.row.assign(rows, 0);
      for (int64_t piece; (piece = next.fetch_add(1)) < n;) fn(piece, s);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(n);
    }
  };
  std::vector<std::thread> helpers;
  for (int64_t t = 1; t < threads; ++t) helpers.emplace_back(work, t);
  work(0);
  for (std::thread& t : helpers) t.join();
  if (error) std::rethrow_exception(error);
}

// dst[j * ldd + i] = src[i * lds + j] for i < rows, j < cols: OpenBLAS's out-of-place transpose
// (an extension of CBLAS), 2x as fast as a loop at 64 x 64.
void transpose(const float* src, int64_t lds, int rows, int cols, float* dst, int64_t ldd) {
  cblas_somatcopy(CblasRowMajor, CblasTrans, rows, cols, 1.0f, src, static_cast<int>(lds), dst,
                  static_cast<int>(ldd));
}

// dst[rows, cols] (contiguous) = the rows of src at stride lds.
void copy_rows(float* dst, const float* src, int64_t lds, int rows, int cols) {
  for (int i = 0; i < rows; ++i) {
    const float* s = src + i * lds;
    float* d = dst + int64_t{i} * cols;
#pragma omp simd
    for (int j = 0; j < cols; ++j) d[j] = s[j];
  }
}

// dst[i * ldd + j] += src[j * lds + i] for i < rows, j < cols (a transposed accumulator added),
// through tmp[rows, cols].
void add_transposed(const float* src, int64_t lds, int rows, int cols, float* dst, int64_t ldd,
                    float* tmp) {
  transpose(src, lds, cols, rows, tmp, cols);
  for (int i = 0; i < rows; ++i) {
    float* d = dst + i * ldd;
    const float* t = tmp + int64_t{i} * cols;
#pragma omp simd
    for (int j = 0; j < cols; ++j) d[j] += t[j];
  }
}

// The backward's probabilities: s[j] = e^(s[j] - lse) where key j0 + j is seen by the query at
// qpos (all of them unless masked), 0 where not; all 0 where lse = -inf (the query sees no key).
inline void probabilities_row(float* s, int c, float lse, bool masked, const int64_t* kpos,
                              int64_t j0, int64_t qpos) {
  if (lse == kNegInf) {
    std::fill(s, s + c, 0.0f);
  } else if (!masked) {
#pragma omp simd
    for (int j = 0; j < c; ++j) s[j] = detail::exp_f(s[j] - lse);
  } else if (kpos != nullptr) {
    const int64_t* kp = kpos + j0;
#pragma omp simd
    for (int j = 0; j < c; ++j) s[j] = kp[j] <= qpos ? detail::exp_f(s[j] - lse) : 0.0f;
  } else {
#pragma omp simd
    for (int j = 0; j < c; ++j) s[j] = j0 + j <= qpos ? detail::exp_f(s[j] - lse) : 0.0f;
  }
}

// d[j] = keep ? keep_scale : 0 for the keys j0 .. j0 + c of a query row (mask index base + k_pos).
inline void dropout_factors(float* d, int c, const FlashPlan& plan, uint64_t base, int64_t j0) {
  for (int j = 0; j < c; ++j) {
    const uint64_t idx = base + static_cast<uint64_t>(plan.kp[j0 + j]);
    d[j] = philox_uniform(plan.seed, plan.stream, idx) > plan.p ? plan.keep_scale : 0.0f;
  }
}

}  // namespace

void flash_attention_forward(const FlashAttention& a, float* out, int64_t ldo, float* lse,
                             bool merge) {
  const FlashPlan plan = make_plan(a);
  const int hs = plan.hs, NH = plan.NH, Tq = plan.Tq, Tk = plan.Tk;
  checked_ld(a.ldq, int64_t{NH} * hs, "query");
  checked_ld(a.ldkv, int64_t{plan.KV} * hs, "key/value");
  checked_ld(ldo, int64_t{NH} * hs, "output");
  // Piece (b, h, run of kQueryTilesPerPiece query tiles), the runs of a head from the last (the
  // most keys, under the causal mask) to the first so that the shared counter hands out the long
  // pieces first.
  const int runs = (plan.nqt + kQueryTilesPerPiece - 1) / kQueryTilesPerPiece;
  for_each_piece(int64_t{plan.B} * NH * runs, plan, [&](int64_t piece, TileScratch& sc) {
    const int run = runs - 1 - static_cast<int>(piece % runs);
    const int64_t bh = piece / runs;
    const int h = static_cast<int>(bh % NH), b = static_cast<int>(bh / NH);
    const int g = h / plan.G;
    const int qt0 = run * kQueryTilesPerPiece, qt1 = std::min(plan.nqt, qt0 + kQueryTilesPerPiece);
    const int i0 = qt0 * kQueryTile, rows = std::min(Tq, qt1 * kQueryTile) - i0;
    float* out0 = out + (int64_t{b} * Tq + i0) * ldo + int64_t{h} * hs;
    float* lse0 = lse + (int64_t{b} * NH + h) * Tq + i0;
    // The running state of row i: o[i] / l[i] is the output over the keys so far and
    // m[i] + log l[i] its log-sum-exp; a merged partial result enters as m = lse, l = 1, o = out.
    float* o = sc.acc1.data();  // [rows, hs]
    float* m = sc.m.data();
    float* l = sc.l.data();
    for (int i = 0; i < rows; ++i) {
      float* oi = o + int64_t{i} * hs;
      if (merge && lse0[i] != kNegInf) {
        m[i] = lse0[i];
        l[i] = 1.0f;
        std::copy(out0 + int64_t{i} * ldo, out0 + int64_t{i} * ldo + hs, oi);
      } else {
        m[i] = kNegInf;
        l[i] = 0.0f;
        std::fill(oi, oi + hs, 0.0f);
      }
      if (plan.dropping) sc.row[i] = plan.mask_row(b, h, plan.qp[i0 + i]);
    }
    // Q^T of each query tile, packed: [hs, r] at qt + tile * hs * kQueryTile.
    for (int qt = qt0; qt < qt1; ++qt) {
      const int t0 = (qt - qt0) * kQueryTile, r = std::min(rows - t0, kQueryTile);
      transpose(a.q + (int64_t{b} * Tq + i0 + t0) * a.ldq + int64_t{h} * hs, a.ldq, r, hs,
                sc.qt.data() + int64_t{t0} * hs, r);
    }
    for (int kti = 0; kti < plan.nkt; ++kti) {
      bool any = false;
      for (int qt = qt0; qt < qt1; ++qt) any = any || plan.seen(qt, kti) != PairSeen::None;
      if (!any) continue;
      const int j0 = kti * plan.kt, c = std::min(Tk, j0 + plan.kt) - j0;
      const int64_t kv_row = int64_t{b} * Tk + j0;
      // K^T [hs, c] and V [c, hs], packed.
      transpose(a.k + kv_row * a.ldkv + int64_t{g} * hs, a.ldkv, c, hs, sc.kt.data(), c);
      copy_rows(sc.kc.data(), a.v + kv_row * a.ldkv + int64_t{g} * hs, a.ldkv, c, hs);
      for (int qt = qt0; qt < qt1; ++qt) {
        const PairSeen vis = plan.seen(qt, kti);
        if (vis == PairSeen::None) continue;
        const int t0 = (qt - qt0) * kQueryTile;  // the tile's first row in the piece
        const int r = std::min(rows - t0, kQueryTile);
        // The tile in columns: S^T[c, r] = scale * K Q^T, so that the softmax over the keys of a
        // query runs down a column (vertical maxima and sums, no reductions across a vector).
        float* st = sc.s.data();
        gemm(true, false, c, r, hs, plan.scale, sc.kt.data(), c, sc.qt.data() + int64_t{t0} * hs, r,
             0.0f, st, r);
        float* mt = m + t0;
        float* lt = l + t0;
        float* cmax = sc.cmax.data();
        float* csum = sc.csum.data();
        float* alpha = sc.alpha.data();
        std::fill(cmax, cmax + r, kNegInf);
        if (vis == PairSeen::Some) {
          int64_t* qp = sc.qpos.data();
          for (int i = 0; i < r; ++i) qp[i] = plan.qp[i0 + t0 + i];
          for (int j = 0; j < c; ++j) {
            float* sj = st + int64_t{j} * r;
            const int64_t kp = plan.kp[j0 + j];
#pragma omp simd
            for (int i = 0; i < r; ++i) {
              const float x = kp <= qp[i] ? sj[i] : kNegInf;
              sj[i] = x;
              cmax[i] = cmax[i] > x ? cmax[i] : x;
            }
          }
        } else {
          for (int j = 0; j < c; ++j) {
            const float* sj = st + int64_t{j} * r;
#pragma omp simd
            for (int i = 0; i < r; ++i) cmax[i] = cmax[i] > sj[i] ? cmax[i] : sj[i];
          }
        }
        // New maxima; alpha rescales what was summed under the old one (1 where it holds).
        for (int i = 0; i < r; ++i) {
          const float mn = std::max(mt[i], cmax[i]);
          alpha[i] = mn == mt[i] ? 1.0f : mt[i] == kNegInf ? 0.0f : detail::exp_f(mt[i] - mn);
          mt[i] = mn;
          csum[i] = 0.0f;
        }
        // P^T = e^(S^T - m) (0 where not seen: -inf, also where a column has seen no key yet)
        if (vis == PairSeen::Some) {
          for (int j = 0; j < c; ++j) {
            float* sj = st + int64_t{j} * r;
#pragma omp simd
            for (int i = 0; i < r; ++i) {
              const float e = sj[i] == kNegInf ? 0.0f : detail::exp_f(sj[i] - mt[i]);
              sj[i] = e;
              csum[i] += e;
            }
          }
        } else {
          for (int j = 0; j < c; ++j) {
            float* sj = st + int64_t{j} * r;
#pragma omp simd
            for (int i = 0; i < r; ++i) {
              const float e = detail::exp_f(sj[i] - mt[i]);
              sj[i] = e;
              csum[i] += e;
            }
          }
        }
        float* ot = o + int64_t{t0} * hs;
        for (int i = 0; i < r; ++i) {
          lt[i] = lt[i] * alpha[i] + csum[i];
          if (alpha[i] != 1.0f) {
            float* oi = ot + int64_t{i} * hs;
#pragma omp simd
            for (int x = 0; x < hs; ++x) oi[x] *= alpha[i];
          }
        }
        if (plan.dropping) {
          const uint64_t* rows_idx = sc.row.data() + t0;
          for (int j = 0; j < c; ++j) {
            float* sj = st + int64_t{j} * r;
            const uint64_t kp = static_cast<uint64_t>(plan.kp[j0 + j]);
            for (int i = 0; i < r; ++i)
              if (philox_uniform(plan.seed, plan.stream, rows_idx[i] + kp) > plan.p)
                sj[i] *= plan.keep_scale;
              else
                sj[i] = 0.0f;
          }
        }
        // O[r, hs] += P V (P^T is the tile held)
        gemm(true, false, r, hs, c, 1.0f, st, r, sc.kc.data(), hs, 1.0f, ot, hs);
      }
    }
    for (int i = 0; i < rows; ++i) {
      const float* oi = o + int64_t{i} * hs;
      float* dst = out0 + int64_t{i} * ldo;
      if (l[i] == 0.0f) {
        std::fill(dst, dst + hs, 0.0f);
        lse0[i] = kNegInf;
        continue;
      }
      const float inv = 1.0f / l[i];
#pragma omp simd
      for (int x = 0; x < hs; ++x) dst[x] = oi[x] * inv;
      lse0[i] = m[i] + std::log(l[i]);
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
  const FlashPlan plan = make_plan(a);
  const int hs = plan.hs, NH = plan.NH, Tq = plan.Tq, Tk = plan.Tk, kt = plan.kt;
  checked_ld(a.ldq, int64_t{NH} * hs, "query");
  checked_ld(a.ldkv, int64_t{plan.KV} * hs, "key/value");
  checked_ld(lddo, int64_t{NH} * hs, "output gradient");
  checked_ld(lddq, int64_t{NH} * hs, "query gradient");
  checked_ld(lddkv, int64_t{plan.KV} * hs, "key/value gradient");
  const int64_t tile = int64_t{kt} * hs;
  // Piece (b, key/value head g) with all of g's query heads: the only writer of its dK, dV and of
  // its query heads' dQ. Within it: blocks of kKeyTilesPerBlock key tiles, then query heads, then
  // query tiles, then the block's key tiles. A block's K^T, V^T and K are packed once and its
  // dK^T, dV^T summed in tiles, added to dk, dv at the end of the block; a query tile's Q and dO
  // are packed once a block and its dQ summed over the block's key tiles, then added to dq. The
  // scratch of a block stays in L2 while the query side streams past it once a block.
  const int blocks = (plan.nkt + kKeyTilesPerBlock - 1) / kKeyTilesPerBlock;
  for_each_piece(int64_t{plan.B} * plan.KV, plan, [&](int64_t piece, TileScratch& sc) {
    const int g = static_cast<int>(piece % plan.KV), b = static_cast<int>(piece / plan.KV);
    for (int kb = 0; kb < blocks; ++kb) {
      const int kt0 = kb * kKeyTilesPerBlock, kt1 = std::min(plan.nkt, kt0 + kKeyTilesPerBlock);
      bool any = false;
      for (int qt = 0; qt < plan.nqt && !any; ++qt)
        for (int kti = kt0; kti < kt1 && !any; ++kti) any = plan.seen(qt, kti) != PairSeen::None;
      if (!any) continue;
      // Packed per key tile n of the block: K^T and V^T [hs, c], K [c, hs]; dK^T, dV^T [hs, c].
      for (int kti = kt0; kti < kt1; ++kti) {
        const int j0 = kti * kt, c = std::min(Tk, j0 + kt) - j0;
        const int64_t n = kti - kt0, kv_row = int64_t{b} * Tk + j0;
        const float* k = a.k + kv_row * a.ldkv + int64_t{g} * hs;
        transpose(k, a.ldkv, c, hs, sc.kt.data() + n * tile, c);
        transpose(a.v + kv_row * a.ldkv + int64_t{g} * hs, a.ldkv, c, hs, sc.vt.data() + n * tile,
                  c);
        copy_rows(sc.kc.data() + n * tile, k, a.ldkv, c, hs);
        std::fill(sc.acc1.data() + n * tile, sc.acc1.data() + (n + 1) * tile, 0.0f);
        std::fill(sc.acc2.data() + n * tile, sc.acc2.data() + (n + 1) * tile, 0.0f);
      }
      for (int h = g * plan.G; h < (g + 1) * plan.G; ++h) {
        const float* lrow = lse + (int64_t{b} * NH + h) * Tq;
        const float* drow = delta + (int64_t{b} * NH + h) * Tq;
        for (int qt = 0; qt < plan.nqt; ++qt) {
          bool seen_any = false;
          for (int kti = kt0; kti < kt1 && !seen_any; ++kti)
            seen_any = plan.seen(qt, kti) != PairSeen::None;
          if (!seen_any) continue;
          const int i0 = qt * kQueryTile, r = std::min(Tq, i0 + kQueryTile) - i0;
          const int64_t q_row = int64_t{b} * Tq + i0;
          float* q = sc.qt.data();                     // Q [r, hs]
          float* go = q + int64_t{kQueryTile} * hs;    // dO [r, hs]
          float* dqa = go + int64_t{kQueryTile} * hs;  // dQ [r, hs] of this block's keys
          copy_rows(q, a.q + q_row * a.ldq + int64_t{h} * hs, a.ldq, r, hs);
          copy_rows(go, dout + q_row * lddo + int64_t{h} * hs, lddo, r, hs);
          std::fill(dqa, dqa + int64_t{r} * hs, 0.0f);
          for (int kti = kt0; kti < kt1; ++kti) {
            const PairSeen vis = plan.seen(qt, kti);
            if (vis == PairSeen::None) continue;
            const int j0 = kti * kt, c = std::min(Tk, j0 + kt) - j0;
            const int64_t n = kti - kt0;
            float* s = sc.s.data();    // S, then P
            float* dp = sc.d.data();   // dP, then dS
            float* pd = sc.pd.data();  // the dropout factors, then P with dropout
            // S[r, c] = scale * Q K^T, then P = e^(S - lse) (0 where not seen)
            gemm(false, false, r, c, hs, plan.scale, q, hs, sc.kt.data() + n * tile, c, 0.0f, s, c);
            for (int i = 0; i < r; ++i)
              probabilities_row(s + int64_t{i} * c, c, lrow[i0 + i], vis == PairSeen::Some, a.k_pos,
                                j0, plan.qp[i0 + i]);
            // dP[r, c] = dO V^T
            gemm(false, false, r, c, hs, 1.0f, go, hs, sc.vt.data() + n * tile, c, 0.0f, dp, c);
            if (plan.dropping) {
              // dP of the dropped probabilities times the mask factors; pd = P * factors.
              for (int i = 0; i < r; ++i) {
                float* pi = pd + int64_t{i} * c;
                float* di = dp + int64_t{i} * c;
                const float* si = s + int64_t{i} * c;
                dropout_factors(pi, c, plan, plan.mask_row(b, h, plan.qp[i0 + i]), j0);
#pragma omp simd
                for (int j = 0; j < c; ++j) {
                  di[j] *= pi[j];
                  pi[j] *= si[j];
                }
              }
            }
            // dV^T[hs, c] += dO^T Pd
            gemm(true, false, hs, c, r, 1.0f, go, hs, plan.dropping ? pd : s, c, 1.0f,
                 sc.acc2.data() + n * tile, c);
            // dS = P * (dP - delta)
            for (int i = 0; i < r; ++i) {
              float* di = dp + int64_t{i} * c;
              const float* si = s + int64_t{i} * c;
              const float de = drow[i0 + i];
#pragma omp simd
              for (int j = 0; j < c; ++j) di[j] = si[j] * (di[j] - de);
            }
            // dK^T[hs, c] += scale * Q^T dS; dQ[r, hs] += scale * dS K
            gemm(true, false, hs, c, r, plan.scale, q, hs, dp, c, 1.0f, sc.acc1.data() + n * tile,
                 c);
            gemm(false, false, r, hs, c, plan.scale, dp, c, sc.kc.data() + n * tile, hs, 1.0f, dqa,
                 hs);
          }
          for (int i = 0; i < r; ++i) {
            float* d = dq + (q_row + i) * lddq + int64_t{h} * hs;
            const float* x = dqa + int64_t{i} * hs;
#pragma omp simd
            for (int e = 0; e < hs; ++e) d[e] += x[e];
          }
        }
      }
      for (int kti = kt0; kti < kt1; ++kti) {
        const int j0 = kti * kt, c = std::min(Tk, j0 + kt) - j0;
        const int64_t n = kti - kt0, kv_row = int64_t{b} * Tk + j0;
        add_transposed(sc.acc1.data() + n * tile, c, c, hs, dk + kv_row * lddkv + int64_t{g} * hs,
                       lddkv, sc.pd.data());
        add_transposed(sc.acc2.data() + n * tile, c, c, hs, dv + kv_row * lddkv + int64_t{g} * hs,
                       lddkv, sc.pd.data());
      }
    }
  });
}

}  // namespace tessera::kernels
