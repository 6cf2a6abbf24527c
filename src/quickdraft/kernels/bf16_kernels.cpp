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

at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                       int64_t n_out) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16, "linear_bf16: bf16 only");
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kBlockColumns && packed.size(3) == 2 && packed.is_contiguous(),
              "linear_bf16: weight not packed by quickdraft.kernels.pack_bf16");
  const int64_t k = x.size(-1), pairs = packed.size(1), blocks = packed.size(0);
  TORCH_CHECK(k == 2 * pairs && n_out <= blocks * kBlockColumns && n_out > (blocks - 1) * kBlockColumns,
              "linear_bf16: shapes do not match the packed weight");
  at::Tensor rows = x.reshape({-1, k}).contiguous();
  const int64_t m = rows.size(0);
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = n_out;
  at::Tensor y = at::empty({m, n_out}, x.options());
  at::Tensor bias_f32;
  if (bias.has_value()) bias_f32 = bias->to(at::kFloat).contiguous();
  const float* b = bias.has_value() ? bias_f32.data_ptr<float>() : nullptr;
  const auto* xs = reinterpret_cast<const uint32_t*>(rows.data_ptr<at::BFloat16>());
  const auto* ws = reinterpret_cast<const __m512i*>(packed.data_ptr<at::BFloat16>());
  at::BFloat16* ys = y.data_ptr<at::BFloat16>();
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t first = block * kBlockColumns;
      const int64_t columns = std::min(kBlockColumns, n_out - first);
      const __m512i* w = ws + block * pairs * 4;
      for (int64_t r = 0; r < m; r += kTileRows) {
        const int64_t n = std::min(kTileRows, m - r);
        kTiles[n](xs + r * pairs, pairs, w, pairs, b ? b + first : nullptr, ys + r * n_out + first, n_out, columns);
      }
    }
  });
  return y.view(out_shape);
}


// ---- attention ------------------------------------------------------------------------------
// quickdraft::attend_bf16: each query row attends over the cache slots its mask marks. A row's
// result is a function of the ordered list of its visible (key, value) pairs only: scores are
// separate dot products, the softmax denominator is a sequential sum and the weighted values are
// accumulated slot after slot. So it does not depend on the window, on where the visible slots sit
// (a token tree's scattered ancestors get the bits of the same tokens fed as a chain) or on other
// rows. Masked slots cost a byte read.

// e^x for x <= 0 (scores minus their maximum): Cody-Waite range reduction and a degree-6
// polynomial, ~1 ulp in fp32.
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
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

inline __m512 load_bf16(const at::BFloat16* p, __mmask16 keep) {
  return _mm512_cvtpbh_ps((__m256bh)_mm256_maskz_loadu_epi16(keep, p));
}

constexpr int kMaxHeadChunks = 16;  // head_dim <= 256

at::Tensor attend_bf16(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, const at::Tensor& mask) {
  // q [B, Hq, T, D]; keys, values [B, Hkv, C, D] (the last two dims contiguous: a cache window);
  // mask [B or 1, T, C] bool -> [B, Hq, T, D]
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && keys.scalar_type() == at::kBFloat16 &&
              values.scalar_type() == at::kBFloat16 && mask.scalar_type() == at::kBool, "attend_bf16: dtypes");
  TORCH_CHECK(q.dim() == 4 && keys.dim() == 4 && values.dim() == 4 && mask.dim() == 3, "attend_bf16: ranks");
  const int64_t batch = q.size(0), n_head = q.size(1), t = q.size(2), d = q.size(3);
  const int64_t n_kv = keys.size(1), c = keys.size(2);
  TORCH_CHECK(keys.sizes() == values.sizes() && keys.size(0) == batch && keys.size(3) == d && n_head % n_kv == 0,
              "attend_bf16: shapes");
  TORCH_CHECK(keys.stride(3) == 1 && keys.stride(2) == d && values.stride(3) == 1 && values.stride(2) == d,
              "attend_bf16: keys and values need contiguous [C, D] per head");
  TORCH_CHECK((mask.size(0) == batch || mask.size(0) == 1) && mask.size(1) == t && mask.size(2) == c,
              "attend_bf16: mask shape");
  TORCH_CHECK(d <= 16 * kMaxHeadChunks, "attend_bf16: head_dim over 256");
  const at::Tensor qc = q.contiguous();
  const at::Tensor m = mask.contiguous();
  at::Tensor y = at::empty({batch, n_head, t, d}, q.options());
  const int64_t group = n_head / n_kv, chunks = (d + 15) / 16;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const auto* qs = qc.data_ptr<at::BFloat16>();
  const auto* ks = keys.data_ptr<at::BFloat16>();
  const auto* vs = values.data_ptr<at::BFloat16>();
  const bool* ms = m.data_ptr<bool>();
  auto* ys = y.data_ptr<at::BFloat16>();
  at::parallel_for(0, batch * n_head * t, 1, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> visible(c);
    std::vector<float> score(c + 16);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / (n_head * t), h = (row / t) % n_head, i = row % t;
      const bool* mrow = ms + ((m.size(0) == 1 ? 0 : b) * t + i) * c;
      int64_t n = 0;
      for (int64_t s = 0; s < c; ++s)
        if (mrow[s]) visible[n++] = static_cast<int32_t>(s);
      at::BFloat16* out = ys + row * d;
      if (n == 0) {
        std::fill(out, out + d, at::BFloat16(0.0f));
        continue;
      }
      __mmask16 keep[kMaxHeadChunks];
      __m512 qv[kMaxHeadChunks];
      const at::BFloat16* qrow = qs + row * d;
      for (int64_t j = 0; j < chunks; ++j) {
        keep[j] = d - 16 * j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (d - 16 * j)) - 1);
        qv[j] = _mm512_mul_ps(load_bf16(qrow + 16 * j, keep[j]), _mm512_set1_ps(scale));
      }
      const at::BFloat16* kh = ks + b * keys.stride(0) + (h / group) * keys.stride(1);
      const at::BFloat16* vh = vs + b * values.stride(0) + (h / group) * values.stride(1);
      float top = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        const at::BFloat16* k = kh + static_cast<int64_t>(visible[j]) * d;
        __m512 acc = _mm512_mul_ps(qv[0], load_bf16(k, keep[0]));
        for (int64_t e = 1; e < chunks; ++e) acc = _mm512_fmadd_ps(qv[e], load_bf16(k + 16 * e, keep[e]), acc);
        score[j] = _mm512_reduce_add_ps(acc);
        top = std::max(top, score[j]);
      }
      const __m512 top_v = _mm512_set1_ps(top);
      for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 part = n - j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - j)) - 1);
        _mm512_mask_storeu_ps(score.data() + j, part,
                              exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(part, score.data() + j), top_v)));
      }
      float total = 0.0f;
      for (int64_t j = 0; j < n; ++j) total += score[j];
      __m512 acc[kMaxHeadChunks];
      for (int64_t e = 0; e < chunks; ++e) acc[e] = _mm512_setzero_ps();
      for (int64_t j = 0; j < n; ++j) {
        const at::BFloat16* v = vh + static_cast<int64_t>(visible[j]) * d;
        const __m512 w = _mm512_set1_ps(score[j]);
        for (int64_t e = 0; e < chunks; ++e) acc[e] = _mm512_fmadd_ps(w, load_bf16(v + 16 * e, keep[e]), acc[e]);
      }
      const __m512 inverse = _mm512_set1_ps(1.0f / total);
      for (int64_t e = 0; e < chunks; ++e)
        _mm256_mask_storeu_epi16(out + 16 * e, keep[e], (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(acc[e], inverse)));
    }
  });
  return y;
}

// ---- RMSNorm --------------------------------------------------------------------------------
// quickdraft::rms_norm_bf16: weight * bf16(x / rms(x)), the sum of squares in fp32 in one fixed
// order per row (torch.compile's fused norms vectorise the reduction differently per row count).
at::Tensor rms_norm_bf16(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16, "rms_norm_bf16: bf16 only");
  const int64_t h = x.size(-1);
  TORCH_CHECK(weight.numel() == h, "rms_norm_bf16: weight size");
  const at::Tensor rows = x.reshape({-1, h}).contiguous();
  const at::Tensor w = weight.contiguous();
  at::Tensor y = at::empty_like(rows);
  const auto* xs = rows.data_ptr<at::BFloat16>();
  const auto* ws = w.data_ptr<at::BFloat16>();
  auto* ys = y.data_ptr<at::BFloat16>();
  const int64_t chunks = (h + 15) / 16;
  at::parallel_for(0, rows.size(0), 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const at::BFloat16* xr = xs + r * h;
      __m512 squares = _mm512_setzero_ps();
      for (int64_t j = 0; j < chunks; ++j) {
        const __mmask16 keep = h - 16 * j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (h - 16 * j)) - 1);
        const __m512 v = load_bf16(xr + 16 * j, keep);
        squares = _mm512_fmadd_ps(v, v, squares);
      }
      const float inverse = 1.0f / std::sqrt(_mm512_reduce_add_ps(squares) / static_cast<float>(h) + static_cast<float>(eps));
      const __m512 scale = _mm512_set1_ps(inverse);
      for (int64_t j = 0; j < chunks; ++j) {
        const __mmask16 keep = h - 16 * j >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (h - 16 * j)) - 1);
        const __m256bh normed = _mm512_cvtneps_pbh(_mm512_mul_ps(load_bf16(xr + 16 * j, keep), scale));
        const __m512 out = _mm512_mul_ps(_mm512_cvtpbh_ps(normed), load_bf16(ws + 16 * j, keep));
        _mm256_mask_storeu_epi16(ys + r * h + 16 * j, keep, (__m256i)_mm512_cvtneps_pbh(out));
      }
    }
  });
  return y.view(x.sizes());
}

}  // namespace

TORCH_LIBRARY(quickdraft, m) {
  m.def("linear_bf16(Tensor x, Tensor packed, Tensor? bias, int n_out) -> Tensor");
  m.def("attend_bf16(Tensor q, Tensor keys, Tensor values, Tensor mask) -> Tensor");
  m.def("rms_norm_bf16(Tensor x, Tensor weight, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(quickdraft, CPU, m) {
  m.impl("linear_bf16", &linear_bf16);
  m.impl("attend_bf16", &attend_bf16);
  m.impl("rms_norm_bf16", &rms_norm_bf16);
}
