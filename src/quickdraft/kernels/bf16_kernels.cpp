// quickdraft's CPU decode kernels: the weight products and the attention of steps of a few rows,
// a whole Llama-family forward over them, and top-p's cut of sampled rows. Each computes a row the
// same way whatever the other rows, the batch or the cache window: exact mode's row and batch
// invariance hold by construction.
//
// Built for one of three instruction sets, chosen by the build (kernels/__init__.py):
// - AMX-BF16 (Intel Sapphire Rapids on): the bf16 weight products on tile registers, 16 rows for
//   the price of one; everything else as AVX512-BF16;
// - AVX512-BF16 (Zen 4, Intel Cooper Lake and Sapphire Rapids on): 16 fp32 lanes, bf16 dot
//   products (vdpbf16ps);
// - AVX2 + FMA (every x86-64 CPU since ~2013): 8 lanes, bf16 weights widened to fp32 by a shift.
// The bits differ between them (another summation order), never between rows or calls on one.
//
// quickdraft::linear_bf16: y = x @ W^T (+ bias) for a few rows of bf16 activations against a
// bf16 weight packed once. Why our own product: for 1-33 rows the library kernels cost 2-3x more
// at 5 rows than at 1 (embedded target, Zen 4, 1 thread), while the weights - the step's real
// cost - are read once either way. Here each column block of the weight is streamed once per tile
// of rows, so extra rows cost compute only, and every output element is the same sequence of
// instructions whatever the number of rows, its place among them or the thread count: a row's
// bits do not depend on its neighbours.
//
// A draft's products may instead take int8 weights (pack_int8, AVX-512 VNNI builds): see "int8 weight
// products" below.
//
// Packed layout [ceil(N/64), K/2, 64, 2]: for each block of 64 output columns and each pair of
// inputs (2p, 2p+1), the 64 columns' two weights side by side - one 256-byte line per pair, as
// _mm512_dpbf16_ps consumes them (K even; N padded with zero columns). fp32 weights: [ceil(N/64), K, 64].
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kBlockColumns = 64;

// ---- sharing work among threads -------------------------------------------------------------
// A thread takes at least this much work (bytes of weights or keys and values read, times rows): a
// product or attention too small to share runs on the calling thread, where a fork and join of the
// thread pool would cost more than the work (a draft's 112-wide layers: a few µs each). Which thread
// computes a column or a head never changes its bits, so neither does this. 64 KiB: on the embedded
// pair at 2 threads (Zen 4), speculative decoding +1-6% against sharing every call, plain decoding
// level; at 256 KiB the target's own 1-row products stay on one thread and plain decoding lost 10%.
std::atomic<int64_t> g_min_task_work{64 * 1024};

template <typename F>
void parallel_tasks(int64_t tasks, int64_t task_work, const F& f) {
  const int64_t min_work = g_min_task_work.load(std::memory_order_relaxed);
  const int64_t grain = std::max<int64_t>(1, (min_work + task_work - 1) / std::max<int64_t>(task_work, 1));
  if (tasks < 2 * grain) {  // not enough for two threads: no fork at all
    if (tasks > 0) f(int64_t{0}, tasks);
    return;
  }
  at::parallel_for(0, tasks, grain, f);
}

// ---- the vector unit ------------------------------------------------------------------------
// What the attention, the norms and the forward need of a SIMD register of fp32 lanes. load/store
// with a count n read or write min(n, kLanes) lanes (the tail of a row); bf16 is widened on load
// and rounded to nearest even on store, as torch rounds.
#if defined(__AVX512BF16__)
struct Simd {
  using V = __m512;
  static constexpr int64_t kLanes = 16;
  static __mmask16 keep(int64_t n) { return n >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1); }
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float v) { return _mm512_set1_ps(v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V min(V a, V b) { return _mm512_min_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }    // a * b + c
  static V fnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a * b
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V load(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(keep(n), p); }
  static V first(V v, int64_t n) { return _mm512_maskz_mov_ps(keep(n), v); }  // lanes past n zeroed
  static void store(float* p, int64_t n, V v) { _mm512_mask_storeu_ps(p, keep(n), v); }
  static V load(const at::BFloat16* p, int64_t n) {
    return _mm512_cvtpbh_ps((__m256bh)_mm256_maskz_loadu_epi16(keep(n), p));
  }
  static V load(const at::BFloat16* p) { return _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static void store(at::BFloat16* p, int64_t n, V v) {
    _mm256_mask_storeu_epi16(p, keep(n), (__m256i)_mm512_cvtneps_pbh(v));
  }
  static V round_bf16(V v) { return _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(v)); }
  static float sum(V v) { return _mm512_reduce_add_ps(v); }
  static float top(V v) { return _mm512_reduce_max_ps(v); }
  static bool any_nan(V v) { return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0; }
  static uint32_t above(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }     // lanes where a > b
  static uint32_t at_least(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }  // lanes where a >= b
  static V round_nearest(V v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V scale2(V p, V n) { return _mm512_scalef_ps(p, n); }  // p * 2^n
  // Column j of the kLanes x kLanes block r (lane j of every r[i]) to out + j * kLanes, for j < count:
  // pairs of rows interleaved, then pairs of pairs, then 128-bit quarters gathered across groups of
  // four and of eight rows.
  static void transpose_into(const V (&r)[kLanes], float* out, int64_t count) {
    V t[16], u[16];
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int k = 0; k < 4; ++k) {  // u[4k + c]: rows 4k..4k+3 of column 4 * quarter + c
      const auto pd = [](V v) { return _mm512_castps_pd(v); };
      u[4 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[4 * k]), pd(t[4 * k + 2])));
      u[4 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[4 * k]), pd(t[4 * k + 2])));
      u[4 * k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[4 * k + 1]), pd(t[4 * k + 3])));
      u[4 * k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[4 * k + 1]), pd(t[4 * k + 3])));
    }
    for (int c = 0; c < 4; ++c) {
      t[c] = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
      t[4 + c] = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
      t[8 + c] = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
      t[12 + c] = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
    }
    const auto put = [&](int j, V column) {
      if (j < count) _mm512_storeu_ps(out + j * kLanes, column);
    };
    for (int c = 0; c < 4; ++c) {
      put(c, _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88));
      put(8 + c, _mm512_shuffle_f32x4(t[c], t[8 + c], 0xDD));
      put(4 + c, _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0x88));
      put(12 + c, _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0xDD));
    }
  }
};
#else
struct Simd {
  using V = __m256;
  static constexpr int64_t kLanes = 8;
  static __m256i keep(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(n, 8))),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float v) { return _mm256_set1_ps(v); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V min(V a, V b) { return _mm256_min_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V fnmadd(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V load(const float* p, int64_t n) { return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, keep(n)); }
  static V first(V v, int64_t n) { return _mm256_and_ps(v, _mm256_castsi256_ps(keep(n))); }  // lanes past n zeroed
  static void store(float* p, int64_t n, V v) {
    if (n >= 8) _mm256_storeu_ps(p, v);
    else _mm256_maskstore_ps(p, keep(n), v);
  }
  static V widen(__m128i bf16) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bf16), 16)); }
  static V load(const at::BFloat16* p) { return widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static V load(const at::BFloat16* p, int64_t n) {
    if (n >= 8) return load(p);
    uint16_t part[8] = {};
    std::memcpy(part, p, 2 * n);
    return widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(part)));
  }
  // The bf16 nearest v (ties to even; a NaN stays a quiet NaN) in the high half of each lane.
  static __m256i rounded_bits(V v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(rounded, _mm256_or_si256(bits, _mm256_set1_epi32(0x00400000)), nan);
  }
  static void store(at::BFloat16* p, int64_t n, V v) {
    const __m256i high = _mm256_srli_epi32(rounded_bits(v), 16);
    const __m128i halves = _mm_packus_epi32(_mm256_castsi256_si128(high), _mm256_extracti128_si256(high, 1));
    if (n >= 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p), halves);
      return;
    }
    uint16_t part[8];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(part), halves);
    std::memcpy(p, part, 2 * n);
  }
  static V round_bf16(V v) {
    return _mm256_castsi256_ps(_mm256_and_si256(rounded_bits(v), _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
  static float sum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float top(V v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static bool any_nan(V v) { return _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0; }
  static uint32_t above(V a, V b) { return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ)); }
  static uint32_t at_least(V a, V b) { return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GE_OQ)); }
  static V round_nearest(V v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V scale2(V p, V n) {  // p * 2^n for integral n in [-126, 127]: the exponent built directly
    const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
  }
  static void transpose_into(const V (&r)[kLanes], float* out, int64_t count) {  // column j to out + j * kLanes, j < count
    V t[8], u[8];
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int k = 0; k < 2; ++k) {
      u[4 * k] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], 0x44);
      u[4 * k + 1] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], 0xEE);
      u[4 * k + 2] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0x44);
      u[4 * k + 3] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) {
      if (c < count) _mm256_storeu_ps(out + c * kLanes, _mm256_permute2f128_ps(u[c], u[4 + c], 0x20));
      if (4 + c < count) _mm256_storeu_ps(out + (4 + c) * kLanes, _mm256_permute2f128_ps(u[c], u[4 + c], 0x31));
    }
  }
};
#endif

using V = Simd::V;
constexpr int64_t kLanes = Simd::kLanes;

// ---- weight products ------------------------------------------------------------------------
#if defined(__AVX512BF16__)
constexpr int64_t kTileRows = 6;  // 6 rows x 4 accumulators + 4 weight registers + 1 broadcast <= 32 zmm
// A tile of several rows spends as long on a line's dot products (24 for 6 rows) as memory takes to
// bring it: left to the hardware prefetcher, the two did not overlap well. Each step of such a tile
// prefetches the line 32 pairs (8 KB) ahead, a fixed distance that runs on into the next block.
// Measured on the embedded target (Zen 4, 1 thread, 5 processes alternating, medians): 4-, 6- and
// 8-row forwards 8-9% faster (a 6-row verify 1,094 -> 1,004 us), 1 row level; 48 pairs the same. A
// lone row is memory-bound and prefetching did not move it. The bits are the same: only loads move.
constexpr int64_t kPrefetchPairs = 32;

template <int Rows>
void tile(const uint32_t* x, int64_t x_stride, const __m512i* weights, int64_t pairs, const float* bias,
          at::BFloat16* y, int64_t y_stride, int64_t columns) {
  __m512 acc[Rows * 4];  // one dimension, as the AVX2 tiles (whose [Rows][Vecs] GCC 12 kept on the stack)
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < 4; ++c) acc[r * 4 + c] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512i* line = weights + 4 * p;
    if constexpr (Rows >= 2) {  // the line kPrefetchPairs ahead, into L1 (past the weights' end: harmless)
      const char* ahead = reinterpret_cast<const char*>(line + 4 * kPrefetchPairs);
      for (int b = 0; b < 256; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
    }
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(line);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(line + 1);
    const __m512bh w2 = (__m512bh)_mm512_loadu_si512(line + 2);
    const __m512bh w3 = (__m512bh)_mm512_loadu_si512(line + 3);
    for (int r = 0; r < Rows; ++r) {
      const __m512bh xp = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[r * x_stride + p]));
      acc[r * 4 + 0] = _mm512_dpbf16_ps(acc[r * 4 + 0], xp, w0);
      acc[r * 4 + 1] = _mm512_dpbf16_ps(acc[r * 4 + 1], xp, w1);
      acc[r * 4 + 2] = _mm512_dpbf16_ps(acc[r * 4 + 2], xp, w2);
      acc[r * 4 + 3] = _mm512_dpbf16_ps(acc[r * 4 + 3], xp, w3);
    }
  }
  for (int c = 0; c < 4; ++c) {
    const int64_t first = c * 16;
    if (first >= columns) break;
    const __m512 b = bias ? Simd::load(bias + first, columns - first) : _mm512_setzero_ps();
    for (int r = 0; r < Rows; ++r) Simd::store(y + r * y_stride + first, columns - first, _mm512_add_ps(acc[r * 4 + c], b));
  }
}

using Tile = void (*)(const uint32_t*, int64_t, const __m512i*, int64_t, const float*, at::BFloat16*, int64_t, int64_t);
constexpr Tile kTiles[kTileRows + 2] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>, tile<7>};

// The rows of the int8 tile that starts at row r of m: up to kTileRows, except that the last seven go
// as 4 + 3, never 6 + 1. A lone row's tile keeps 4 accumulators, fewer than the dot product's latency
// in cycles, so its pass over the block costs 6 cycles a pair where 4 + 3 rows pay 4 for the row
// (measured on the bf16 tiles, embedded target, Zen 4: a 7-row step cost 2.1x a 1-row one against
// 1.66x for 6 rows; they now take seven rows in one tile, bf16_tile_rows). Every row is the same
// instructions in any tile: its bits do not change.
inline int64_t int8_tile_rows(int64_t r, int64_t m) {
  const int64_t left = m - r;
  return left == kTileRows + 1 ? (left + 1) / 2 : std::min(kTileRows, left);
}

// The bf16 products' rows: the last seven in one tile. 7 x 4 accumulators and 4 weight registers fill
// the 32 (GCC 12 keeps one accumulator on the stack), and the weights are read once where 4 + 3 rows
// read them twice, the second time from L2: a 7-row step of the embedded target cost 1,340-1,420 us
// as 4 + 3 and 1,120-1,280 as one tile, against ~1,000 for 6 rows (Zen 4, 1 thread). A 7-row verify
// (6 drafts) then costs its rows' arithmetic, not a second pass. The bits are the same in any tile.
inline int64_t bf16_tile_rows(int64_t r, int64_t m) {
  return m - r == kTileRows + 1 ? kTileRows + 1 : std::min(kTileRows, m - r);
}

#if defined(__AMX_BF16__)
// AMX (Intel Sapphire Rapids on): each 64-column block is four 16 x 16 fp32 accumulator tiles, fed
// 16 input pairs at a time - an A tile of 16 rows x 32 inputs against a B tile of the block's 16
// lines of one 16-column quarter, read in place from the packed layout (a line is 256 bytes, a
// quarter 64 of them: the VNNI layout tdpbf16ps consumes). A tile costs the same for 1 row as for
// 16, so a verify or a batch of up to 16 rows costs about what one row does, where the AVX-512
// tiles above pay each row's multiply-adds. Fewer than 16 rows run on tiles of that many rows (a
// draft model's 1-row step, its weights in L2, is ~15% faster so); more go in groups of 16, zero
// rows padding the last. An element's sums never mix rows: a row's bits do not depend on the
// other rows, their count or the thread count. Linux lends a process the tile registers only
// on request (kernels/__init__.py asks before this library is chosen).
constexpr int64_t kAmxRows = 16;
constexpr int64_t kAmxPairs = 16;                      // input pairs per A/B tile
constexpr int64_t kAmxLineBytes = 4 * kBlockColumns;  // a packed line: 64 columns x one pair
constexpr int64_t kAmxQuarterBytes = 64;              // 16 columns x one pair

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: the block's accumulators and 4: A over 16 pairs, all of `rows` rows; 5: B over 16
// pairs; 6, 7: A and B over the last K/2 mod 16 pairs, when there are.
void configure_tiles(int64_t tail_pairs, int64_t rows) {
  TileConfig config;
  for (int t = 0; t < 6; ++t) {
    config.rows[t] = t == 5 ? kAmxRows : rows;
    config.colsb[t] = 64;
  }
  if (tail_pairs) {
    config.rows[6] = rows;
    config.colsb[6] = static_cast<uint16_t>(4 * tail_pairs);
    config.rows[7] = static_cast<uint8_t>(tail_pairs);
    config.colsb[7] = 64;
  }
  _tile_loadconfig(&config);
}

// One 64-column block for one group of rows: acc [16, 64] fp32 = panel rows @ the block. The tail
// repeats the main loop's body on tiles 6, 7: the intrinsics paste tile numbers into their assembly
// as literal tokens, so neither a function nor a template can take them as parameters.
template <bool Tail>
void amx_block(const char* panel, int64_t panel_stride, const char* block, int64_t full_steps, float* acc) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t s = 0; s < full_steps; ++s) {
    const char* a = panel + s * kAmxPairs * 4;
    const char* b = block + s * kAmxPairs * kAmxLineBytes;
    _tile_loadd(4, a, panel_stride);
    _tile_loadd(5, b, kAmxLineBytes);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(5, b + kAmxQuarterBytes, kAmxLineBytes);
    _tile_dpbf16ps(1, 4, 5);
    _tile_loadd(5, b + 2 * kAmxQuarterBytes, kAmxLineBytes);
    _tile_dpbf16ps(2, 4, 5);
    _tile_loadd(5, b + 3 * kAmxQuarterBytes, kAmxLineBytes);
    _tile_dpbf16ps(3, 4, 5);
  }
  if constexpr (Tail) {
    const char* a = panel + full_steps * kAmxPairs * 4;
    const char* b = block + full_steps * kAmxPairs * kAmxLineBytes;
    _tile_loadd(6, a, panel_stride);
    _tile_loadd(7, b, kAmxLineBytes);
    _tile_dpbf16ps(0, 6, 7);
    _tile_loadd(7, b + kAmxQuarterBytes, kAmxLineBytes);
    _tile_dpbf16ps(1, 6, 7);
    _tile_loadd(7, b + 2 * kAmxQuarterBytes, kAmxLineBytes);
    _tile_dpbf16ps(2, 6, 7);
    _tile_loadd(7, b + 3 * kAmxQuarterBytes, kAmxLineBytes);
    _tile_dpbf16ps(3, 6, 7);
  }
  constexpr int64_t stride = kBlockColumns * sizeof(float);
  _tile_stored(0, acc, stride);
  _tile_stored(1, acc + 16, stride);
  _tile_stored(2, acc + 32, stride);
  _tile_stored(3, acc + 48, stride);
}

// y [m, n_out] = x [m, K] @ W^T (+ bias, fp32), W packed [ceil(n_out/64), K/2, 64, 2].
void linear_rows(const at::BFloat16* x, int64_t m, const at::Tensor& packed, const float* bias, int64_t n_out,
                 at::BFloat16* y) {
  const int64_t pairs = packed.size(1), blocks = packed.size(0), k = 2 * pairs;
  const int64_t groups = (m + kAmxRows - 1) / kAmxRows;
  const int64_t full_steps = pairs / kAmxPairs, tail_pairs = pairs % kAmxPairs;
  // The rows in groups of 16, zero rows after the last: tiles never read past the activations.
  const int64_t panel_stride = k * static_cast<int64_t>(sizeof(at::BFloat16));
  std::vector<at::BFloat16> panel(groups * kAmxRows * k, at::BFloat16(0.0f));
  std::memcpy(panel.data(), x, m * panel_stride);
  const auto* weights = reinterpret_cast<const char*>(packed.data_ptr<at::BFloat16>());
  parallel_tasks(blocks, pairs * kBlockColumns * 4 * m, [&](int64_t begin, int64_t end) {
    configure_tiles(tail_pairs, std::min(m, kAmxRows));
    alignas(64) float acc[kAmxRows * kBlockColumns];
    for (int64_t block = begin; block < end; ++block) {
      const int64_t first = block * kBlockColumns;
      const int64_t columns = std::min(kBlockColumns, n_out - first);
      const char* w = weights + block * pairs * kAmxLineBytes;
      for (int64_t g = 0; g < groups; ++g) {
        const char* rows = reinterpret_cast<const char*>(panel.data()) + g * kAmxRows * panel_stride;
        if (tail_pairs) amx_block<true>(rows, panel_stride, w, full_steps, acc);
        else amx_block<false>(rows, panel_stride, w, full_steps, acc);
        const int64_t valid = std::min(kAmxRows, m - g * kAmxRows);
        for (int64_t c = 0; c < columns; c += kLanes) {
          const V b = bias ? Simd::load(bias + first + c, columns - c) : Simd::zero();
          for (int64_t r = 0; r < valid; ++r)
            Simd::store(y + (g * kAmxRows + r) * n_out + first + c, columns - c,
                        Simd::add(Simd::load(acc + r * kBlockColumns + c), b));
        }
      }
    }
    _tile_release();
  });
}
#else
// y [m, n_out] = x [m, K] @ W^T (+ bias, fp32), W packed [ceil(n_out/64), K/2, 64, 2].
void linear_rows(const at::BFloat16* x, int64_t m, const at::Tensor& packed, const float* bias, int64_t n_out,
                 at::BFloat16* y) {
  const int64_t pairs = packed.size(1), blocks = packed.size(0);
  const auto* xs = reinterpret_cast<const uint32_t*>(x);
  const auto* ws = reinterpret_cast<const __m512i*>(packed.data_ptr<at::BFloat16>());
  parallel_tasks(blocks, pairs * kBlockColumns * 4 * m, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t first = block * kBlockColumns;
      const int64_t columns = std::min(kBlockColumns, n_out - first);
      const __m512i* w = ws + block * pairs * 4;
      for (int64_t r = 0, n = 0; r < m; r += n) {
        n = bf16_tile_rows(r, m);
        kTiles[n](xs + r * pairs, pairs, w, pairs, bias ? bias + first : nullptr, y + r * n_out + first, n_out, columns);
      }
    }
  });
}

#endif  // __AMX_BF16__

// fp32 weights (no bf16 unit needed): each input k's 64 column weights in one 256-byte line,
// fused multiply-adds in input order.
template <int Rows>
void tile_f32(const float* x, int64_t x_stride, const float* weights, int64_t k, const float* bias, float* y,
              int64_t y_stride, int64_t columns) {
  __m512 acc[Rows * 4];  // one dimension, as the AVX2 tiles (whose [Rows][Vecs] GCC 12 kept on the stack)
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < 4; ++c) acc[r * 4 + c] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    const float* line = weights + kBlockColumns * p;
    const __m512 w0 = _mm512_loadu_ps(line), w1 = _mm512_loadu_ps(line + 16);
    const __m512 w2 = _mm512_loadu_ps(line + 32), w3 = _mm512_loadu_ps(line + 48);
    for (int r = 0; r < Rows; ++r) {
      const __m512 xp = _mm512_set1_ps(x[r * x_stride + p]);
      acc[r * 4 + 0] = _mm512_fmadd_ps(xp, w0, acc[r * 4 + 0]);
      acc[r * 4 + 1] = _mm512_fmadd_ps(xp, w1, acc[r * 4 + 1]);
      acc[r * 4 + 2] = _mm512_fmadd_ps(xp, w2, acc[r * 4 + 2]);
      acc[r * 4 + 3] = _mm512_fmadd_ps(xp, w3, acc[r * 4 + 3]);
    }
  }
  for (int c = 0; c < 4; ++c) {
    const int64_t first = c * 16;
    if (first >= columns) break;
    const __m512 b = bias ? Simd::load(bias + first, columns - first) : _mm512_setzero_ps();
    for (int r = 0; r < Rows; ++r) Simd::store(y + r * y_stride + first, columns - first, _mm512_add_ps(acc[r * 4 + c], b));
  }
}

using TileF32 = void (*)(const float*, int64_t, const float*, int64_t, const float*, float*, int64_t, int64_t);
constexpr TileF32 kTilesF32[kTileRows + 1] = {nullptr, tile_f32<1>, tile_f32<2>, tile_f32<3>, tile_f32<4>,
                                               tile_f32<5>, tile_f32<6>};

void linear_rows(const float* x, int64_t m, const at::Tensor& packed, const float* bias, int64_t n_out, float* y) {
  const int64_t k = packed.size(1), blocks = packed.size(0);
  const float* ws = packed.data_ptr<float>();
  parallel_tasks(blocks, k * kBlockColumns * 4 * m, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t first = block * kBlockColumns;
      const int64_t columns = std::min(kBlockColumns, n_out - first);
      for (int64_t r = 0; r < m; r += kTileRows) {
        const int64_t n = std::min(kTileRows, m - r);
        kTilesF32[n](x + r * k, k, ws + block * k * kBlockColumns, k, bias ? bias + first : nullptr,
                     y + r * n_out + first, n_out, columns);
      }
    }
  });
}
#else
// AVX2 has 16 ymm registers. A lone row takes a whole 64-column block per tile (8 independent
// accumulators keep the loads streaming); more rows go two at a time over each half of the block
// (2 x 4 accumulators + their 4 broadcast inputs + the weights). A 256-bit load of bf16 pairs
// holds 8 columns' weights for inputs 2p (the low halves: shifted up, their fp32 value) and
// 2p + 1 (the high halves: masked). Every output element is the fused multiply-adds of its inputs
// in input order, then the bias, whatever the tile: a row's bits do not depend on the others.
// While a block's tiles compute, they fetch the next block's lines into L2, each tile its share
// spread over its inputs: the memory streams under the arithmetic instead of stalling one tile on a
// burst of misses (before round 18 the first tile fetched the whole next block at once).
constexpr int64_t kTileRows = 2;
constexpr int64_t kTileRowsF32 = 3;  // fp32 weights are read from memory by the multiply-adds: 3 x 4 + 3
constexpr int64_t kHalfColumns = 32;
constexpr int64_t kLineBytes = 4 * kBlockColumns;  // one input line of a block, either layout

// A tile fetches `count` lines from `ahead` spread evenly over its `steps` inputs: at each input four
// 64-byte prefetches, at fixed-point positions, duplicates where the share is smaller. Without
// branches: a conditional prefetch in the loop made GCC keep the accumulators on the stack.
class Prefetch {
 public:
  Prefetch(const char* ahead, int64_t count, int64_t steps, const void* fallback)
      : at_(ahead ? ahead : static_cast<const char*>(fallback)),
        increment_(ahead && steps > 0 ? (count << 16) / steps : 0) {}
  void step() {
    for (int i = 0; i < 4; ++i) {
      _mm_prefetch(at_ + ((position_ >> 16) << 6), _MM_HINT_T1);
      position_ += increment_;
    }
  }

 private:
  const char* at_;
  int64_t increment_, position_ = 0;
};

template <int Rows, int Vecs>
void tile(const float* x, int64_t x_stride, const uint32_t* words, int64_t pairs, const float* bias,
          at::BFloat16* y, int64_t y_stride, int64_t columns, const char* ahead, int64_t ahead_lines) {
  __m256 acc[Rows * Vecs];  // one dimension: GCC 12 kept a [Rows][Vecs] array on the stack
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < Vecs; ++c) acc[r * Vecs + c] = _mm256_setzero_ps();
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  Prefetch prefetch(ahead, ahead_lines, pairs, words);
  for (int64_t p = 0; p < pairs; ++p) {
    prefetch.step();
    const auto* line = reinterpret_cast<const __m256i*>(words + kBlockColumns * p);
    __m256 even_x[Rows], odd_x[Rows];
    for (int r = 0; r < Rows; ++r) {
      even_x[r] = _mm256_broadcast_ss(x + r * x_stride + 2 * p);
      odd_x[r] = _mm256_broadcast_ss(x + r * x_stride + 2 * p + 1);
    }
    for (int c = 0; c < Vecs; ++c) {
      const __m256i w = _mm256_loadu_si256(line + c);
      const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
      const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(w, high));
      for (int r = 0; r < Rows; ++r) acc[r * Vecs + c] = _mm256_fmadd_ps(odd_x[r], odd, _mm256_fmadd_ps(even_x[r], even, acc[r * Vecs + c]));
    }
  }
  // Unrolled, so that every accumulator has a constant index: a loop over them here made GCC keep
  // the array on the stack through the products' loop too, a store per multiply-add.
#pragma GCC unroll 16
  for (int c = 0; c < Vecs; ++c) {
    const int64_t first = c * 8;
    if (first < columns) {
      const __m256 b = bias ? Simd::load(bias + first, columns - first) : _mm256_setzero_ps();
#pragma GCC unroll 16
      for (int r = 0; r < Rows; ++r) Simd::store(y + r * y_stride + first, columns - first, _mm256_add_ps(acc[r * Vecs + c], b));
    }
  }
}

template <int Rows, int Vecs>
void tile_f32(const float* x, int64_t x_stride, const float* weights, int64_t k, const float* bias, float* y,
              int64_t y_stride, int64_t columns, const char* ahead, int64_t ahead_lines) {
  __m256 acc[Rows * Vecs];  // one dimension: GCC 12 kept a [Rows][Vecs] array on the stack
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < Vecs; ++c) acc[r * Vecs + c] = _mm256_setzero_ps();
  Prefetch prefetch(ahead, ahead_lines, k, weights);
  for (int64_t p = 0; p < k; ++p) {
    prefetch.step();
    const float* line = weights + kBlockColumns * p;
    for (int r = 0; r < Rows; ++r) {
      const __m256 xp = _mm256_broadcast_ss(x + r * x_stride + p);
      for (int c = 0; c < Vecs; ++c) acc[r * Vecs + c] = _mm256_fmadd_ps(xp, _mm256_loadu_ps(line + 8 * c), acc[r * Vecs + c]);
    }
  }
  // Unrolled, so that every accumulator has a constant index: a loop over them here made GCC keep
  // the array on the stack through the products' loop too, a store per multiply-add.
#pragma GCC unroll 16
  for (int c = 0; c < Vecs; ++c) {
    const int64_t first = c * 8;
    if (first < columns) {
      const __m256 b = bias ? Simd::load(bias + first, columns - first) : _mm256_setzero_ps();
#pragma GCC unroll 16
      for (int r = 0; r < Rows; ++r) Simd::store(y + r * y_stride + first, columns - first, _mm256_add_ps(acc[r * Vecs + c], b));
    }
  }
}

using Tile = void (*)(const float*, int64_t, const uint32_t*, int64_t, const float*, at::BFloat16*, int64_t, int64_t,
                      const char*, int64_t);
using TileF32 = void (*)(const float*, int64_t, const float*, int64_t, const float*, float*, int64_t, int64_t,
                         const char*, int64_t);
// [1]: a lone row over the whole block; [n > 1]: n rows over half of it
constexpr Tile kTiles[kTileRows + 1] = {nullptr, tile<1, 8>, tile<2, 4>};
constexpr TileF32 kTilesF32[kTileRowsF32 + 1] = {nullptr, tile_f32<1, 8>, tile_f32<2, 4>, tile_f32<3, 4>};

// y [m, n_out] = x [m, K] @ W^T per 64-column block, rows in tiles of up to N - 1 (tiles[n]: n
// rows). W: lines input lines of kLineBytes per block.
template <typename T, typename W, typename TileFn, size_t N>
void linear_blocks(const float* x, int64_t m, int64_t k, const W* weights, int64_t lines, int64_t blocks,
                   const float* bias, int64_t n_out, T* y, const TileFn (&tiles)[N]) {
  constexpr auto tile_rows = static_cast<int64_t>(N - 1);
  parallel_tasks(blocks, lines * kBlockColumns * static_cast<int64_t>(sizeof(W)) * m, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const W* w = weights + block * lines * kBlockColumns;
      const int64_t first = block * kBlockColumns, columns = std::min(kBlockColumns, n_out - first);
      const float* block_bias = bias ? bias + first : nullptr;
      const char* next = block + 1 < end ? reinterpret_cast<const char*>(w + lines * kBlockColumns) : nullptr;
      // a lone row's tile covers the block, a group of rows' tiles half of it each
      const int64_t tiles_here = m / tile_rows * 2 + (m % tile_rows == 0 ? 0 : m % tile_rows == 1 ? 1 : 2);
      const int64_t share = (lines + tiles_here - 1) / tiles_here;
      int64_t fetched = 0;
      const auto run = [&](TileFn fn, int64_t r, int64_t half, int64_t cols) {
        const int64_t count = next ? std::min(share, lines - fetched) : 0;
        fn(x + r * k, k, w + half, lines, block_bias ? block_bias + half : nullptr, y + r * n_out + first + half, n_out,
           cols, count > 0 ? next + fetched * kLineBytes : nullptr, count);
        fetched += count;
      };
      for (int64_t r = 0; r < m; r += tile_rows) {
        const int64_t n = std::min(tile_rows, m - r);
        if (n == 1) {
          run(tiles[1], r, 0, columns);
          continue;
        }
        for (int64_t half = 0; half < columns; half += kHalfColumns)
          run(tiles[n], r, half, std::min(kHalfColumns, columns - half));
      }
    }
  });
}

void linear_rows(const at::BFloat16* x, int64_t m, const at::Tensor& packed, const float* bias, int64_t n_out,
                 at::BFloat16* y) {
  const int64_t pairs = packed.size(1), k = 2 * pairs;
  std::vector<float> widened(m * k);  // the activations in fp32 once, broadcast from there
  for (int64_t i = 0; i < m * k; i += kLanes) Simd::store(&widened[i], m * k - i, Simd::load(x + i, m * k - i));
  linear_blocks(widened.data(), m, k, reinterpret_cast<const uint32_t*>(packed.data_ptr<at::BFloat16>()), pairs,
                packed.size(0), bias, n_out, y, kTiles);
}

void linear_rows(const float* x, int64_t m, const at::Tensor& packed, const float* bias, int64_t n_out, float* y) {
  linear_blocks(x, m, packed.size(1), packed.data_ptr<float>(), packed.size(1), packed.size(0), bias, n_out, y,
                kTilesF32);
}
#endif

void check_packed(const at::Tensor& packed, int64_t k, int64_t n_out) {
  TORCH_CHECK(packed.scalar_type() == at::kBFloat16 && packed.dim() == 4 && packed.size(2) == kBlockColumns &&
              packed.size(3) == 2 && packed.is_contiguous(), "weight not packed by quickdraft.kernels.pack_bf16");
  TORCH_CHECK(k == 2 * packed.size(1) && n_out <= packed.size(0) * kBlockColumns &&
              n_out > (packed.size(0) - 1) * kBlockColumns, "shapes do not match the packed weight");
}

void check_packed_f32(const at::Tensor& packed, int64_t k, int64_t n_out) {
  TORCH_CHECK(packed.scalar_type() == at::kFloat && packed.dim() == 3 && packed.size(2) == kBlockColumns &&
              packed.is_contiguous(), "weight not packed by quickdraft.kernels.pack_f32");
  TORCH_CHECK(k == packed.size(1) && n_out <= packed.size(0) * kBlockColumns &&
              n_out > (packed.size(0) - 1) * kBlockColumns, "shapes do not match the packed weight");
}

inline void check_packed_for(const at::BFloat16*, const at::Tensor& packed, int64_t k, int64_t n) { check_packed(packed, k, n); }
inline void check_packed_for(const float*, const at::Tensor& packed, int64_t k, int64_t n) { check_packed_f32(packed, k, n); }

// ---- int8 weight products (a draft's: its guesses, never the target's logits) -----------------
// A draft's step streams its weights for one or a few rows: int8 weights halve the bytes of bf16.
// Each weight column has its own scale (symmetric, 127 levels), each activation row its own (the
// row's largest magnitude over 127, rounded to nearest), shifted by 128 to unsigned bytes for
// vpdpbusd, whose sums of four u8 x s8 products never saturate; the shift comes back out as 128 x
// the column's weight sum. A row's quantisation and sums are its own: its result does not depend on
// the other rows, as for the bf16 products.
//
// Packed layout, one int8 tensor [ceil(N/64), K/4 * 256 + 512] (K a multiple of 4): per block of 64
// output columns, K/4 lines of the 64 columns' four consecutive input weights, then the columns'
// fp32 scales, then their int32 offsets (128 x the column's sum). Built by kernels.pack_int8.
//
// int4 weights (kernels.pack_int4, uint8 tensors) halve the bytes again: 15 levels (-7..7) per
// column, each line's four 64-byte vectors folded into two, byte j of the first holding vector 0's
// level + 8 in its low nibble and vector 1's in its high one (the second likewise vectors 2 and 3).
// The tile multiplies by the stored nibbles and takes the 8 back out of each row's sums once: the
// same integer sums as int8's, without a subtraction per weight vector (int4 products 8-13% faster
// at 1 row, Zen 4).
constexpr int64_t kInt8Line = 4 * kBlockColumns;
constexpr int64_t kInt4Line = 2 * kBlockColumns;
constexpr int64_t kInt8Trailer = 2 * kBlockColumns * 4;

void check_packed_int8(const at::Tensor& packed, int64_t k, int64_t n_out) {
  const bool nibbles = packed.scalar_type() == at::kByte;
  TORCH_CHECK((nibbles || packed.scalar_type() == at::kChar) && packed.dim() == 2 && packed.is_contiguous(),
              "weight not packed by quickdraft.kernels.pack_int8 or pack_int4");
  TORCH_CHECK(k % 4 == 0 && packed.size(1) == k / 4 * (nibbles ? kInt4Line : kInt8Line) + kInt8Trailer &&
              n_out <= packed.size(0) * kBlockColumns && n_out > (packed.size(0) - 1) * kBlockColumns,
              "shapes do not match the packed int8 or int4 weight");
}

#if defined(__AVX512VNNI__)
constexpr bool kInt8Products = true;

// Row r of x [m, k] as k unsigned bytes round(x * 127 / max|x|) + 128, its scale max|x| / 127 and
// the sum of its bytes (what an int4 product takes back out: tile_int8).
template <typename T>
void quantize_rows(const T* x, int64_t m, int64_t k, uint8_t* q, float* scale, int32_t* byte_sum) {
  for (int64_t r = 0; r < m; ++r) {
    const T* row = x + r * k;
    V top = Simd::zero();
    for (int64_t i = 0; i < k; i += kLanes) {
      const V v = Simd::load(row + i, k - i);
      top = Simd::max(top, Simd::max(v, Simd::sub(Simd::zero(), v)));
    }
    const float largest = Simd::top(top);
    scale[r] = largest > 0.0f ? largest / 127.0f : 1.0f;
    const V inverse = Simd::set1(largest > 0.0f ? 127.0f / largest : 0.0f);
    __m512i sum = _mm512_setzero_si512();
    for (int64_t i = 0; i < k; i += kLanes) {
      const __m512i levels = _mm512_maskz_add_epi32(
          Simd::keep(k - i), _mm512_cvtps_epi32(Simd::round_nearest(Simd::mul(Simd::load(row + i, k - i), inverse))),
          _mm512_set1_epi32(128));
      _mm512_mask_cvtusepi32_storeu_epi8(q + r * k + i, Simd::keep(k - i), levels);
      sum = _mm512_add_epi32(sum, levels);
    }
    byte_sum[r] = _mm512_reduce_add_epi32(sum);
  }
}

// A line's four weight vectors: int8's read as they are; int4's unpacked to their stored nibbles
// (level + 8, in 1..15). The 8 is not taken off here: it comes back out of the sums once per row
// (8 x the row's sum of activation bytes, ``level_shift``), integer arithmetic, so the same sums.
template <bool Nibbles>
inline void weight_line(const __m512i* weights, int64_t q, __m512i (&w)[4]) {
  if constexpr (Nibbles) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    const __m512i* line = weights + 2 * q;
    const __m512i a = _mm512_loadu_si512(line), b = _mm512_loadu_si512(line + 1);
    w[0] = _mm512_and_si512(a, low);
    w[1] = _mm512_and_si512(_mm512_srli_epi16(a, 4), low);
    w[2] = _mm512_and_si512(b, low);
    w[3] = _mm512_and_si512(_mm512_srli_epi16(b, 4), low);
  } else {
    const __m512i* line = weights + 4 * q;
    for (int i = 0; i < 4; ++i) w[i] = _mm512_loadu_si512(line + i);
  }
}

template <int Rows, typename T, bool Nibbles>
void tile_int8(const uint32_t* x, int64_t x_stride, const __m512i* weights, int64_t quads, const float* row_scale,
               const int32_t* level_shift, const char* trailer, const float* bias, T* y, int64_t y_stride,
               int64_t columns) {
  // __v16si, not __m512i: the intrinsic reads and returns its accumulator as 16 ints through casts,
  // and an __m512i array accessed so stayed in memory under GCC 12 (stored every step: a 6-row tile
  // ran at half the speed of a 4-row one); value casts of a __v16si array let it live in registers.
  __v16si acc[Rows * 4];
  for (int i = 0; i < Rows * 4; ++i) acc[i] = (__v16si)_mm512_setzero_si512();
  for (int64_t q = 0; q < quads; ++q) {
    __m512i w[4];
    weight_line<Nibbles>(weights, q, w);
    for (int r = 0; r < Rows; ++r) {
      const __m512i xq = _mm512_set1_epi32(static_cast<int>(x[r * x_stride + q]));
      for (int c = 0; c < 4; ++c) acc[r * 4 + c] = (__v16si)_mm512_dpbusd_epi32((__m512i)acc[r * 4 + c], xq, w[c]);
    }
  }
  const auto* column_scale = reinterpret_cast<const float*>(trailer);
  const auto* offset = reinterpret_cast<const int32_t*>(trailer + kBlockColumns * 4);
  for (int c = 0; c < 4; ++c) {
    const int64_t first = c * 16;
    if (first >= columns) break;
    const __m512 s = _mm512_loadu_ps(column_scale + first);
    const __m512i o = _mm512_loadu_si512(offset + first);
    const __m512 b = bias ? Simd::load(bias + first, columns - first) : _mm512_setzero_ps();
    for (int r = 0; r < Rows; ++r) {
      __m512i exact = _mm512_sub_epi32((__m512i)acc[r * 4 + c], o);
      if constexpr (Nibbles) exact = _mm512_sub_epi32(exact, _mm512_set1_epi32(level_shift[r]));
      const __m512 sums = _mm512_cvtepi32_ps(exact);
      Simd::store(y + r * y_stride + first, columns - first,
                  _mm512_add_ps(_mm512_mul_ps(sums, _mm512_mul_ps(s, _mm512_set1_ps(row_scale[r]))), b));
    }
  }
}

template <typename T>
using TileInt8 = void (*)(const uint32_t*, int64_t, const __m512i*, int64_t, const float*, const int32_t*, const char*,
                          const float*, T*, int64_t, int64_t);
template <typename T, bool Nibbles>
constexpr TileInt8<T> kTilesInt8[kTileRows + 1] = {
    nullptr, tile_int8<1, T, Nibbles>, tile_int8<2, T, Nibbles>, tile_int8<3, T, Nibbles>,
    tile_int8<4, T, Nibbles>, tile_int8<5, T, Nibbles>, tile_int8<6, T, Nibbles>};

// y [m, n_out] = x [m, K] @ W^T (+ bias, fp32), W packed by kernels.pack_int8 (or pack_int4: Nibbles).
template <typename T, bool Nibbles>
void linear_rows_int8(const T* x, int64_t m, const at::Tensor& packed, const float* bias, int64_t n_out, T* y) {
  const int64_t blocks = packed.size(0), block_bytes = packed.size(1);
  const int64_t quads = (block_bytes - kInt8Trailer) / (Nibbles ? kInt4Line : kInt8Line), k = 4 * quads;
  std::vector<uint8_t> levels(m * k);
  std::vector<float> row_scale(m);
  std::vector<int32_t> level_shift(m);  // the rows' byte sums; int4's tiles take back 8 x them
  quantize_rows(x, m, k, levels.data(), row_scale.data(), level_shift.data());
  if constexpr (Nibbles)
    for (int64_t r = 0; r < m; ++r) level_shift[r] *= 8;
  const auto* xs = reinterpret_cast<const uint32_t*>(levels.data());
  const auto* base = static_cast<const char*>(packed.data_ptr());
  parallel_tasks(blocks, block_bytes * m, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t first = block * kBlockColumns;
      const int64_t columns = std::min(kBlockColumns, n_out - first);
      const char* w = base + block * block_bytes;
      for (int64_t r = 0, n = 0; r < m; r += n) {
        n = int8_tile_rows(r, m);
        kTilesInt8<T, Nibbles>[n](xs + r * quads, quads, reinterpret_cast<const __m512i*>(w), quads,
                                  row_scale.data() + r, level_shift.data() + r, w + quads * (Nibbles ? kInt4Line : kInt8Line),
                                  bias ? bias + first : nullptr, y + r * n_out + first, n_out, columns);
      }
    }
  });
}
#else
constexpr bool kInt8Products = false;

template <typename T, bool Nibbles>
void linear_rows_int8(const T*, int64_t, const at::Tensor&, const float*, int64_t, T*) {
  TORCH_CHECK(false, "int8 and int4 weight products need the AVX-512 VNNI build of quickdraft's kernels");
}
#endif

// A whole forward's product: y [m, n_out] = x [m, k] @ W^T (+ bias), W packed for the rows' dtype
// (pack_bf16, pack_f32) or as int8 or int4 (pack_int8, pack_int4: a draft's).
template <typename T>
void product(const T* x, int64_t m, const at::Tensor& packed, const float* bias, int64_t k, int64_t n_out, T* y) {
  if (packed.scalar_type() == at::kChar || packed.scalar_type() == at::kByte) {
    check_packed_int8(packed, k, n_out);
    if (packed.scalar_type() == at::kByte) linear_rows_int8<T, true>(x, m, packed, bias, n_out, y);
    else linear_rows_int8<T, false>(x, m, packed, bias, n_out, y);
  } else {
    check_packed_for(x, packed, k, n_out);
    linear_rows(x, m, packed, bias, n_out, y);
  }
}

bool int8_products() { return kInt8Products; }
void set_min_task_work(int64_t work) { g_min_task_work.store(std::max<int64_t>(0, work), std::memory_order_relaxed); }
int64_t min_task_work() { return g_min_task_work.load(std::memory_order_relaxed); }

at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                       int64_t n_out) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, "linear_bf16: bf16 only");
  const int64_t k = x.size(-1);
  at::Tensor rows = x.reshape({-1, k}).contiguous();
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = n_out;
  at::Tensor y = at::empty({rows.size(0), n_out}, x.options());
  at::Tensor bias_f32;
  if (bias.has_value()) bias_f32 = bias->to(at::kFloat).contiguous();
  product(rows.data_ptr<at::BFloat16>(), rows.size(0), packed, bias.has_value() ? bias_f32.data_ptr<float>() : nullptr,
          k, n_out, y.data_ptr<at::BFloat16>());
  return y.view(out_shape);
}

// ---- attention ------------------------------------------------------------------------------
// Each query row attends over the cache slots its mask marks. A row's result is a function of
// the ordered list of its visible (key, value) pairs only: each score is its own chain of
// multiply-adds, the softmax denominator is summed in list order a vector at a time and then
// reduced in one fixed order, and the weighted values are accumulated slot after slot in list
// order. So it does not depend on the window, on where the visible slots sit (a token tree's
// scattered ancestors get the bits of the same tokens fed as a chain) or on other rows.

// e^x, x clamped to [-87, 88]: Cody-Waite range reduction and a degree-6 polynomial, ~1 ulp in fp32.
inline V exp_clamped(V x) {
  x = Simd::min(Simd::max(x, Simd::set1(-87.0f)), Simd::set1(88.0f));
  const V n = Simd::round_nearest(Simd::mul(x, Simd::set1(1.44269504088896341f)));
  V r = Simd::fnmadd(n, Simd::set1(0.693359375f), x);
  r = Simd::fnmadd(n, Simd::set1(-2.12194440e-4f), r);
  V p = Simd::set1(1.0f / 720);
  p = Simd::fmadd(p, r, Simd::set1(1.0f / 120));
  p = Simd::fmadd(p, r, Simd::set1(1.0f / 24));
  p = Simd::fmadd(p, r, Simd::set1(1.0f / 6));
  p = Simd::fmadd(p, r, Simd::set1(0.5f));
  p = Simd::fmadd(p, r, Simd::set1(1.0f));
  p = Simd::fmadd(p, r, Simd::set1(1.0f));
  return Simd::scale2(p, n);
}

// The rounding a value gets when the eager model stores it in its element type.
template <typename T>
struct Elem;
template <>
struct Elem<at::BFloat16> {
  static V round(V v) { return Simd::round_bf16(v); }
};
template <>
struct Elem<float> {
  static V round(V v) { return v; }
};


// Query rows of head h for sequence b, step row i at q + ((b * t + i) * q_row + h * d) (q_row: a
// step row's stride); out likewise with out_row. keys/values [B, Hkv, C, D] with strides
// (k0, k1, d, 1); mask [B or 1, t, c]. Key blocks, where the cache keeps them: the keys again in
// kLanes-slot blocks [B, Hkv, ceil(C / kLanes), D, kLanes] with strides (kb0, kb1, D * kLanes, kLanes, 1).
struct AttentionLayout {
  int64_t batch, t, n_head, n_kv, d, c;
  int64_t q_row, out_row, k0, k1, v0, v1, mask_batches;
  int64_t kb0 = 0, kb1 = 0;
};

// The slots in [0, end) that a row's mask marks, in slot order, into list; their count.
inline int64_t visible_slots(const bool* row_mask, int64_t end, int32_t* list) {
  int64_t n = 0, s = 0;
  for (; s + 32 <= end; s += 32) {
    const __m256i marks = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row_mask + s));
    auto bits = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpgt_epi8(marks, _mm256_setzero_si256())));
    if (bits == 0xFFFFFFFFu) {  // the common case, a run of the prefix: 32 slots in a row
      const __m256i first = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(s)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      for (int64_t i = 0; i < 4; ++i)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(list + n + 8 * i), _mm256_add_epi32(first, _mm256_set1_epi32(8 * i)));
      n += 32;
      continue;
    }
    for (; bits; bits &= bits - 1) list[n++] = static_cast<int32_t>(s + __builtin_ctz(bits));
  }
  for (; s < end; ++s)
    if (row_mask[s]) list[n++] = static_cast<int32_t>(s);
  return n;
}

// The last slot in [from, end) that a row's mask marks, or from - 1.
inline int64_t last_visible(const bool* row_mask, int64_t from, int64_t end) {
  int64_t s = end;
  for (; s - 32 >= from; s -= 32) {
    const __m256i marks = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row_mask + s - 32));
    const auto bits = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpgt_epi8(marks, _mm256_setzero_si256())));
    if (bits) return s - 32 + 31 - __builtin_clz(bits);
  }
  for (--s; s >= from; --s)
    if (row_mask[s]) return s;
  return from - 1;
}

// One head's keys over slots [0, span) in fp32, transposed by blocks of kLanes slots: lane i of
// kt[(block * d + e) * kLanes] is element e of slot block * kLanes + i (zero past span). A row then
// scores kLanes slots at once, each slot's score the multiply-adds of its own elements in order.
// A cache that keeps its key blocks (write_key_block) has this layout already, in its element type.
template <typename T>
void transposed_keys(const T* keys, int64_t span, int64_t d, float* kt) {
  const int64_t blocks = (span + kLanes - 1) / kLanes;
  V r[kLanes];
  for (int64_t block = 0; block < blocks; ++block)
    for (int64_t e = 0; e < d; e += kLanes) {
      for (int64_t i = 0; i < kLanes; ++i) {
        const int64_t s = block * kLanes + i;
        r[i] = s < span ? Simd::load(keys + s * d + e, d - e) : Simd::zero();
      }
      Simd::transpose_into(r, kt + (block * d + e) * kLanes, std::min(kLanes, d - e));
    }
}

// Scores of Heads query rows (fp32, scaled; the query heads of one step row) against Blocks slot
// blocks of kt from block first, into score[h][slot]: Heads x Blocks independent chains of
// multiply-adds over the elements in order, sharing each key load.
template <int Heads, int Blocks, typename K>
void score_blocks(const float* const* query, const K* kt, int64_t d, int64_t first, float* const* score) {
  const K* k = kt + first * d * kLanes;
  const int64_t next = d * kLanes;
  V acc[Heads * Blocks];  // one dimension, as the products' tiles
  for (int h = 0; h < Heads; ++h) {
    const V q = Simd::set1(query[h][0]);
    for (int j = 0; j < Blocks; ++j) acc[h * Blocks + j] = Simd::mul(q, Simd::load(k + j * next));
  }
  for (int64_t e = 1; e < d; ++e) {
    V ks[Blocks];
    for (int j = 0; j < Blocks; ++j) ks[j] = Simd::load(k + j * next + e * kLanes);
    for (int h = 0; h < Heads; ++h) {
      const V q = Simd::set1(query[h][e]);
      for (int j = 0; j < Blocks; ++j) acc[h * Blocks + j] = Simd::fmadd(q, ks[j], acc[h * Blocks + j]);
    }
  }
  for (int h = 0; h < Heads; ++h)
    for (int j = 0; j < Blocks; ++j) Simd::store(score[h] + (first + j) * kLanes, acc[h * Blocks + j]);
}

// Query rows sharing a pass over the keys (or values): as many as keep every accumulator in a
// register. A pass takes up to kHeadsAtOnce query heads of each of up to kRowsAtOnce step rows: two
// rows' three heads, 24 accumulators of 16 lanes, read each key (value) vector once for six queries.
constexpr int kHeadsAtOnce = kLanes == 16 ? 3 : 2;
constexpr int kRowsAtOnce = kLanes == 16 ? 2 : 1;
constexpr int kQueriesAtOnce = kHeadsAtOnce * kRowsAtOnce;
template <typename K>
using ScoreBlocks = void (*)(const float* const*, const K*, int64_t, int64_t, float* const*);
template <typename K, int Heads>
constexpr ScoreBlocks<K> kScoreBlocksFor[4] = {score_blocks<Heads, 1, K>, score_blocks<Heads, 2, K>,
                                               score_blocks<Heads, 3, K>, score_blocks<Heads, 4, K>};
template <typename K>
constexpr const ScoreBlocks<K>* kScoreBlocks[6] = {kScoreBlocksFor<K, 1>, kScoreBlocksFor<K, 2>, kScoreBlocksFor<K, 3>,
                                                   kScoreBlocksFor<K, 4>, kScoreBlocksFor<K, 5>, kScoreBlocksFor<K, 6>};

// sums[h] (chunks of kLanes from chunk e0) += the weighted values of the listed slots, slot after
// slot in list order, for Heads heads sharing the list (the query heads of one step row), Chunks
// chunks of lanes at a time. Value rows are ``row`` elements apart: bf16 read in place from the cache
// (row = d), widened on load with lanes past a row's end zero, or fp32 rows of whole chunks (a widened
// copy padded with zeros, or the cache's own when d is whole chunks): the same numbers, so the same sums.
template <int Heads, int Chunks, typename T>
void weigh_values(const float* const* weights, const int32_t* list, int64_t n, const T* values, int64_t row,
                  int64_t e0, float* const* sums) {
  V acc[Heads * Chunks];
  for (int h = 0; h < Heads; ++h)
    for (int c = 0; c < Chunks; ++c) acc[h * Chunks + c] = Simd::load(sums[h] + e0 + c * kLanes);
  for (int64_t j = 0; j < n; ++j) {
    const T* v = values + list[j] * row + e0;
    V vs[Chunks];
    for (int c = 0; c < Chunks; ++c) {
      if constexpr (std::is_same_v<T, float>)  // whole chunks (a widened copy, or fp32 rows of them)
        vs[c] = Simd::load(v + c * kLanes);
      else
        vs[c] = Simd::load(v + c * kLanes, row - e0 - c * kLanes);
    }
    for (int h = 0; h < Heads; ++h) {
      const V w = Simd::set1(weights[h][j]);
      for (int c = 0; c < Chunks; ++c) acc[h * Chunks + c] = Simd::fmadd(w, vs[c], acc[h * Chunks + c]);
    }
  }
  for (int h = 0; h < Heads; ++h)
    for (int c = 0; c < Chunks; ++c) Simd::store(sums[h] + e0 + c * kLanes, acc[h * Chunks + c]);
}

template <typename T>
using WeighValues = void (*)(const float* const*, const int32_t*, int64_t, const T*, int64_t, int64_t, float* const*);
template <typename T, int Heads>
constexpr WeighValues<T> kWeighValuesFor[4] = {weigh_values<Heads, 1, T>, weigh_values<Heads, 2, T>,
                                               weigh_values<Heads, 3, T>, weigh_values<Heads, 4, T>};
template <typename T>
constexpr const WeighValues<T>* kWeighValues[6] = {kWeighValuesFor<T, 1>, kWeighValuesFor<T, 2>, kWeighValuesFor<T, 3>,
                                                   kWeighValuesFor<T, 4>, kWeighValuesFor<T, 5>, kWeighValuesFor<T, 6>};
static_assert(kQueriesAtOnce <= 6, "a pass's queries index the 6-entry score and value tables");

// Every query row that shares one key/value head: the step's rows x the group's query heads. Keys
// the cache keeps in blocks are read in place (widened on load); otherwise they are widened and
// transposed once for every row. Values are widened once where several rows read them (one row
// reads them in place: widening them cost it more than it saved). The step rows go kRowsAtOnce at a
// time: each lists its visible slots once for its query heads; the rows' heads score every slot
// block up to the last slot either row sees, in one pass over the keys; each row keeps its listed
// slots' scores in list order and takes their softmax: the maximum, e^(s - max) lane by lane, the
// denominator summed kLanes lanes at a time in list order and then reduced in one fixed order. The
// weighted values are accumulated slot after slot in list order: over the slots that begin both
// rows' lists in one pass, then over the rest of each row's own list. So a row's bits are a
// function of its query and the ordered list of its visible (key, value) pairs: the same whatever
// the other rows, the window or where its visible slots sit.
template <typename T>
void attend_group(const AttentionLayout& a, int64_t b, int64_t kv, const T* q, const T* keys,
                  const T* values, const T* key_blocks, const bool* mask, T* out) {
  const int64_t group = a.n_head / a.n_kv, c = a.c, d = a.d;
  const int64_t chunks = (d + kLanes - 1) / kLanes, stride = chunks * kLanes;  // sums padded to whole chunks
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // Per thread, reused from call to call: a window's widened keys and values are ~100 KB, which
  // malloc would map and unmap (and fault in) every time.
  thread_local std::vector<float> key_buffer, value_buffer, queries, scores, weights, sums, inverse;
  thread_local std::vector<int32_t> list_buffer;
  thread_local std::vector<const float*> head_weights, head_queries;
  thread_local std::vector<float*> head_sums, head_scores;
  const bool* group_mask = mask + (a.mask_batches == 1 ? 0 : b) * a.t * c;
  int64_t span = 0;  // the slots [0, span) that any row sees
  for (int64_t i = 0; i < a.t; ++i) span = std::max(span, last_visible(group_mask + i * c, span, c) + 1);
  const int64_t blocks = (span + kLanes - 1) / kLanes;
  // Key blocks kept by the cache need no transposing here (at 400 cached positions, 16 one-row
  // sequences spent ~25% of their step on it). Read in place, each key vector is widened once for
  // the queries of a pass (two rows' heads), where a widened copy cost a 6-row step 2-6% more
  // (embedded target, 300 cached tokens); the same numbers either way, so the same scores.
  const T* kept_blocks = key_blocks != nullptr ? key_blocks + b * a.kb0 + kv * a.kb1 : nullptr;
  float* kt = nullptr;
  if (kept_blocks == nullptr) {
    key_buffer.resize(std::max<int64_t>(blocks * d * kLanes, 1));
    kt = key_buffer.data();
    transposed_keys(keys + b * a.k0 + kv * a.k1, span, d, kt);
  }
  const T* head_values = values + b * a.v0 + kv * a.v1;
  const float* widened = nullptr;  // the values in fp32 rows of whole chunks, where several rows read them
  if (std::is_same_v<T, float> ? d != stride : a.t > 1) {
    value_buffer.resize(std::max<int64_t>(span * stride, 1));
    float* rows = value_buffer.data();
    for (int64_t s = 0; s < span; ++s)
      for (int64_t e = 0; e < d; e += kLanes)
        Simd::store(rows + s * stride + e, Simd::load(head_values + s * d + e, d - e));
    widened = rows;
  }
  const int64_t queries_kept = kRowsAtOnce * group;  // (row of the pass, head) -> index row * group + head
  queries.resize(queries_kept * d);
  scores.resize(queries_kept * blocks * kLanes + 1);
  weights.resize(queries_kept * (span + kLanes));
  sums.resize(queries_kept * stride);
  list_buffer.resize(kRowsAtOnce * (span + 1));
  head_weights.resize(queries_kept);
  head_queries.resize(queries_kept);
  head_sums.resize(queries_kept);
  head_scores.resize(queries_kept);
  inverse.resize(queries_kept);
  const auto weigh = [&](int64_t n_queries, const float* const* w, const int32_t* list, int64_t n, float* const* s) {
    for (int64_t e = 0; e < chunks; e += 4) {
      const int64_t these = std::min<int64_t>(4, chunks - e);
      if (widened != nullptr)
        kWeighValues<float>[n_queries - 1][these - 1](w, list, n, widened, stride, e * kLanes, s);
      else
        kWeighValues<T>[n_queries - 1][these - 1](w, list, n, head_values, d, e * kLanes, s);
    }
  };
  // A pass's inputs and outputs, (row of the pass, head) in order, from the (row, head) ones of heads h..
  const auto for_pass = [group](int64_t rows, int64_t h, int64_t heads, const std::vector<const float*>& inputs,
                                const float** pass_inputs, const std::vector<float*>& outputs, float** pass_outputs) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < heads; ++j) {
        pass_inputs[r * heads + j] = inputs[r * group + h + j];
        pass_outputs[r * heads + j] = outputs[r * group + h + j];
      }
  };
  for (int64_t i = 0, rows = 0; i < a.t; i += rows) {
    rows = std::min<int64_t>(kRowsAtOnce, a.t - i);
    int64_t n[kRowsAtOnce] = {};
    const int32_t* lists[kRowsAtOnce] = {};
    int64_t row_blocks = 0;
    for (int64_t r = 0; r < rows; ++r) {
      int32_t* list = list_buffer.data() + r * (span + 1);
      n[r] = visible_slots(group_mask + (i + r) * c, span, list);
      lists[r] = list;
      if (n[r]) row_blocks = std::max<int64_t>(row_blocks, list[n[r] - 1] / kLanes + 1);
    }
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < group; ++h) {
        const int64_t at = r * group + h;
        const T* qrow = q + (b * a.t + i + r) * a.q_row + (kv * group + h) * d;
        float* query = &queries[at * d];
        for (int64_t e = 0; e < d; e += kLanes)
          Simd::store(query + e, d - e, Simd::mul(Simd::load(qrow + e, d - e), Simd::set1(scale)));
        head_queries[at] = query;
        head_scores[at] = &scores[at * blocks * kLanes];
      }
    for (int64_t h = 0; h < group; h += kHeadsAtOnce) {
      const int64_t heads = std::min<int64_t>(kHeadsAtOnce, group - h), n_queries = rows * heads;
      const float* pass_queries[kQueriesAtOnce];
      float* pass_scores[kQueriesAtOnce];
      for_pass(rows, h, heads, head_queries, pass_queries, head_scores, pass_scores);
      for (int64_t block = 0; block < row_blocks; block += 4) {
        const int64_t these = std::min<int64_t>(4, row_blocks - block) - 1;
        if (kept_blocks != nullptr)
          kScoreBlocks<T>[n_queries - 1][these](pass_queries, kept_blocks, d, block, pass_scores);
        else
          kScoreBlocks<float>[n_queries - 1][these](pass_queries, kt, d, block, pass_scores);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t* list = lists[r];
      for (int64_t h = 0; h < group; ++h) {
        const int64_t at = r * group + h;
        const float* score = head_scores[at];
        float* w = &weights[at * (span + kLanes)];
        for (int64_t j = 0; j < n[r];) {  // runs of consecutive slots (the prefix) copied a vector at a time
          if (j + kLanes <= n[r] && list[j + kLanes - 1] - list[j] == kLanes - 1) {
            Simd::store(w + j, Simd::load(score + list[j]));
            j += kLanes;
          } else {
            w[j] = score[list[j]];
            ++j;
          }
        }
        std::fill(w + n[r], w + n[r] + kLanes, -INFINITY);  // the last chunk's tail lanes, for the maximum
        V top_v = Simd::set1(-INFINITY);
        for (int64_t j = 0; j < n[r]; j += kLanes) top_v = Simd::max(top_v, Simd::load(w + j));
        alignas(64) float lanes[kLanes];
        Simd::store(lanes, top_v);
        float top = -INFINITY;
        for (int64_t l = 0; l < kLanes; ++l) top = std::max(top, lanes[l]);
        top_v = Simd::set1(top);
        V total = Simd::zero();
        for (int64_t j = 0; j < n[r]; j += kLanes) {
          const V p = exp_clamped(Simd::sub(Simd::load(w + j, n[r] - j), top_v));
          Simd::store(w + j, n[r] - j, p);
          total = Simd::add(total, Simd::first(p, n[r] - j));  // the tail's lanes stay zero
        }
        inverse[at] = n[r] ? 1.0f / Simd::sum(total) : 0.0f;
        head_weights[at] = w;
        head_sums[at] = &sums[at * stride];
        std::fill(head_sums[at], head_sums[at] + stride, 0.0f);
      }
    }
    // The slots that begin every row's list (a causal verify's rows share all of the shorter
    // row's), weighed in one pass; then each row's own remaining slots, in list order.
    int64_t shared = n[0];
    for (int64_t r = 1; r < rows; ++r)
      shared = std::mismatch(lists[0], lists[0] + std::min(shared, n[r]), lists[r]).first - lists[0];
    for (int64_t h = 0; h < group; h += kHeadsAtOnce) {
      const int64_t heads = std::min<int64_t>(kHeadsAtOnce, group - h);
      const float* pass_weights[kQueriesAtOnce];
      float* pass_sums[kQueriesAtOnce];
      for_pass(rows, h, heads, head_weights, pass_weights, head_sums, pass_sums);
      if (shared) weigh(rows * heads, pass_weights, lists[0], shared, pass_sums);
      for (int64_t r = 0; r < rows; ++r) {
        if (n[r] == shared) continue;
        const float* own_weights[kHeadsAtOnce];
        for (int64_t j = 0; j < heads; ++j) own_weights[j] = pass_weights[r * heads + j] + shared;
        weigh(heads, own_weights, lists[r] + shared, n[r] - shared, &pass_sums[r * heads]);
      }
    }
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < group; ++h) {
        const int64_t at = r * group + h;
        T* o = out + (b * a.t + i + r) * a.out_row + (kv * group + h) * d;
        const V inv = Simd::set1(inverse[at]);
        for (int64_t e = 0; e < d; e += kLanes) Simd::store(o + e, d - e, Simd::mul(Simd::load(&sums[at * stride + e]), inv));
      }
  }
}

template <typename T>
void attend_rows(const AttentionLayout& a, const T* q, const T* keys, const T* values, const T* key_blocks,
                 const bool* mask, T* out) {
  TORCH_CHECK(a.d <= 256, "attention: head_dim over 256");
  parallel_tasks(a.batch * a.n_kv, 2 * a.c * a.d * static_cast<int64_t>(sizeof(T)) * a.t * (a.n_head / a.n_kv),
                 [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task)
      attend_group<T>(a, task / a.n_kv, task % a.n_kv, q, keys, values, key_blocks, mask, out);
  });
}

at::Tensor attend_bf16(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, const at::Tensor& mask) {
  // q [B, Hq, T, D]; keys, values [B, Hkv, C, D] (the last two dims contiguous: a cache window);
  // mask [B or 1, T, C] bool -> [B, Hq, T, D]
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && keys.scalar_type() == at::kBFloat16 &&
              values.scalar_type() == at::kBFloat16 && mask.scalar_type() == at::kBool, "attend_bf16: dtypes");
  TORCH_CHECK(q.dim() == 4 && keys.dim() == 4 && values.dim() == 4 && mask.dim() == 3, "attend_bf16: ranks");
  const int64_t batch = q.size(0), n_head = q.size(1), t = q.size(2), d = q.size(3);
  TORCH_CHECK(keys.sizes() == values.sizes() && keys.size(0) == batch && keys.size(3) == d &&
              n_head % keys.size(1) == 0, "attend_bf16: shapes");
  TORCH_CHECK(keys.stride(3) == 1 && keys.stride(2) == d && values.stride(3) == 1 && values.stride(2) == d,
              "attend_bf16: keys and values need contiguous [C, D] per head");
  TORCH_CHECK((mask.size(0) == batch || mask.size(0) == 1) && mask.size(1) == t && mask.size(2) == keys.size(2),
              "attend_bf16: mask shape");
  const at::Tensor rows = q.transpose(1, 2).contiguous();  // [B, T, Hq, D]: a step row's heads side by side
  const at::Tensor m = mask.contiguous();
  at::Tensor y = at::empty({batch, t, n_head, d}, q.options());
  const AttentionLayout layout{batch, t, n_head, keys.size(1), d, keys.size(2), n_head * d, n_head * d,
                               keys.stride(0), keys.stride(1), values.stride(0), values.stride(1), m.size(0)};
  attend_rows<at::BFloat16>(layout, rows.data_ptr<at::BFloat16>(), keys.data_ptr<at::BFloat16>(),
                            values.data_ptr<at::BFloat16>(), nullptr, m.data_ptr<bool>(), y.data_ptr<at::BFloat16>());
  return y.transpose(1, 2);
}

// ---- RMSNorm --------------------------------------------------------------------------------
// weight * bf16(x / rms(x)), the sum of squares in fp32 in one fixed order per row
// (torch.compile's fused norms vectorise the reduction differently per row count).
template <typename T>
void rms_norm_rows(const T* x, int64_t m, int64_t h, const T* w, float eps, T* y) {
  for (int64_t r = 0; r < m; ++r) {
    const T* xr = x + r * h;
    V squares = Simd::zero();
    for (int64_t j = 0; j < h; j += kLanes) {
      const V v = Simd::load(xr + j, h - j);
      squares = Simd::fmadd(v, v, squares);
    }
    const float inverse = 1.0f / std::sqrt(Simd::sum(squares) / static_cast<float>(h) + eps);
    const V scale = Simd::set1(inverse);
    for (int64_t j = 0; j < h; j += kLanes) {
      const V normed = Elem<T>::round(Simd::mul(Simd::load(xr + j, h - j), scale));
      Simd::store(y + r * h + j, h - j, Simd::mul(normed, Simd::load(w + j, h - j)));
    }
  }
}

at::Tensor rms_norm_bf16(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16, "rms_norm_bf16: bf16 only");
  const int64_t h = x.size(-1);
  TORCH_CHECK(weight.numel() == h, "rms_norm_bf16: weight size");
  const at::Tensor rows = x.reshape({-1, h}).contiguous();
  const at::Tensor w = weight.contiguous();
  at::Tensor y = at::empty_like(rows);
  rms_norm_rows<at::BFloat16>(rows.data_ptr<at::BFloat16>(), rows.size(0), h, w.data_ptr<at::BFloat16>(), static_cast<float>(eps),
                y.data_ptr<at::BFloat16>());
  return y.view(x.sizes());
}

// ---- a whole forward ------------------------------------------------------------------------
// quickdraft::forward: a Llama-family decoder's forward (bf16 or fp32 weights) over a step's rows in one call - no
// Python, no dispatch between layers. tokens, positions (RoPE), slots (the cache slot each row's
// key and value go to): [B, T]; mask [B or 1, T, W]: the cache slots [0, W) each row sees, its
// own included. The residual stream stays bf16 between ops, as the eager model's does.
//
// weights: embed [V, E]; per layer: attn_norm [E], qkv (packed), qkv_bias (fp32, or empty),
// out (packed), mlp_norm [E], up (packed, gate then up), down (packed) (all three empty: a layer without
// an MLP); then norm [E], head (packed); then, optionally, token_proj (packed, E -> E): the embeddings
// are projected by it (a feature draft's W_token, kept apart from a table too large to fold it into).
// Features (a feature draft's, model/feature_draft.py), each empty when unused: input_features [B * T, E]
// (the weights' dtype) are projected by feature_proj (packed, E -> E) and added to the rows' embeddings;
// features_out [B, slots, E] receives each row's residual stream after the last layer run (before the
// final norm) at the row's cache slot, as the cache receives its key and value.
template <typename T>
at::Tensor forward_native(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& slots,
                        const at::Tensor& mask, const at::Tensor& cos, const at::Tensor& signed_sin,
                        at::TensorList keys, at::TensorList values, at::TensorList key_blocks, at::TensorList weights, int64_t n_layers,
                        int64_t n_head, int64_t n_kv, int64_t head_dim, int64_t intermediate, int64_t vocab,
                        double eps, int64_t logits_rows, const at::Tensor& input_features,
                        const at::Tensor& feature_proj, const at::Tensor& features_out) {
  constexpr int64_t kPerLayer = 7;
  const int64_t batch = tokens.size(0), t = tokens.size(1), m = batch * t;
  const at::Tensor& embed = weights[0];
  const int64_t e = embed.size(1), d = head_dim, q_dim = n_head * d, kv_dim = n_kv * d;
  const int64_t qkv_dim = q_dim + 2 * kv_dim, half = d / 2;
  const int64_t n_weights = static_cast<int64_t>(weights.size());
  const int64_t token_proj_at = 1 + kPerLayer * static_cast<int64_t>(keys.size()) + 2;
  TORCH_CHECK(n_weights == token_proj_at || n_weights == token_proj_at + 1, "forward: weights do not match the layers");
  TORCH_CHECK(n_layers <= static_cast<int64_t>(keys.size()) && mask.size(1) == t && mask.size(2) <= keys[0].size(2) &&
              logits_rows >= 0 && logits_rows <= t, "forward: shapes");
  TORCH_CHECK(tokens.is_contiguous() && positions.is_contiguous() && slots.is_contiguous() && mask.is_contiguous() &&
              cos.is_contiguous() && signed_sin.is_contiguous() && d % 2 == 0, "forward: layouts");
  TORCH_CHECK(key_blocks.empty() || key_blocks.size() == keys.size(), "forward: one key block tensor per layer, or none");
  const auto* tok = tokens.data_ptr<int64_t>();
  const auto* pos = positions.data_ptr<int64_t>();
  const auto* slot = slots.data_ptr<int64_t>();
  const auto opts = embed.options();
  at::Tensor residual = at::empty({m, e}, opts), normed = at::empty({m, e}, opts), projected = at::empty({m, e}, opts);
  at::Tensor qkv = at::empty({m, qkv_dim}, opts), attended = at::empty({m, q_dim}, opts);
  at::Tensor gate_up = at::empty({m, 2 * intermediate}, opts), hidden = at::empty({m, intermediate}, opts);
  auto* h = residual.data_ptr<T>();
  auto* xn = normed.data_ptr<T>();
  auto* proj = projected.data_ptr<T>();
  auto* qkvs = qkv.data_ptr<T>();
  auto* att = attended.data_ptr<T>();
  auto* gu = gate_up.data_ptr<T>();
  auto* hid = hidden.data_ptr<T>();
  const auto* emb = embed.data_ptr<T>();
  for (int64_t r = 0; r < m; ++r) {
    TORCH_CHECK(tok[r] >= 0 && tok[r] < embed.size(0), "forward: token id out of range");
    std::copy(emb + tok[r] * e, emb + (tok[r] + 1) * e, h + r * e);
  }
  if (n_weights > token_proj_at) {
    product(h, m, weights[token_proj_at], nullptr, e, e, proj);
    std::copy(proj, proj + m * e, h);
  }
  const auto add_into_residual = [&](const T* y) {
    for (int64_t i = 0; i < m * e; i += kLanes)
      Simd::store(h + i, m * e - i, Simd::add(Simd::load(h + i, m * e - i), Simd::load(y + i, m * e - i)));
  };
  if (input_features.numel()) {
    TORCH_CHECK(input_features.dim() == 2 && input_features.size(0) == m && input_features.size(1) == e &&
                input_features.scalar_type() == embed.scalar_type() && input_features.is_contiguous(),
                "forward: input_features is a contiguous [rows, E] tensor of the weights' dtype");
    at::Tensor projected_features = at::empty({m, e}, opts);
    product(input_features.data_ptr<T>(), m, feature_proj, nullptr, e, e, projected_features.data_ptr<T>());
    add_into_residual(projected_features.data_ptr<T>());
  }
  const auto* cs = cos.data_ptr<T>();
  const auto* sn = signed_sin.data_ptr<T>();
  for (int64_t layer = 0; layer < n_layers; ++layer) {
    const at::Tensor* w = &weights[1 + kPerLayer * layer];
    rms_norm_rows(h, m, e, w[0].data_ptr<T>(), static_cast<float>(eps), xn);
    product(xn, m, w[1], w[2].numel() ? w[2].data_ptr<float>() : nullptr, e, qkv_dim, qkvs);
    // RoPE on the query and key heads (rotate-half layout, sign folded into signed_sin), then the
    // keys and values into their cache slots.
    T* kc = keys[layer].data_ptr<T>();
    T* vc = values[layer].data_ptr<T>();
    const int64_t k0 = keys[layer].stride(0), k1 = keys[layer].stride(1), capacity = keys[layer].size(2);
    const int64_t v0 = values[layer].stride(0), v1 = values[layer].stride(1);
    // The cache's key blocks (attend_group), when it keeps them: each new key goes there too.
    T* kb = nullptr;
    int64_t kb0 = 0, kb1 = 0;
    if (!key_blocks.empty()) {
      const at::Tensor& blocks = key_blocks[layer];
      TORCH_CHECK(blocks.scalar_type() == keys[layer].scalar_type() && blocks.dim() == 5 &&
                  blocks.size(0) == keys[layer].size(0) && blocks.size(1) == n_kv &&
                  blocks.size(2) * kLanes >= capacity && blocks.size(3) == d && blocks.size(4) == kLanes &&
                  blocks.stride(4) == 1 && blocks.stride(3) == kLanes && blocks.stride(2) == d * kLanes,
                  "forward: key blocks are [B, Hkv, ceil(C / lanes), D, lanes] in the cache's dtype, lanes = ",
                  kLanes);
      kb = blocks.data_ptr<T>();
      kb0 = blocks.stride(0);
      kb1 = blocks.stride(1);
    }
    for (int64_t r = 0; r < m; ++r) {
      const T* c_row = cs + pos[r] * d;
      const T* s_row = sn + pos[r] * d;
      T* row = qkvs + r * qkv_dim;
      for (int64_t head = 0; head < n_head + n_kv; ++head) {
        T* x = row + head * d;
        float rotated[512];
        for (int64_t i = 0; i < d; ++i) {
          const float other = static_cast<float>(x[i < half ? i + half : i - half]);
          rotated[i] = static_cast<float>(x[i]) * static_cast<float>(c_row[i]) + other * static_cast<float>(s_row[i]);
        }
        for (int64_t i = 0; i < d; ++i) x[i] = static_cast<T>(rotated[i]);
      }
      const int64_t b = r / t;
      TORCH_CHECK(slot[r] >= 0 && slot[r] < capacity, "forward: cache slot out of range");
      for (int64_t kv = 0; kv < n_kv; ++kv) {
        std::copy(row + q_dim + kv * d, row + q_dim + (kv + 1) * d, kc + b * k0 + kv * k1 + slot[r] * d);
        if (kb != nullptr) {
          T* lane = kb + b * kb0 + kv * kb1 + (slot[r] / kLanes) * d * kLanes + slot[r] % kLanes;
          for (int64_t i = 0; i < d; ++i) lane[i * kLanes] = row[q_dim + kv * d + i];
        }
        std::copy(row + q_dim + kv_dim + kv * d, row + q_dim + kv_dim + (kv + 1) * d, vc + b * v0 + kv * v1 + slot[r] * d);
      }
    }
    const AttentionLayout layout{batch, t, n_head, n_kv, d, mask.size(2), qkv_dim, q_dim, k0, k1, v0, v1, mask.size(0),
                                 kb0, kb1};
    attend_rows(layout, qkvs, kc, vc, static_cast<const T*>(kb), mask.data_ptr<bool>(), att);
    product(att, m, w[3], nullptr, q_dim, e, proj);
    add_into_residual(proj);
    if (w[5].numel() == 0) continue;  // an attention-only layer (a self-draft's exit adapter): no MLP
    rms_norm_rows(h, m, e, w[4].data_ptr<T>(), static_cast<float>(eps), xn);
    product(xn, m, w[5], nullptr, e, 2 * intermediate, gu);
    for (int64_t r = 0; r < m; ++r) {  // silu(gate) * up, each rounded to bf16 as the eager model does
      const T* g = gu + r * 2 * intermediate;
      for (int64_t i = 0; i < intermediate; i += kLanes) {
        const int64_t n = intermediate - i;
        const V gv = Simd::load(g + i, n);
        const V silu = Simd::div(gv, Simd::add(Simd::set1(1.0f), exp_clamped(Simd::sub(Simd::zero(), gv))));
        Simd::store(hid + r * intermediate + i, n, Simd::mul(Elem<T>::round(silu), Simd::load(g + intermediate + i, n)));
      }
    }
    product(hid, m, w[6], nullptr, intermediate, e, proj);
    add_into_residual(proj);
  }
  if (features_out.numel()) {
    TORCH_CHECK(features_out.dim() == 3 && features_out.size(0) >= batch && features_out.size(2) == e &&
                features_out.scalar_type() == embed.scalar_type() && features_out.stride(2) == 1,
                "forward: features_out is a [B, slots, E] tensor of the weights' dtype");
    T* f = features_out.data_ptr<T>();
    const int64_t f0 = features_out.stride(0), f1 = features_out.stride(1);
    for (int64_t r = 0; r < m; ++r) {
      TORCH_CHECK(slot[r] < features_out.size(1), "forward: a slot past features_out");
      std::copy(h + r * e, h + (r + 1) * e, f + (r / t) * f0 + slot[r] * f1);
    }
  }
  // The head only for the rows asked for (the last logits_rows of each sequence): a prefill needs
  // none, and the head is the largest product of a small model (8,192 x 384 for the embedded one).
  const at::Tensor* tail = &weights[1 + kPerLayer * keys.size()];
  at::Tensor logits = at::empty({batch, logits_rows, vocab}, opts);
  if (logits_rows == 0) return logits;
  const int64_t kept = batch * logits_rows;
  if (logits_rows < t)
    for (int64_t b = 0; b < batch; ++b)
      std::copy(h + (b * t + t - logits_rows) * e, h + (b + 1) * t * e, h + b * logits_rows * e);
  rms_norm_rows(h, kept, e, tail[0].data_ptr<T>(), static_cast<float>(eps), xn);
  product(xn, kept, tail[1], nullptr, e, vocab, logits.data_ptr<T>());
  return logits;
}

// Runs fn(T{}) for the weights' element type T (bf16 or fp32), which the RoPE tables must share.
template <typename Fn>
at::Tensor by_weight_dtype(const char* op, const at::Tensor& weight, const at::Tensor& cos, const Fn& fn) {
  const auto dtype = weight.scalar_type();
  TORCH_CHECK((dtype == at::kBFloat16 || dtype == at::kFloat) && cos.scalar_type() == dtype, op,
              ": bf16 or fp32 weights and RoPE tables of the same dtype");
  return dtype == at::kBFloat16 ? fn(at::BFloat16{}) : fn(float{});
}

at::Tensor forward(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& slots,
                   const at::Tensor& mask, const at::Tensor& cos, const at::Tensor& signed_sin, at::TensorList keys,
                   at::TensorList values, at::TensorList key_blocks, at::TensorList weights, int64_t n_layers, int64_t n_head, int64_t n_kv,
                   int64_t head_dim, int64_t intermediate, int64_t vocab, double eps, int64_t logits_rows,
                   const at::Tensor& input_features, const at::Tensor& feature_proj, const at::Tensor& features_out) {
  return by_weight_dtype("forward", weights[0], cos, [&](auto element) {
    return forward_native<decltype(element)>(tokens, positions, slots, mask, cos, signed_sin, keys, values, key_blocks, weights,
                                             n_layers, n_head, n_kv, head_dim, intermediate, vocab, eps, logits_rows,
                                             input_features, feature_proj, features_out);
  });
}

// A draft's token from one row of head logits over [0, vocab_limit): the first maximum, or with noise
// g (indexed by token id) the Gumbel-max race, the first maximum of logit * scale + g (a sample of
// softmax(logit * scale), the coupled rule's draw when g = -log E of the position's noise). row_token,
// when not null, maps a subset head's rows to token ids; the token id is returned.
// Vectorised (a scalar scan was a fifth of a 16-sequence batched draft): each block of kPickBlock
// tokens' maximum, then the first token reaching the row's maximum inside the first block that
// holds it. Every score is computed by the same vector ops in both passes (a multiply, then an add,
// as torch computes the race), so the two passes agree bit for bit.
constexpr int64_t kPickBlock = 16 * kLanes;

template <typename T>
int64_t draft_pick(const T* logits, int64_t vocab_limit, const int64_t* row_token, const float* g, float scale) {
  const V scale_v = Simd::set1(scale);
  auto scores = [&](int64_t v, int64_t n) {  // the scores of tokens [v, v + n), n <= kLanes (lanes past n: 0)
    const V x = Simd::load(logits + v, n);
    if (!g) return x;
    if (!row_token) return Simd::add(Simd::mul(x, scale_v), Simd::load(g + v, n));
    alignas(64) float noise[kLanes] = {};
    for (int64_t l = 0; l < n; ++l) noise[l] = g[row_token[v + l]];
    return Simd::add(Simd::mul(x, scale_v), Simd::load(noise));
  };
  const int64_t whole = vocab_limit / kLanes * kLanes;
  float top = -INFINITY;
  int64_t top_block = 0;  // the first block whose maximum is the row's maximum so far
  for (int64_t b = 0; b < whole; b += kPickBlock) {
    V m = Simd::set1(-INFINITY);
    for (int64_t v = b; v < std::min(b + kPickBlock, whole); v += kLanes) m = Simd::max(m, scores(v, kLanes));
    if (const float block_top = Simd::top(m); block_top > top) {
      top = block_top;
      top_block = b;
    }
  }
  alignas(64) float lanes[kLanes];
  int64_t best = -1;
  if (whole < vocab_limit) {  // the last tokens, fewer than a vector: after every block, so only a greater score wins
    Simd::store(lanes, scores(whole, vocab_limit - whole));
    for (int64_t l = 0; l < vocab_limit - whole; ++l)
      if (lanes[l] > top || (whole == 0 && l == 0)) {
        top = lanes[l];
        best = whole + l;
      }
  }
  for (int64_t v = top_block; best < 0 && v < std::min(top_block + kPickBlock, whole); v += kLanes) {
    Simd::store(lanes, scores(v, kLanes));
    for (int64_t l = 0; l < kLanes; ++l)
      if (lanes[l] == top) {
        best = v + l;
        break;
      }
  }
  if (best < 0) best = 0;  // every score -inf (or NaN): the scalar scan's answer
  return row_token ? row_token[best] : best;
}

// A drafted step's logits row kept for the caller (the rejection rule needs its q), in float32.
template <typename T>
inline void copy_as_float(const T* row, int64_t n, float* out) {
  for (int64_t v = 0; v < n; ++v) out[v] = static_cast<float>(row[v]);
}

// What draft_sample reuses from one drafted token to the next instead of allocating it each time.
struct SampleScratch {
  std::vector<float> weights;
  std::vector<double> block_sums;
};

// A draft's token drawn from softmax(logit * scale + g) over [0, vocab_limit) by the inverse of its
// cumulative distribution at u in [0, 1): the rejection rule's draw, whose q the caller recomputes
// from the logits the call returns. g (indexed by token id) may be null; row_token as in draft_pick.
// The weights e^(score - max) are summed a block at a time in token order, then the block that holds
// u * total is scanned token by token.
template <typename T>
int64_t draft_sample(const T* logits, int64_t vocab_limit, const int64_t* row_token, const float* g, float scale,
                     double u, SampleScratch& scratch) {
  scratch.weights.resize(static_cast<size_t>(vocab_limit));
  float* w = scratch.weights.data();
  for (int64_t v = 0; v < vocab_limit; ++v) {
    const float x = static_cast<float>(logits[v]) * scale;
    w[v] = g ? x + g[row_token ? row_token[v] : v] : x;
  }
  float top = -INFINITY;
  for (int64_t v = 0; v < vocab_limit; ++v) top = std::max(top, w[v]);
  if (!(top > -INFINITY)) return row_token ? row_token[0] : 0;  // every score -inf (or NaN)
  const V top_v = Simd::set1(top);
  std::vector<double>& block_sums = scratch.block_sums;
  block_sums.clear();
  double total = 0.0;
  for (int64_t b = 0; b < vocab_limit; b += kPickBlock) {
    V acc = Simd::zero();
    for (int64_t v = b; v < std::min(b + kPickBlock, vocab_limit); v += kLanes) {
      const int64_t n = std::min(kLanes, vocab_limit - v);
      const V e = Simd::first(exp_clamped(Simd::sub(Simd::load(w + v, n), top_v)), n);
      Simd::store(w + v, n, e);
      acc = Simd::add(acc, e);
    }
    block_sums.push_back(Simd::sum(acc));
    total += block_sums.back();
  }
  const double goal = u * total;
  double below = 0.0;
  int64_t last_positive = -1;
  for (size_t i = 0; i < block_sums.size(); ++i) {
    const int64_t b = static_cast<int64_t>(i) * kPickBlock;
    if (below + block_sums[i] <= goal && i + 1 < block_sums.size()) {
      below += block_sums[i];
      continue;
    }
    for (int64_t v = b; v < std::min(b + kPickBlock, vocab_limit); ++v) {
      if (w[v] <= 0.0f) continue;
      last_positive = v;
      below += w[v];
      if (below > goal) return row_token ? row_token[v] : v;
    }
    break;  // rounding (the blocks' float sums) left the goal past the block: its last positive token
  }
  if (last_positive < 0)
    for (int64_t v = vocab_limit - 1; v >= 0; --v)
      if (w[v] > 0.0f) { last_positive = v; break; }
  const int64_t best = last_positive < 0 ? 0 : last_positive;
  return row_token ? row_token[best] : best;
}

// quickdraft::draft_greedy: a draft model's whole greedy proposal in one call. Feeds tokens [1, T]
// at positions start.. (a chain after the cache's first start slots), then drafts k tokens: each
// is the first maximum of the last row's logits over [0, vocab_limit), and all but the last are
// fed back as 1-row steps. -> the k tokens; the cache then holds start + T + k - 1 tokens. The
// steps are the ones forward computes: this only keeps Python out of the draft's loop.
// head_ids, when not empty, maps the LM head's rows to token ids (a head over a vocabulary subset):
// the maximum's row is mapped before it is returned and fed back.
// gumbel, when not empty ([k, V] float32, indexed by token id), turns the argmax into a race: token i
// maximises logit / temperature + gumbel[i] (Gumbel-max: a sample of softmax(logit / temperature),
// the coupled rule's draw when gumbel = -log E of the position's noise).
// uniforms, when not empty ([k] float64 in [0, 1)), draws each token from softmax(logit * inverse_temperature
// + gumbel) instead (draft_sample; gumbel then only adds a bias, e.g. penalties): the rejection rule's draw.
// logits_out, when not empty ([k, head rows] float32), receives each step's logits.
// A feature draft (forward's features) passes input_features [T, E] for the fed tokens, feature_proj and
// features_out [1, slots, E]: each drafted token is then fed with the feature its step computed, or with
// hold_features the last fed one (the latest the target computed) again.
template <typename T>
at::Tensor draft_greedy_native(const at::Tensor& tokens, int64_t start, int64_t k, int64_t vocab_limit,
                               const at::Tensor& cos, const at::Tensor& signed_sin, at::TensorList keys,
                               at::TensorList values, at::TensorList key_blocks, at::TensorList weights, int64_t n_layers, int64_t n_head,
                               int64_t n_kv, int64_t head_dim, int64_t intermediate, int64_t vocab, double eps,
                               const at::Tensor& head_ids, const at::Tensor& gumbel, double inverse_temperature,
                               const at::Tensor& uniforms, const at::Tensor& logits_out,
                               const at::Tensor& input_features, const at::Tensor& feature_proj,
                               const at::Tensor& features_out, bool hold_features, const at::Tensor& step_seconds) {
  using Clock = std::chrono::steady_clock;
  auto mark = Clock::now();
  TORCH_CHECK(input_features.numel() == 0 || features_out.numel() > 0,
              "draft_greedy: a feature draft writes the features it feeds back to features_out");
  TORCH_CHECK(step_seconds.numel() == 0 || (step_seconds.numel() == k && step_seconds.scalar_type() == at::kDouble &&
                                           step_seconds.is_contiguous()),
              "draft_greedy: step_seconds is a contiguous float64 [k] tensor");
  double* step_times = step_seconds.numel() ? step_seconds.data_ptr<double>() : nullptr;
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(0) == 1 && tokens.size(1) >= 1 && k >= 1 && vocab_limit >= 1 &&
              vocab_limit <= vocab, "draft_greedy: one sequence of at least one token, k >= 1, a vocabulary limit");
  TORCH_CHECK(head_ids.numel() == 0 || (head_ids.numel() == vocab && head_ids.scalar_type() == at::kLong),
              "draft_greedy: head_ids maps each of the head's rows to a token id (int64)");
  TORCH_CHECK(gumbel.numel() == 0 || (gumbel.dim() == 2 && gumbel.size(0) == k && gumbel.scalar_type() == at::kFloat),
              "draft_greedy: gumbel holds k rows of float32 noise indexed by token id");
  const at::Tensor id_map = head_ids.contiguous();
  const int64_t* row_token = head_ids.numel() ? id_map.data_ptr<int64_t>() : nullptr;
  TORCH_CHECK(uniforms.numel() == 0 || (uniforms.numel() == k && uniforms.scalar_type() == at::kDouble &&
                                       uniforms.is_contiguous()),
              "draft_greedy: uniforms holds one float64 draw in [0, 1) per drafted token, contiguous");
  TORCH_CHECK(logits_out.numel() == 0 || (logits_out.dim() == 2 && logits_out.size(0) == k && logits_out.size(1) == vocab &&
                                          logits_out.scalar_type() == at::kFloat && logits_out.is_contiguous()),
              "draft_greedy: logits_out is a contiguous float32 [k, head rows] tensor");
  const at::Tensor noise = gumbel.contiguous();
  const float* noise_rows = gumbel.numel() ? noise.data_ptr<float>() : nullptr;
  const double* draws = uniforms.numel() ? uniforms.data_ptr<double>() : nullptr;
  float* logits_rows = logits_out.numel() ? logits_out.data_ptr<float>() : nullptr;
  SampleScratch sample_scratch;
  const float scale = static_cast<float>(inverse_temperature);
  at::Tensor drafted = at::empty({k}, tokens.options());
  auto* out = drafted.data_ptr<int64_t>();
  const auto ids = tokens.options();
  at::Tensor feed = tokens.contiguous();
  at::Tensor feed_features = input_features;
  int64_t first = start;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t t = feed.size(1);
    const at::Tensor positions = at::arange(first, first + t, ids).view({1, t});
    at::Tensor mask = at::ones({1, t, first + t}, ids.dtype(at::kBool));
    if (t > 1) mask = mask.tril(first);  // row j sees slots [0, first + j]
    const at::Tensor logits = forward_native<T>(feed, positions, positions, mask, cos, signed_sin, keys, values, key_blocks,
                                                weights, n_layers, n_head, n_kv, head_dim, intermediate, vocab, eps, 1,
                                                feed_features, feature_proj, features_out);
    if (feed_features.numel())
      feed_features = hold_features ? feed_features.narrow(0, t - 1, 1) : features_out[0].narrow(0, first + t - 1, 1);
    const T* row = logits.data_ptr<T>();
    if (logits_rows) copy_as_float(row, vocab, logits_rows + i * vocab);
    const float* g = noise_rows ? noise_rows + i * noise.size(1) : nullptr;
    const int64_t best = draws ? draft_sample(row, vocab_limit, row_token, g, scale, draws[i], sample_scratch)
                               : draft_pick(row, vocab_limit, row_token, g, scale);
    out[i] = best;
    first += t;
    feed = at::full({1, 1}, best, ids);
    if (step_times) {  // each step's time: the first also feeds what the call was given
      const auto now = Clock::now();
      step_times[i] = std::chrono::duration<double>(now - mark).count();
      mark = now;
    }
  }
  return drafted;
}

at::Tensor draft_greedy(const at::Tensor& tokens, int64_t start, int64_t k, int64_t vocab_limit, const at::Tensor& cos,
                        const at::Tensor& signed_sin, at::TensorList keys, at::TensorList values,
                        at::TensorList key_blocks, at::TensorList weights, int64_t n_layers, int64_t n_head,
                        int64_t n_kv, int64_t head_dim, int64_t intermediate, int64_t vocab, double eps,
                        const at::Tensor& head_ids,
                        const at::Tensor& gumbel, double inverse_temperature, const at::Tensor& uniforms,
                        const at::Tensor& logits_out, const at::Tensor& input_features, const at::Tensor& feature_proj,
                        const at::Tensor& features_out, bool hold_features, const at::Tensor& step_seconds) {
  return by_weight_dtype("draft_greedy", weights[0], cos, [&](auto element) {
    return draft_greedy_native<decltype(element)>(tokens, start, k, vocab_limit, cos, signed_sin, keys, values, key_blocks,
                                                  weights, n_layers, n_head, n_kv, head_dim, intermediate, vocab, eps,
                                                  head_ids, gumbel, inverse_temperature, uniforms, logits_out,
                                                  input_features, feature_proj, features_out, hold_features,
                                                  step_seconds);
  });
}

// quickdraft::draft_batch: a batch's drafts in one call, draft_greedy for [B] sequences at once.
// tokens, positions [B, T]: what each sequence feeds first, its real rows last (a sequence with
// fewer rows, or none, is padded in front with rows at scratch positions past its data); ks [B]: the
// tokens to draft per sequence (0: none). Every step is one [B, rows] forward attending over cache
// slots [0, window); a sequence done drafting feeds token 0 at the scratch slot capacity - 1.
// gumbel[b], when not empty ([ks[b], V] float32), races sequence b's draws at inverse temperature
// inverse_temperatures[b] (see draft_pick). uniforms[b], when not empty ([ks[b]] float64), draws sequence
// b's tokens instead (draft_sample, as in draft_greedy), and logits_out[b], when not empty ([ks[b], head
// rows] float32), receives its steps' logits. -> drafted [B, max ks] (-1 past a sequence's ks[b]).
// A feature draft passes input_features [B * T, E] for the fed rows (padding rows' zeros), feature_proj
// and features_out [B, slots, E], as draft_greedy does: each sequence's drafted tokens are fed with the
// features their steps computed, or with hold_features its last fed row's again.
template <typename T>
at::Tensor draft_batch_native(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& ks,
                              int64_t window, int64_t vocab_limit, const at::Tensor& cos, const at::Tensor& signed_sin,
                              at::TensorList keys, at::TensorList values, at::TensorList key_blocks, at::TensorList weights, int64_t n_layers,
                              int64_t n_head, int64_t n_kv, int64_t head_dim, int64_t intermediate, int64_t vocab,
                              double eps, const at::Tensor& head_ids, at::TensorList gumbel,
                              at::ArrayRef<double> inverse_temperatures, at::TensorList uniforms,
                              at::TensorList logits_out, const at::Tensor& input_features,
                              const at::Tensor& feature_proj, const at::Tensor& features_out, bool hold_features,
                              const at::Tensor& step_seconds) {
  using Clock = std::chrono::steady_clock;
  auto mark = Clock::now();
  const int64_t batch = tokens.size(0), capacity = keys[0].size(2);
  TORCH_CHECK(input_features.numel() == 0 || features_out.numel() > 0,
              "draft_batch: a feature draft writes the features it feeds back to features_out");
  TORCH_CHECK(tokens.dim() == 2 && positions.sizes() == tokens.sizes() && ks.numel() == batch &&
              ks.scalar_type() == at::kLong && static_cast<int64_t>(gumbel.size()) == batch &&
              static_cast<int64_t>(inverse_temperatures.size()) == batch && static_cast<int64_t>(uniforms.size()) == batch &&
              static_cast<int64_t>(logits_out.size()) == batch && vocab_limit >= 1 && vocab_limit <= vocab &&
              window >= 1 && window <= capacity, "draft_batch: tokens and positions [B, T], ks, gumbel, "
              "inverse temperatures, uniforms and logits_out per sequence, a vocabulary limit, a window within the cache");
  TORCH_CHECK(head_ids.numel() == 0 || (head_ids.numel() == vocab && head_ids.scalar_type() == at::kLong),
              "draft_batch: head_ids maps each of the head's rows to a token id (int64)");
  const at::Tensor k_per = ks.contiguous();
  const auto* k = k_per.data_ptr<int64_t>();
  const int64_t k_max = *std::max_element(k, k + batch);
  TORCH_CHECK(step_seconds.numel() == 0 || (step_seconds.numel() == k_max && step_seconds.scalar_type() == at::kDouble &&
                                           step_seconds.is_contiguous()),
              "draft_batch: step_seconds is a contiguous float64 [max ks] tensor");
  double* step_times = step_seconds.numel() ? step_seconds.data_ptr<double>() : nullptr;
  std::vector<at::Tensor> noise(batch);
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(gumbel[b].numel() == 0 || (gumbel[b].dim() == 2 && gumbel[b].size(0) == k[b] &&
                                           gumbel[b].scalar_type() == at::kFloat),
                "draft_batch: gumbel[b] holds ks[b] rows of float32 noise indexed by token id");
    noise[b] = gumbel[b].contiguous();
    TORCH_CHECK(uniforms[b].numel() == 0 || (uniforms[b].numel() == k[b] && uniforms[b].scalar_type() == at::kDouble &&
                                             uniforms[b].is_contiguous()),
                "draft_batch: uniforms[b] holds one float64 draw in [0, 1) per token sequence b drafts");
    TORCH_CHECK(logits_out[b].numel() == 0 ||
                    (logits_out[b].dim() == 2 && logits_out[b].size(0) == k[b] && logits_out[b].size(1) == vocab &&
                     logits_out[b].scalar_type() == at::kFloat && logits_out[b].is_contiguous()),
                "draft_batch: logits_out[b] is a contiguous float32 [ks[b], head rows] tensor");
  }
  SampleScratch sample_scratch;
  const at::Tensor id_map = head_ids.contiguous();
  const int64_t* row_token = head_ids.numel() ? id_map.data_ptr<int64_t>() : nullptr;
  const auto ids = tokens.options();
  at::Tensor drafted = at::full({batch, k_max}, -1, ids);
  auto* out = drafted.data_ptr<int64_t>();
  at::Tensor feed = tokens.contiguous(), at_positions = positions.contiguous();
  const at::Tensor cache_slots = at::arange(window, ids).view({1, 1, window});
  const at::Tensor no_features = at::empty({0}, weights[0].options());
  std::vector<int64_t> last_position(batch);
  const auto* first_positions = at_positions.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) last_position[b] = first_positions[(b + 1) * tokens.size(1) - 1];
  const bool features = input_features.numel() > 0;
  at::Tensor feed_features = features ? input_features : no_features;
  // hold_features: each sequence's last fed row's feature, fed again with every drafted token
  const at::Tensor held = features && hold_features
      ? input_features.view({batch, tokens.size(1), -1}).select(1, tokens.size(1) - 1).contiguous() : no_features;
  for (int64_t i = 0; i < k_max; ++i) {
    const at::Tensor mask = (cache_slots <= at_positions.unsqueeze(2)).contiguous();  // causal over the window
    const at::Tensor logits = forward_native<T>(feed, at_positions, at_positions, mask, cos, signed_sin, keys, values, key_blocks,
                                                weights, n_layers, n_head, n_kv, head_dim, intermediate, vocab, eps, 1,
                                                feed_features, features ? feature_proj : no_features,
                                                features ? features_out : no_features);
    const T* rows = logits.data_ptr<T>();
    at::Tensor next = at::zeros({batch, 1}, ids), next_positions = at::full({batch, 1}, capacity - 1, ids);
    const at::Tensor next_features = !features ? no_features
        : hold_features ? held : at::zeros({batch, input_features.size(1)}, input_features.options());
    auto* next_token = next.data_ptr<int64_t>();
    auto* next_position = next_positions.data_ptr<int64_t>();
    bool feeding = false;
    for (int64_t b = 0; b < batch; ++b) {
      if (i >= k[b]) continue;
      const T* row = rows + b * vocab;
      if (logits_out[b].numel()) copy_as_float(row, vocab, logits_out[b].data_ptr<float>() + i * vocab);
      const float* g = noise[b].numel() ? noise[b].data_ptr<float>() + i * noise[b].size(1) : nullptr;
      const float scale = static_cast<float>(inverse_temperatures[b]);
      const int64_t best = uniforms[b].numel()
          ? draft_sample(row, vocab_limit, row_token, g, scale, uniforms[b].data_ptr<double>()[i], sample_scratch)
          : draft_pick(row, vocab_limit, row_token, g, scale);
      out[b * k_max + i] = best;
      if (i + 1 < k[b]) {
        if (features && !hold_features) next_features[b].copy_(features_out[b][last_position[b]]);
        next_token[b] = best;
        next_position[b] = ++last_position[b];
        feeding = true;
      }
    }
    if (step_times) {  // each step's time: the first also feeds what the call was given
      const auto now = Clock::now();
      step_times[i] = std::chrono::duration<double>(now - mark).count();
      mark = now;
    }
    if (!feeding) break;
    feed = next;
    at_positions = next_positions;
    feed_features = next_features;
  }
  return drafted;
}

at::Tensor draft_batch(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& ks, int64_t window,
                       int64_t vocab_limit, const at::Tensor& cos, const at::Tensor& signed_sin, at::TensorList keys,
                       at::TensorList values, at::TensorList key_blocks, at::TensorList weights, int64_t n_layers, int64_t n_head, int64_t n_kv,
                       int64_t head_dim, int64_t intermediate, int64_t vocab, double eps, const at::Tensor& head_ids,
                       at::TensorList gumbel, at::ArrayRef<double> inverse_temperatures, at::TensorList uniforms,
                       at::TensorList logits_out, const at::Tensor& input_features, const at::Tensor& feature_proj,
                       const at::Tensor& features_out, bool hold_features, const at::Tensor& step_seconds) {
  return by_weight_dtype("draft_batch", weights[0], cos, [&](auto element) {
    return draft_batch_native<decltype(element)>(tokens, positions, ks, window, vocab_limit, cos, signed_sin, keys,
                                                 values, key_blocks, weights, n_layers, n_head, n_kv, head_dim, intermediate,
                                                 vocab, eps, head_ids, gumbel, inverse_temperatures, uniforms,
                                                 logits_out, input_features, feature_proj, features_out,
                                                 hold_features, step_seconds);
  });
}

// quickdraft::nucleus_keep: rows of probabilities [rows, vocab] (fp32) with every token past the
// row's top-p nucleus zeroed, by sampling._nucleus's definition (the caller renormalises): in order
// of descending probability, ties by the lower token id first, token j goes when the fp32
// cumulative mass before it, (cum_j - p_j), reaches top_p; the first token always stays. The
// cumulative sum is torch's on the CPU (a double accumulator rounded to fp32 at each step), so the
// kept set has the same bits as the stable full sort. As in Python, only the tokens of the highest
// fp32 exponents that hold top_p + margin of the mass are sorted: every other token is smaller
// than all of them, so they lead the full sort in the same order; a row whose candidates fall
// short of the margin (rounding) is sorted whole. One call replaces ~25 tensor ops a call
// (~0.2 ms on one row of the embedded target's 8,192 tokens).
// One row of nucleus_keep: kept[v] = p[v] for the nucleus' tokens, kept left as it was (zeros)
// elsewhere. candidates is scratch space.
void keep_nucleus_row(const float* p, int64_t vocab, double top_p, double margin, float* kept,
                      std::vector<std::pair<float, int64_t>>& candidates) {
  const float cut = static_cast<float>(top_p);  // torch compares an fp32 tensor with top_p in fp32
  auto exponent = [](float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    return static_cast<int>((bits >> 23) & 0xff);
  };
  double mass[256] = {};
  for (int64_t v = 0; v < vocab; ++v) mass[exponent(p[v])] += p[v];
  int floor = 0;
  double above = 0.0;
  for (int e = 255; e > 0; --e) {
    above += mass[e];
    if (above >= top_p + 2 * margin) {
      floor = e;
      break;
    }
  }
  for (int pass = 0; pass < 2; ++pass) {
    candidates.clear();
    for (int64_t v = 0; v < vocab; ++v)
      if (exponent(p[v]) >= floor) candidates.emplace_back(p[v], v);
    std::sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    double running = 0.0;
    for (const auto& c : candidates) running += c.first;
    if (floor == 0 || running >= top_p + margin) break;
    floor = 0;  // rounding left the cut outside the candidates: every token is one
  }
  double running = 0.0;
  for (size_t j = 0; j < candidates.size(); ++j) {
    const float value = candidates[j].first;
    running += value;
    const float cumulative = static_cast<float>(running);
    if (j == 0 || !(cumulative - value >= cut)) kept[candidates[j].second] = value;
  }
}

// quickdraft::first_maxima: each row's first maximum (logits [rows, vocab], bf16 or fp32, the last dim
// contiguous) -> int64 [rows], what torch.max(logits, -1) indexes (greedy verification's argmax); a row
// holding a NaN is torch.max's own answer. torch.max reads a bf16 row at ~1.2 ns an element here: a 5-row
// verify's argmax was ~3% of the embedded target's step.
at::Tensor first_maxima(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1 && logits.size(1) > 0 &&
              (logits.scalar_type() == at::kBFloat16 || logits.scalar_type() == at::kFloat),
              "first_maxima: [rows, vocab] bf16 or fp32 logits, each row contiguous");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  at::Tensor out = at::empty({rows}, logits.options().dtype(at::kLong));
  auto* best = out.data_ptr<int64_t>();
  const auto pick = [&](auto element) {
    using T = decltype(element);
    const T* base = logits.data_ptr<T>();
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = base + r * logits.stride(0);
      bool nan = false;
      for (int64_t v = 0; v < vocab; v += kLanes) nan |= Simd::any_nan(Simd::load(row + v, vocab - v));
      best[r] = nan ? std::get<1>(at::max(logits[r], 0)).item<int64_t>() : draft_pick(row, vocab, nullptr, nullptr, 1.0f);
    }
  };
  if (logits.scalar_type() == at::kBFloat16)
    pick(at::BFloat16{});
  else
    pick(float{});
  return out;
}

at::Tensor nucleus_keep(const at::Tensor& probs, double top_p, double margin) {
  TORCH_CHECK(probs.dim() == 2 && probs.scalar_type() == at::kFloat, "nucleus_keep: float32 [rows, vocab]");
  const at::Tensor x = probs.contiguous();
  at::Tensor out = at::zeros_like(x);
  const int64_t rows = x.size(0), vocab = x.size(1);
  std::vector<std::pair<float, int64_t>> candidates;
  candidates.reserve(vocab);
  for (int64_t r = 0; r < rows; ++r)
    keep_nucleus_row(x.data_ptr<float>() + r * vocab, vocab, top_p, margin, out.data_ptr<float>() + r * vocab,
                     candidates);
  return out;
}

// The first v maximising p[v] / e[v] (IEEE divisions, as torch computes them; p >= 0, e > 0).
// Vectorised as draft_pick: each block's maximum, then the first token reaching the row's maximum.
int64_t first_max_ratio(const float* p, const float* e, int64_t n) {
  auto scores = [&](int64_t v, int64_t count) {  // lanes past count: 0, below every score that can win
    return Simd::first(Simd::div(Simd::load(p + v, count), Simd::load(e + v, count)), count);
  };
  float top = -INFINITY;
  int64_t top_block = 0;
  for (int64_t b = 0; b < n; b += kPickBlock) {
    V m = Simd::set1(-INFINITY);
    for (int64_t v = b; v < std::min(b + kPickBlock, n); v += kLanes) m = Simd::max(m, scores(v, std::min(kLanes, n - v)));
    if (const float block_top = Simd::top(m); block_top > top) {
      top = block_top;
      top_block = b;
    }
  }
  alignas(64) float lanes[kLanes];
  for (int64_t v = top_block; v < std::min(top_block + kPickBlock, n); v += kLanes) {
    const int64_t count = std::min(kLanes, n - v);
    Simd::store(lanes, scores(v, count));
    for (int64_t l = 0; l < count; ++l)
      if (lanes[l] == top) return v + l;
  }
  return 0;  // every score NaN
}

// quickdraft::exponential_noise: rows [keys, vocab] of Exp(1) noise, row i a pure function of
// keys[i] (randomness.position_seed): entry v is -ln(u) with u = (2k + 1) / 2^24 in (0, 1), k the
// top 23 bits of the SplitMix64 output for counter v + 1 (state key + (v + 1) * golden gamma).
// The logarithm is Cephes' logf (frexp, a degree-9 polynomial, ln 2 split in two), every step one
// IEEE multiply or add (the library is built with -ffp-contract=off: no fused multiply-add), so
// randomness.py computes the same bits with torch's elementwise ops where these kernels do not run.
// GCC's generic vectors, not Simd: the steps mix integer and float lanes; elementwise only, so the
// same bits at any width. On AVX-512 four 16-lane vectors at a time, and the hash in vectors where
// AVX-512DQ multiplies 64-bit lanes: 16 rows of 8,192 on Zen 4 took 219 us with one 8-lane vector at
// a time and a scalar hash, 113 so.
namespace noise {
// Lanes a vector, and vectors in flight: the logarithm is a long chain of dependent steps. AVX2's 16
// registers hold one 8-lane chain; wider or more chains spilled (16 rows of 8,192: 236 us as it is,
// 244 with two chains, 321 with four, 329 with one of 16 lanes).
#if defined(__AVX512F__)
constexpr int kWidth = 16, kChains = 4;
#else
constexpr int kWidth = 8, kChains = 1;
#endif
typedef float Floats __attribute__((vector_size(4 * kWidth)));
typedef int32_t Ints __attribute__((vector_size(4 * kWidth)));
typedef uint32_t Levels __attribute__((vector_size(4 * kWidth)));
typedef uint64_t States __attribute__((vector_size(8 * kWidth)));

// Arguments and results by reference: a 64-byte vector passed by value changes the ABI on AVX2,
// and GCC warns so on every build.

// The top 23 bits of SplitMix64's output for counter v + 1 from key: entry v's level.
inline uint32_t level(uint64_t key, int64_t v) {
  uint64_t z = key + static_cast<uint64_t>(v + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>((z ^ (z >> 31)) >> 41);
}

// The levels of entries v .. v + kWidth - 1. AVX-512DQ multiplies 64-bit lanes in one instruction, and
// the hash runs in the vectors; without it each vector product is three 32-bit ones, slower than
// the scalar hash, which then fills the whole row's levels in a pass of its own (``filled``): read
// back at once, a vector of scalar stores stalls its load.
inline void levels(uint64_t key, int64_t v, const uint32_t* filled, Levels& out) {
#if defined(__AVX512DQ__)
  (void)filled;
  States z;
  for (int l = 0; l < kWidth; ++l) z[l] = static_cast<uint64_t>(v + l + 1);
  z = key + z * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  out = __builtin_convertvector((z ^ (z >> 31)) >> 41, Levels);
#else
  (void)key;
  std::memcpy(&out, filled + v, sizeof out);
#endif
}

// -ln((2k + 1) / 2^24) for a vector of levels k < 2^23.
inline void negative_log(const Levels& level, Floats& out) {
  const Floats u = __builtin_convertvector(__builtin_convertvector(2 * level + 1, Ints), Floats) * 0x1p-24f;  // exact
  const Levels bits = __builtin_bit_cast(Levels, u);
  Floats exponent = __builtin_convertvector(__builtin_convertvector(bits >> 23, Ints) - 126, Floats);  // u = m * 2^e
  const Floats m = __builtin_bit_cast(Floats, (bits & 0x007FFFFFu) | 0x3F000000u);  // m in [0.5, 1)
  const Floats one = Floats{} + 1.0f;
  const Ints below = m < 0.707106781186547524f;  // all ones where m < sqrt(1/2)
  const Floats is_small = __builtin_bit_cast(Floats, below & __builtin_bit_cast(Ints, one));  // 1 there: x = 2m - 1 and e - 1
  exponent = exponent - is_small;
  const Floats x = (m + m * is_small) - 1.0f;
  const Floats x2 = x * x;
  Floats y = Floats{} + 7.0376836292E-2f;
  for (const float c : {-1.1514610310E-1f, 1.1676998740E-1f, -1.2420140846E-1f, 1.4249322787E-1f,
                        -1.6668057665E-1f, 2.0000714765E-1f, -2.4999993993E-1f, 3.3333331174E-1f})
    y = y * x + c;
  y = (y * x) * x2;
  y = y + exponent * -2.12194440E-4f;
  y = y - x2 * 0.5f;
  const Floats log_u = (x + y) + exponent * 0.693359375f;
  out = 0.0f - log_u;
}
}  // namespace noise

at::Tensor exponential_noise(const at::Tensor& keys, int64_t vocab) {
  TORCH_CHECK(keys.dim() == 1 && keys.scalar_type() == at::kLong, "exponential_noise: int64 keys [n]");
  TORCH_CHECK(vocab >= 0, "exponential_noise: vocab must be >= 0");
  const at::Tensor k = keys.contiguous();
  at::Tensor out = at::empty({k.size(0), vocab}, at::kFloat);
  std::vector<uint32_t> filled;  // without AVX-512DQ: the row's levels, padded to whole vectors
#if !defined(__AVX512DQ__)
  filled.resize(vocab + noise::kWidth);
#endif
  for (int64_t r = 0; r < k.size(0); ++r) {
    const uint64_t key = static_cast<uint64_t>(k.data_ptr<int64_t>()[r]);
    if (!filled.empty())
      for (int64_t v = 0; v < vocab; ++v) filled[v] = noise::level(key, v);
    float* e = out.data_ptr<float>() + r * vocab;
    int64_t v = 0;
    constexpr int kChains = noise::kChains;
    for (; v + kChains * noise::kWidth <= vocab; v += kChains * noise::kWidth) {
      noise::Levels level[kChains];
      noise::Floats values[kChains];
      for (int c = 0; c < kChains; ++c) noise::levels(key, v + c * noise::kWidth, filled.data(), level[c]);
      for (int c = 0; c < kChains; ++c) noise::negative_log(level[c], values[c]);
      std::memcpy(e + v, values, sizeof values);
    }
    for (; v < vocab; v += noise::kWidth) {
      noise::Levels level;
      noise::levels(key, v, filled.data(), level);
      noise::Floats values;
      noise::negative_log(level, values);
      std::memcpy(e + v, &values, sizeof(float) * std::min<int64_t>(noise::kWidth, vocab - v));
    }
  }
  return out;
}

// The values of the tokens ahead of w in the nucleus' order (greater probabilities, or equal with
// lower ids) into before, in token order; their sum (a double, in token order). A vector compare
// finds them: w is usually among a row's likeliest tokens, and a scalar scan of an 8,192-token
// row was most of a top-p race (16 rows: 127 us against 20 without top-p).
double ahead_of(const float* p, int64_t vocab, int64_t w, std::vector<float>& before) {
  before.clear();
  const float pw = p[w];
  const V threshold = Simd::set1(pw);
  double sum = 0.0;
  for (int64_t v = 0; v < vocab; v += kLanes) {
    const int64_t n = std::min(kLanes, vocab - v);
    uint32_t ahead = 0;
    if (w >= v && w < v + n) {  // w's own vector: lower ids tie in, higher ones must exceed it
      for (int64_t l = 0; l < n; ++l)
        if (p[v + l] > pw || (p[v + l] == pw && v + l < w)) ahead |= 1u << l;
    } else {
      // A vector before w's is whole; after it, the lanes past the row's end load as 0, never above pw >= 0.
      const V values = Simd::load(p + v, n);
      ahead = v < w ? Simd::at_least(values, threshold) : Simd::above(values, threshold);
    }
    for (; ahead; ahead &= ahead - 1) {
      const float value = p[v + __builtin_ctz(ahead)];
      before.push_back(value);
      sum += value;
    }
  }
  return sum;
}

// quickdraft::nucleus_race: the coupled rule's token for each row of probabilities [rows, vocab]
// (fp32, after temperature and top-k, before the nucleus) with its position's noise [rows, vocab]
// (Exp(1), > 0): the first token maximising kept[v] / noise[v], where kept is nucleus_keep's row
// (not renormalised: a common factor changes no maximum, and leaving it out spares a sum whose bits
// are torch's). Fast path, almost every row: the race over the whole row; its winner w is in the
// nucleus when the mass before it (the tokens of greater probability, or equal with a lower id)
// does not reach top_p, by nucleus_keep's own test on the same sorted prefix of values; then w
// wins the nucleus' race too (the nucleus is a subset holding w, and no earlier token ties it).
// Otherwise the row's nucleus is built and raced. Bit for bit the token of
// (nucleus_keep(p) / noise).argmax(-1) in torch.
at::Tensor nucleus_race(const at::Tensor& probs, const at::Tensor& noise, double top_p, double margin) {
  TORCH_CHECK(probs.dim() == 2 && probs.scalar_type() == at::kFloat, "nucleus_race: probs float32 [rows, vocab]");
  TORCH_CHECK(noise.sizes() == probs.sizes() && noise.scalar_type() == at::kFloat,
              "nucleus_race: noise float32 shaped like probs");
  const at::Tensor x = probs.contiguous(), e_all = noise.contiguous();
  const int64_t rows = x.size(0), vocab = x.size(1);
  at::Tensor tokens = at::empty({rows}, at::kLong);
  const float cut = static_cast<float>(top_p);
  std::vector<float> before, kept;
  std::vector<std::pair<float, int64_t>> candidates;
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = x.data_ptr<float>() + r * vocab;
    const float* e = e_all.data_ptr<float>() + r * vocab;
    int64_t w = first_max_ratio(p, e, vocab);
    if (top_p < 1.0) {
      const float pw = p[w];
      const double unsorted = ahead_of(p, vocab, w, before);
      bool in_nucleus = before.empty();
      if (!in_nucleus && unsorted < top_p + margin) {  // past that, the sorted sum reaches top_p too
        std::sort(before.begin(), before.end(), std::greater<float>());
        double running = 0.0;
        for (const float value : before) running += value;
        running += pw;
        in_nucleus = !(static_cast<float>(running) - pw >= cut);
      }
      if (!in_nucleus) {
        kept.assign(vocab, 0.0f);
        keep_nucleus_row(p, vocab, top_p, margin, kept.data(), candidates);
        w = first_max_ratio(kept.data(), e, vocab);
      }
    }
    tokens.data_ptr<int64_t>()[r] = w;
  }
  return tokens;
}

}  // namespace

TORCH_LIBRARY(quickdraft, m) {
  m.def("linear_bf16(Tensor x, Tensor packed, Tensor? bias, int n_out) -> Tensor");
  m.def("attend_bf16(Tensor q, Tensor keys, Tensor values, Tensor mask) -> Tensor");
  m.def("rms_norm_bf16(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("forward(Tensor tokens, Tensor positions, Tensor slots, Tensor mask, Tensor cos, Tensor signed_sin, "
        "Tensor(a!)[] keys, Tensor(b!)[] values, Tensor(k!)[] key_blocks, Tensor[] weights, int n_layers, int n_head, int n_kv, int head_dim, "
        "int intermediate, int vocab, float eps, int logits_rows, Tensor input_features, Tensor feature_proj, "
        "Tensor(c!) features_out) -> Tensor");
  m.def("draft_greedy(Tensor tokens, int start, int k, int vocab_limit, Tensor cos, Tensor signed_sin, "
        "Tensor(a!)[] keys, Tensor(b!)[] values, Tensor(k!)[] key_blocks, Tensor[] weights, int n_layers, int n_head, int n_kv, int head_dim, "
        "int intermediate, int vocab, float eps, Tensor head_ids, Tensor gumbel, float inverse_temperature, "
        "Tensor uniforms, Tensor(c!) logits_out, Tensor input_features, Tensor feature_proj, "
        "Tensor(d!) features_out, bool hold_features, Tensor(e!) step_seconds) -> Tensor");
  m.def("draft_batch(Tensor tokens, Tensor positions, Tensor ks, int window, int vocab_limit, Tensor cos, "
        "Tensor signed_sin, Tensor(a!)[] keys, Tensor(b!)[] values, Tensor(k!)[] key_blocks, Tensor[] weights, int n_layers, int n_head, "
        "int n_kv, int head_dim, int intermediate, int vocab, float eps, Tensor head_ids, Tensor[] gumbel, "
        "float[] inverse_temperatures, Tensor[] uniforms, Tensor(c!)[] logits_out, Tensor input_features, "
        "Tensor feature_proj, Tensor(d!) features_out, bool hold_features, Tensor(e!) step_seconds) -> Tensor");
  m.def("nucleus_keep(Tensor probs, float top_p, float margin) -> Tensor");
  m.def("first_maxima(Tensor logits) -> Tensor");
  m.def("int8_products() -> bool", &int8_products);
  m.def("set_min_task_work(int work) -> ()", &set_min_task_work);
  m.def("min_task_work() -> int", &min_task_work);
  m.def("exponential_noise(Tensor keys, int vocab) -> Tensor");
  m.def("nucleus_race(Tensor probs, Tensor noise, float top_p, float margin) -> Tensor");
}

TORCH_LIBRARY_IMPL(quickdraft, CPU, m) {
  m.impl("linear_bf16", &linear_bf16);
  m.impl("attend_bf16", &attend_bf16);
  m.impl("rms_norm_bf16", &rms_norm_bf16);
  m.impl("forward", &forward);
  m.impl("draft_greedy", &draft_greedy);
  m.impl("draft_batch", &draft_batch);
  m.impl("nucleus_keep", &nucleus_keep);
  m.impl("first_maxima", &first_maxima);
  m.impl("exponential_noise", &exponential_noise);
  m.impl("nucleus_race", &nucleus_race);
}
