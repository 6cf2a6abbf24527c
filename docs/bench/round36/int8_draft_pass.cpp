// Build and run (not part of the package; AVX-512 VNNI and BF16):
//   g++ -O3 -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -mavx512vnni -o /tmp/int8_draft_pass \
//       docs/bench/round36/int8_draft_pass.cpp && /tmp/int8_draft_pass 1 && /tmp/int8_draft_pass 4
// Prototype: a 1-row pass over a self-draft's weight products (2 layers of the embedded target's shape
// + a 2,048-token head), bf16 dot products (vdpbf16ps, as quickdraft's kernel) against int8 weights
// with u8 activations (vpdpbusd), the same loop shape: 4 independent 16-column accumulators per
// 64-column block, one broadcast per input group.
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>
#include <algorithm>

struct Mat { int n, k; };
static const Mat kMats[] = {{640, 384}, {384, 384}, {2048, 384}, {384, 1024},
                            {640, 384}, {384, 384}, {2048, 384}, {384, 1024}, {2048, 384}};

void bf16_pass(const std::vector<std::vector<uint16_t>>& w, const uint32_t* x, float* y) {
  for (size_t m = 0; m < w.size(); ++m) {
    const int n = kMats[m].n, k = kMats[m].k, pairs = k / 2, blocks = n / 64;
    const __m512i* ws = reinterpret_cast<const __m512i*>(w[m].data());
    for (int b = 0; b < blocks; ++b) {
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      const __m512i* line = ws + (size_t)b * pairs * 4;
      for (int p = 0; p < pairs; ++p, line += 4) {
        const __m512bh xp = (__m512bh)_mm512_set1_epi32((int)x[p]);
        a0 = _mm512_dpbf16_ps(a0, xp, (__m512bh)_mm512_loadu_si512(line));
        a1 = _mm512_dpbf16_ps(a1, xp, (__m512bh)_mm512_loadu_si512(line + 1));
        a2 = _mm512_dpbf16_ps(a2, xp, (__m512bh)_mm512_loadu_si512(line + 2));
        a3 = _mm512_dpbf16_ps(a3, xp, (__m512bh)_mm512_loadu_si512(line + 3));
      }
      _mm512_storeu_ps(y + b * 64, a0); _mm512_storeu_ps(y + b * 64 + 16, a1);
      _mm512_storeu_ps(y + b * 64 + 32, a2); _mm512_storeu_ps(y + b * 64 + 48, a3);
    }
  }
}

void i8_pass(const std::vector<std::vector<int8_t>>& w, const uint32_t* x, float* y, const float* scale) {
  for (size_t m = 0; m < w.size(); ++m) {
    const int n = kMats[m].n, k = kMats[m].k, quads = k / 4, blocks = n / 64;
    const __m512i* ws = reinterpret_cast<const __m512i*>(w[m].data());
    for (int b = 0; b < blocks; ++b) {
      __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
      const __m512i* line = ws + (size_t)b * quads * 4;
      for (int q = 0; q < quads; ++q, line += 4) {
        const __m512i xq = _mm512_set1_epi32((int)x[q]);
        a0 = _mm512_dpbusd_epi32(a0, xq, _mm512_loadu_si512(line));
        a1 = _mm512_dpbusd_epi32(a1, xq, _mm512_loadu_si512(line + 1));
        a2 = _mm512_dpbusd_epi32(a2, xq, _mm512_loadu_si512(line + 2));
        a3 = _mm512_dpbusd_epi32(a3, xq, _mm512_loadu_si512(line + 3));
      }
      const __m512 s = _mm512_loadu_ps(scale + b * 16 % 1024);
      _mm512_storeu_ps(y + b * 64, _mm512_mul_ps(_mm512_cvtepi32_ps(a0), s));
      _mm512_storeu_ps(y + b * 64 + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(a1), s));
      _mm512_storeu_ps(y + b * 64 + 32, _mm512_mul_ps(_mm512_cvtepi32_ps(a2), s));
      _mm512_storeu_ps(y + b * 64 + 48, _mm512_mul_ps(_mm512_cvtepi32_ps(a3), s));
    }
  }
}

int main(int argc, char** argv) {
  const int copies = argc > 1 ? atoi(argv[1]) : 1;  // independent self-drafts cycled: more bytes than the caches
  std::vector<std::vector<std::vector<uint16_t>>> wb(copies);
  std::vector<std::vector<std::vector<int8_t>>> wi(copies);
  size_t params = 0;
  for (int c = 0; c < copies; ++c)
    for (const Mat& m : kMats) {
      wb[c].emplace_back((size_t)m.n * m.k, 0x3f80);
      wi[c].emplace_back((size_t)m.n * m.k, 1);
      if (c == 0) params += (size_t)m.n * m.k;
    }
  std::vector<uint32_t> x(1024, 0x3f803f80u);
  std::vector<float> y(2048 * 2), scale(1024, 1.0f);
  for (int variant = 0; variant < 2; ++variant) {
    std::vector<double> times;
    for (int r = 0; r < 400; ++r) {
      const int c = r % copies;
      auto t0 = std::chrono::steady_clock::now();
      if (variant == 0) bf16_pass(wb[c], x.data(), y.data()); else i8_pass(wi[c], x.data(), y.data(), scale.data());
      times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    const double us = times[times.size() / 2];
    const double bytes = params * (variant == 0 ? 2.0 : 1.0);
    printf("%s: %.1f us a pass over %.1f MB (%d copies cycled), %.1f GB/s\n", variant == 0 ? "bf16" : "int8", us,
           bytes / 1e6, copies, bytes / us / 1e3);
  }
}
