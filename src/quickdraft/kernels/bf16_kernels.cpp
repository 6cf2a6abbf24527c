// quickdraft's bf16 decode kernels (AVX512-BF16): the weight products and the attention of steps
// of a few rows. Each computes a row the same way whatever the other rows, the batch or the cache
// window: exact mode's row and batch invariance hold by construction.
//
// quickdraft::linear_bf16: y = x @ W^T (+ bias) for a few rows of bf16 activations against a
// bf16 weight packed once for AVX512-BF16 dot products.
//
// Why our own product: for 1-33 rows the library kernels cost 2-3x more at 5 rows than at 1
// (embedded target, Zen 4, 1 thread), while the weights - the step's real cost - are read once
// either way. Here each 64-column block of the weight is streamed once per 6-row tile, so extra
// rows cost compute only, and every output element is the same sequence of instructions whatever
// the number of rows, its place among them or the thread count: a row's bits do not depend on its
// neighbours (exact mode's row invariance by construction).
//
// Packed layout [ceil(N/64), K/2, 64, 2]: for each block of 64 output columns and each pair of
// inputs (2p, 2p+1), the 64 columns' two weights side by side - one 256-byte line per pair, as
// _mm512_dpbf16_ps consumes them (K even; N padded with zero columns).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t kBlockColumns = 64;  // 4 zmm of 16 fp32 accumulators per row
constexpr int64_t kTileRows = 6;       // 6 rows x 4 accumulators + 4 weight registers + 1 broadcast <= 32 zmm

template <int Rows>
void tile(const uint32_t* x, int64_t x_stride, const __m512i* weights, int64_t pairs, const float* bias,
          at::BFloat16* y, int64_t y_stride, int64_t columns) {
  __m512 acc[Rows][4];
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512i* line = weights + 4 * p;
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(line);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(line + 1);
    const __m512bh w2 = (__m512bh)_mm512_loadu_si512(line + 2);
    const __m512bh w3 = (__m512bh)_mm512_loadu_si512(line + 3);
    for (int r = 0; r < Rows; ++r) {
      const __m512bh xp = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[r * x_stride + p]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xp, w0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xp, w1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], xp, w2);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], xp, w3);
    }
  }
  for (int c = 0; c < 4; ++c) {
    const int64_t first = c * 16;
    if (first >= columns) break;
    const __mmask16 keep = columns - first >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (columns - first)) - 1);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(keep, bias + first) : _mm512_setzero_ps();
    for (int r = 0; r < Rows; ++r) {
      const __m256bh out = _mm512_cvtneps_pbh(_mm512_add_ps(acc[r][c], b));
      _mm256_mask_storeu_epi16(y + r * y_stride + first, keep, (__m256i)out);
    }
  }
}

using Tile = void (*)(const uint32_t*, int64_t, const __m512i*, int64_t, const float*, at::BFloat16*, int64_t, int64_t);
constexpr Tile kTiles[kTileRows + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};

// y [m, n_out] = x [m, K] @ W^T (+ bias, fp32), W packed [ceil(n_out/64), K/2, 64, 2].
void linear_rows(const at::BFloat16* x, int64_t m, const at::Tensor& packed, const float* bias, int64_t n_out,
                 at::BFloat16* y) {
  const int64_t pairs = packed.size(1), blocks = packed.size(0);
  const auto* xs = reinterpret_cast<const uint32_t*>(x);
  const auto* ws = reinterpret_cast<const __m512i*>(packed.data_ptr<at::BFloat16>());
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t first = block * kBlockColumns;
      const int64_t columns = std::min(kBlockColumns, n_out - first);
      const __m512i* w = ws + block * pairs * 4;
      for (int64_t r = 0; r < m; r += kTileRows) {
        const int64_t n = std::min(kTileRows, m - r);
        kTiles[n](xs + r * pairs, pairs, w, pairs, bias ? bias + first : nullptr, y + r * n_out + first, n_out, columns);
      }
    }
  });
}

void check_packed(const at::Tensor& packed, int64_t k, int64_t n_out) {
  TORCH_CHECK(packed.scalar_type() == at::kBFloat16 && packed.dim() == 4 && packed.size(2) == kBlockColumns &&
              packed.size(3) == 2 && packed.is_contiguous(), "weight not packed by quickdraft.kernels.pack_bf16");
  TORCH_CHECK(k == 2 * packed.size(1) && n_out <= packed.size(0) * kBlockColumns &&
              n_out > (packed.size(0) - 1) * kBlockColumns, "shapes do not match the packed weight");
}

at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                       int64_t n_out) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, "linear_bf16: bf16 only");
  const int64_t k = x.size(-1);
  check_packed(packed, k, n_out);
  at::Tensor rows = x.reshape({-1, k}).contiguous();
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = n_out;
  at::Tensor y = at::empty({rows.size(0), n_out}, x.options());
  at::Tensor bias_f32;
  if (bias.has_value()) bias_f32 = bias->to(at::kFloat).contiguous();
  linear_rows(rows.data_ptr<at::BFloat16>(), rows.size(0), packed,
              bias.has_value() ? bias_f32.data_ptr<float>() : nullptr, n_out, y.data_ptr<at::BFloat16>());
  return y.view(out_shape);
}

// ---- fp32 products ---------------------------------------------------------------------------
// The same scheme for fp32 weights (no bf16 unit needed): packed [ceil(N/64), K, 64], each input
// k's 64 column weights in one 256-byte line, fused multiply-adds in input order.
template <int Rows>
void tile_f32(const float* x, int64_t x_stride, const float* weights, int64_t k, const float* bias, float* y,
              int64_t y_stride, int64_t columns) {
  __m512 acc[Rows][4];
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    const float* line = weights + kBlockColumns * p;
    const __m512 w0 = _mm512_loadu_ps(line), w1 = _mm512_loadu_ps(line + 16);
    const __m512 w2 = _mm512_loadu_ps(line + 32), w3 = _mm512_loadu_ps(line + 48);
    for (int r = 0; r < Rows; ++r) {
      const __m512 xp = _mm512_set1_ps(x[r * x_stride + p]);
      acc[r][0] = _mm512_fmadd_ps(xp, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(xp, w1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(xp, w2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(xp, w3, acc[r][3]);
    }
  }
  for (int c = 0; c < 4; ++c) {
    const int64_t first = c * 16;
    if (first >= columns) break;
    const __mmask16 keep = columns - first >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (columns - first)) - 1);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(keep, bias + first) : _mm512_setzero_ps();
    for (int r = 0; r < Rows; ++r) _mm512_mask_storeu_ps(y + r * y_stride + first, keep, _mm512_add_ps(acc[r][c], b));
  }
}

using TileF32 = void (*)(const float*, int64_t, const float*, int64_t, const float*, float*, int64_t, int64_t);
constexpr TileF32 kTilesF32[kTileRows + 1] = {nullptr, tile_f32<1>, tile_f32<2>, tile_f32<3>, tile_f32<4>,
                                               tile_f32<5>, tile_f32<6>};

void linear_rows(const float* x, int64_t m, const at::Tensor& packed, const float* bias, int64_t n_out, float* y) {
  const int64_t k = packed.size(1), blocks = packed.size(0);
  const float* ws = packed.data_ptr<float>();
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
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

void check_packed_f32(const at::Tensor& packed, int64_t k, int64_t n_out) {
  TORCH_CHECK(packed.scalar_type() == at::kFloat && packed.dim() == 3 && packed.size(2) == kBlockColumns &&
              packed.is_contiguous(), "weight not packed by quickdraft.kernels.pack_f32");
  TORCH_CHECK(k == packed.size(1) && n_out <= packed.size(0) * kBlockColumns &&
              n_out > (packed.size(0) - 1) * kBlockColumns, "shapes do not match the packed weight");
}

inline void check_packed_for(const at::BFloat16*, const at::Tensor& packed, int64_t k, int64_t n) { check_packed(packed, k, n); }
inline void check_packed_for(const float*, const at::Tensor& packed, int64_t k, int64_t n) { check_packed_f32(packed, k, n); }

// ---- attention ------------------------------------------------------------------------------
// Each query row attends over the cache slots its mask marks. A row's result is a function of
// the ordered list of its visible (key, value) pairs only: scores are separate dot products, the
// softmax denominator is a sequential sum and the weighted values are accumulated slot after slot.
// So it does not depend on the window, on where the visible slots sit (a token tree's scattered
// ancestors get the bits of the same tokens fed as a chain) or on other rows. Masked slots cost a
// byte read.

// e^x, x clamped to [-87, 88]: Cody-Waite range reduction and a degree-6 polynomial, ~1 ulp in fp32.
inline __m512 exp_clamped(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

inline __mmask16 lanes(int64_t remaining) {
  return remaining >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << remaining) - 1);
}

inline __m512 load_bf16(const at::BFloat16* p, __mmask16 keep) {
  return _mm512_cvtpbh_ps((__m256bh)_mm256_maskz_loadu_epi16(keep, p));
}

inline void store_bf16(at::BFloat16* p, __mmask16 keep, __m512 v) {
  _mm256_mask_storeu_epi16(p, keep, (__m256i)_mm512_cvtneps_pbh(v));
}

// Loads, stores and the rounding a value gets when the eager model stores it, per element type.
template <typename T>
struct Elem;
template <>
struct Elem<at::BFloat16> {
  static __m512 load(const at::BFloat16* p, __mmask16 keep) { return load_bf16(p, keep); }
  static void store(at::BFloat16* p, __mmask16 keep, __m512 v) { store_bf16(p, keep, v); }
  static __m512 round(__m512 v) { return _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(v)); }
};
template <>
struct Elem<float> {
  static __m512 load(const float* p, __mmask16 keep) { return _mm512_maskz_loadu_ps(keep, p); }
  static void store(float* p, __mmask16 keep, __m512 v) { _mm512_mask_storeu_ps(p, keep, v); }
  static __m512 round(__m512 v) { return v; }
};

constexpr int kMaxHeadChunks = 16;  // head_dim <= 256

// Query rows of head h for sequence b, step row i at q + ((b * t + i) * q_row + h * d) (q_row: a
// step row's stride); out likewise with out_row. keys/values [B, Hkv, C, D] with strides
// (k0, k1, d, 1); mask [B or 1, t, c].
struct AttentionLayout {
  int64_t batch, t, n_head, n_kv, d, c;
  int64_t q_row, out_row, k0, k1, v0, v1, mask_batches;
};

// All query rows that share one key/value head (the step's rows x the group's query heads) in one
// pass over the cache: each key and value is loaded once for all of them. Every row still runs the
// same instructions on the same data in the same order as it would alone - its visible slots in
// slot order - so its bits do not depend on the others.
template <typename T>
void attend_group(const AttentionLayout& a, int64_t b, int64_t kv, const T* q, const T* keys,
                  const T* values, const bool* mask, T* out) {
  const int64_t group = a.n_head / a.n_kv, rows = a.t * group, c = a.c, d = a.d;
  const int64_t chunks = (d + 15) / 16, stride = c + 16;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<float> queries(rows * chunks * 16), scores(rows * stride), acc(rows * chunks * 16, 0.0f);
  std::vector<int64_t> count(rows, 0);
  std::vector<const bool*> masks(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r / group, h = kv * group + r % group;
    const T* qrow = q + (b * a.t + i) * a.q_row + h * d;
    for (int64_t e = 0; e < chunks; ++e)
      _mm512_storeu_ps(&queries[(r * chunks + e) * 16],
                       _mm512_mul_ps(Elem<T>::load(qrow + 16 * e, lanes(d - 16 * e)), _mm512_set1_ps(scale)));
    masks[r] = mask + ((a.mask_batches == 1 ? 0 : b) * a.t + i) * c;
  }
  const T* kh = keys + b * a.k0 + kv * a.k1;
  const T* vh = values + b * a.v0 + kv * a.v1;
  __m512 vec[kMaxHeadChunks];
  // Slot after slot, for every row that sees the slot: load the head's vector there once (into
  // vec), then visit(r). Each row meets its visible slots in slot order.
  const auto scan = [&](const T* head, const auto& visit) {
    for (int64_t s = 0; s < c; ++s) {
      bool loaded = false;
      for (int64_t r = 0; r < rows; ++r) {
        if (!masks[r][s]) continue;
        if (!loaded) {
          for (int64_t e = 0; e < chunks; ++e) vec[e] = Elem<T>::load(head + s * d + 16 * e, lanes(d - 16 * e));
          loaded = true;
        }
        visit(r);
      }
    }
  };
  scan(kh, [&](int64_t r) {  // scores
    const float* qr = &queries[r * chunks * 16];
    __m512 dot = _mm512_mul_ps(_mm512_loadu_ps(qr), vec[0]);
    for (int64_t e = 1; e < chunks; ++e) dot = _mm512_fmadd_ps(_mm512_loadu_ps(qr + 16 * e), vec[e], dot);
    scores[r * stride + count[r]++] = _mm512_reduce_add_ps(dot);
  });
  std::vector<float> inverse(rows, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {  // softmax weights in place; the denominator summed in slot order
    const int64_t n = count[r];
    float* score = &scores[r * stride];
    float top = -INFINITY;
    for (int64_t j = 0; j < n; ++j) top = std::max(top, score[j]);
    const __m512 top_v = _mm512_set1_ps(top);
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 part = lanes(n - j);
      _mm512_mask_storeu_ps(score + j, part, exp_clamped(_mm512_sub_ps(_mm512_maskz_loadu_ps(part, score + j), top_v)));
    }
    float total = 0.0f;
    for (int64_t j = 0; j < n; ++j) total += score[j];
    inverse[r] = n ? 1.0f / total : 0.0f;
    count[r] = 0;
  }
  scan(vh, [&](int64_t r) {  // weighted values
    const __m512 w = _mm512_set1_ps(scores[r * stride + count[r]++]);
    float* ar = &acc[r * chunks * 16];
    for (int64_t e = 0; e < chunks; ++e) _mm512_storeu_ps(ar + 16 * e, _mm512_fmadd_ps(w, vec[e], _mm512_loadu_ps(ar + 16 * e)));
  });
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r / group, h = kv * group + r % group;
    T* o = out + (b * a.t + i) * a.out_row + h * d;
    const __m512 inv = _mm512_set1_ps(inverse[r]);
    for (int64_t e = 0; e < chunks; ++e)
      Elem<T>::store(o + 16 * e, lanes(d - 16 * e), _mm512_mul_ps(_mm512_loadu_ps(&acc[(r * chunks + e) * 16]), inv));
  }
}

template <typename T>
void attend_rows(const AttentionLayout& a, const T* q, const T* keys, const T* values,
                 const bool* mask, T* out) {
  TORCH_CHECK(a.d <= 16 * kMaxHeadChunks, "attention: head_dim over 256");
  at::parallel_for(0, a.batch * a.n_kv, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) attend_group<T>(a, task / a.n_kv, task % a.n_kv, q, keys, values, mask, out);
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
  attend_rows<at::BFloat16>(layout, rows.data_ptr<at::BFloat16>(), keys.data_ptr<at::BFloat16>(), values.data_ptr<at::BFloat16>(),
              m.data_ptr<bool>(), y.data_ptr<at::BFloat16>());
  return y.transpose(1, 2);
}

// ---- RMSNorm --------------------------------------------------------------------------------
// weight * bf16(x / rms(x)), the sum of squares in fp32 in one fixed order per row
// (torch.compile's fused norms vectorise the reduction differently per row count).
template <typename T>
void rms_norm_rows(const T* x, int64_t m, int64_t h, const T* w, float eps, T* y) {
  const int64_t chunks = (h + 15) / 16;
  for (int64_t r = 0; r < m; ++r) {
    const T* xr = x + r * h;
    __m512 squares = _mm512_setzero_ps();
    for (int64_t j = 0; j < chunks; ++j) {
      const __m512 v = Elem<T>::load(xr + 16 * j, lanes(h - 16 * j));
      squares = _mm512_fmadd_ps(v, v, squares);
    }
    const float inverse = 1.0f / std::sqrt(_mm512_reduce_add_ps(squares) / static_cast<float>(h) + eps);
    const __m512 scale = _mm512_set1_ps(inverse);
    for (int64_t j = 0; j < chunks; ++j) {
      const __mmask16 keep = lanes(h - 16 * j);
      const __m512 normed = Elem<T>::round(_mm512_mul_ps(Elem<T>::load(xr + 16 * j, keep), scale));
      Elem<T>::store(y + r * h + 16 * j, keep, _mm512_mul_ps(normed, Elem<T>::load(w + 16 * j, keep)));
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
// out (packed), mlp_norm [E], up (packed, gate then up), down (packed); then norm [E], head (packed).
template <typename T>
at::Tensor forward_native(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& slots,
                        const at::Tensor& mask, const at::Tensor& cos, const at::Tensor& signed_sin,
                        at::TensorList keys, at::TensorList values, at::TensorList weights, int64_t n_layers,
                        int64_t n_head, int64_t n_kv, int64_t head_dim, int64_t intermediate, int64_t vocab,
                        double eps) {
  constexpr int64_t kPerLayer = 7;
  const int64_t batch = tokens.size(0), t = tokens.size(1), m = batch * t;
  const at::Tensor& embed = weights[0];
  const int64_t e = embed.size(1), d = head_dim, q_dim = n_head * d, kv_dim = n_kv * d;
  const int64_t qkv_dim = q_dim + 2 * kv_dim, half = d / 2;
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == 1 + kPerLayer * static_cast<int64_t>(keys.size()) + 2,
              "forward: weights do not match the layers");
  TORCH_CHECK(n_layers <= static_cast<int64_t>(keys.size()) && mask.size(1) == t && mask.size(2) <= keys[0].size(2),
              "forward: shapes");
  TORCH_CHECK(tokens.is_contiguous() && positions.is_contiguous() && slots.is_contiguous() && mask.is_contiguous() &&
              cos.is_contiguous() && signed_sin.is_contiguous() && d % 2 == 0, "forward: layouts");
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
  const auto* cs = cos.data_ptr<T>();
  const auto* sn = signed_sin.data_ptr<T>();
  const auto add_into_residual = [&](const T* y) {
    for (int64_t i = 0; i < m * e; i += 16) {
      const __mmask16 keep = lanes(m * e - i);
      Elem<T>::store(h + i, keep, _mm512_add_ps(Elem<T>::load(h + i, keep), Elem<T>::load(y + i, keep)));
    }
  };
  for (int64_t layer = 0; layer < n_layers; ++layer) {
    const at::Tensor* w = &weights[1 + kPerLayer * layer];
    rms_norm_rows(h, m, e, w[0].data_ptr<T>(), static_cast<float>(eps), xn);
    check_packed_for(h, w[1], e, qkv_dim);
    linear_rows(xn, m, w[1], w[2].numel() ? w[2].data_ptr<float>() : nullptr, qkv_dim, qkvs);
    // RoPE on the query and key heads (rotate-half layout, sign folded into signed_sin), then the
    // keys and values into their cache slots.
    T* kc = keys[layer].data_ptr<T>();
    T* vc = values[layer].data_ptr<T>();
    const int64_t k0 = keys[layer].stride(0), k1 = keys[layer].stride(1), capacity = keys[layer].size(2);
    const int64_t v0 = values[layer].stride(0), v1 = values[layer].stride(1);
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
        std::copy(row + q_dim + kv_dim + kv * d, row + q_dim + kv_dim + (kv + 1) * d, vc + b * v0 + kv * v1 + slot[r] * d);
      }
    }
    const AttentionLayout layout{batch, t, n_head, n_kv, d, mask.size(2), qkv_dim, q_dim, k0, k1, v0, v1, mask.size(0)};
    attend_rows(layout, qkvs, kc, vc, mask.data_ptr<bool>(), att);
    check_packed_for(h, w[3], q_dim, e);
    linear_rows(att, m, w[3], nullptr, e, proj);
    add_into_residual(proj);
    rms_norm_rows(h, m, e, w[4].data_ptr<T>(), static_cast<float>(eps), xn);
    check_packed_for(h, w[5], e, 2 * intermediate);
    linear_rows(xn, m, w[5], nullptr, 2 * intermediate, gu);
    for (int64_t r = 0; r < m; ++r) {  // silu(gate) * up, each rounded to bf16 as the eager model does
      const T* g = gu + r * 2 * intermediate;
      for (int64_t i = 0; i < intermediate; i += 16) {
        const __mmask16 keep = lanes(intermediate - i);
        const __m512 gv = Elem<T>::load(g + i, keep);
        const __m512 silu = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), exp_clamped(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
        const __m512 rounded = Elem<T>::round(silu);
        Elem<T>::store(hid + r * intermediate + i, keep, _mm512_mul_ps(rounded, Elem<T>::load(g + intermediate + i, keep)));
      }
    }
    check_packed_for(h, w[6], intermediate, e);
    linear_rows(hid, m, w[6], nullptr, e, proj);
    add_into_residual(proj);
  }
  const at::Tensor* tail = &weights[1 + kPerLayer * keys.size()];
  rms_norm_rows(h, m, e, tail[0].data_ptr<T>(), static_cast<float>(eps), xn);
  check_packed_for(h, tail[1], e, vocab);
  at::Tensor logits = at::empty({batch, t, vocab}, opts);
  linear_rows(xn, m, tail[1], nullptr, vocab, logits.data_ptr<T>());
  return logits;
}

at::Tensor forward(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& slots,
                   const at::Tensor& mask, const at::Tensor& cos, const at::Tensor& signed_sin, at::TensorList keys,
                   at::TensorList values, at::TensorList weights, int64_t n_layers, int64_t n_head, int64_t n_kv,
                   int64_t head_dim, int64_t intermediate, int64_t vocab, double eps) {
  const auto dtype = weights[0].scalar_type();
  TORCH_CHECK((dtype == at::kBFloat16 || dtype == at::kFloat) && cos.scalar_type() == dtype,
              "forward: bf16 or fp32 weights and RoPE tables of the same dtype");
  return dtype == at::kBFloat16
             ? forward_native<at::BFloat16>(tokens, positions, slots, mask, cos, signed_sin, keys, values, weights,
                                            n_layers, n_head, n_kv, head_dim, intermediate, vocab, eps)
             : forward_native<float>(tokens, positions, slots, mask, cos, signed_sin, keys, values, weights, n_layers,
                                     n_head, n_kv, head_dim, intermediate, vocab, eps);
}

}  // namespace

TORCH_LIBRARY(quickdraft, m) {
  m.def("linear_bf16(Tensor x, Tensor packed, Tensor? bias, int n_out) -> Tensor");
  m.def("attend_bf16(Tensor q, Tensor keys, Tensor values, Tensor mask) -> Tensor");
  m.def("rms_norm_bf16(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("forward(Tensor tokens, Tensor positions, Tensor slots, Tensor mask, Tensor cos, Tensor signed_sin, "
        "Tensor(a!)[] keys, Tensor(b!)[] values, Tensor[] weights, int n_layers, int n_head, int n_kv, int head_dim, "
        "int intermediate, int vocab, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(quickdraft, CPU, m) {
  m.impl("linear_bf16", &linear_bf16);
  m.impl("attend_bf16", &attend_bf16);
  m.impl("rms_norm_bf16", &rms_norm_bf16);
  m.impl("forward", &forward);
}
