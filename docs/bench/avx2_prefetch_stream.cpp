// How the AVX2 products fetch the next block's weights, measured apart from the model (round 18).
//
//     g++ -O3 -mavx2 -mfma -std=c++17 docs/bench/avx2_prefetch_stream.cpp -o /tmp/stream && /tmp/stream
//
// The embedded target's 25 weight products (bf16 pairs, the kernels' packed layout, 25 MB: more
// than the caches hold) at 1-8 rows, with the AVX2 kernel's tiles (1 row x 64 columns, 2 rows x 32),
// under three fetch policies, interleaved round by round in one process; medians of 40 rounds, ms.
// - policy 0 (before round 18): a block's first tile fetches the whole next block, a lone row nothing;
// - policy 2: every tile fetches its share of the next block, one line every few inputs;
// - policy 4 (commit b3406db): policy 2, and a lone row fetches too.
// The kernels since commit 5d98f65 fetch policy 4's lines without a branch (four prefetches per
// input at fixed-point positions); that, not the policy, is what let GCC keep the kernel's
// accumulators in registers (measured with docs/bench/native_step_rows.py, not here).
// Numbers are fake weights and inputs: only time is measured.
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <vector>
#include <cmath>
#include <algorithm>
constexpr int64_t kBlockColumns = 64, kLineBytes = 256, kHalfColumns = 32;
static int MODE = 0;  // the fetch policy
inline void fetch_line(const char* ahead, int64_t line) {
  const char* at = ahead + line * kLineBytes;
  for (int64_t i = 0; i < kLineBytes; i += 64) _mm_prefetch(at + i, _MM_HINT_T1);
}
template <int Rows, int Vecs>
void tile(const float* x, int64_t x_stride, const uint32_t* words, int64_t pairs, float* y, int64_t y_stride,
          const char* ahead, int64_t ahead_lines) {
  __m256 acc[Rows][Vecs];
  for (int r = 0; r < Rows; ++r) for (int c = 0; c < Vecs; ++c) acc[r][c] = _mm256_setzero_ps();
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  // prefetch one line every `every` pairs
  const int64_t every = ahead_lines ? std::max<int64_t>(1, pairs / ahead_lines) : 0;
  int64_t fetched = 0;
  for (int64_t p = 0; p < pairs; ++p) {
    if (ahead) {
      if (MODE == 0) fetch_line(ahead, p);
      else if (fetched < ahead_lines && p % every == 0) fetch_line(ahead, fetched++);
    }
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
      for (int r = 0; r < Rows; ++r) acc[r][c] = _mm256_fmadd_ps(odd_x[r], odd, _mm256_fmadd_ps(even_x[r], even, acc[r][c]));
    }
  }
  if (MODE != 0 && ahead) while (fetched < ahead_lines) fetch_line(ahead, fetched++);
  for (int r = 0; r < Rows; ++r) for (int c = 0; c < Vecs; ++c) _mm256_storeu_ps(y + r * y_stride + 8 * c, acc[r][c]);
}
using Tile = void (*)(const float*, int64_t, const uint32_t*, int64_t, float*, int64_t, const char*, int64_t);
constexpr Tile kTiles[3] = {nullptr, tile<1, 8>, tile<2, 4>};

void linear(const float* x, int64_t m, int64_t k, const uint32_t* weights, int64_t n_out, float* y) {
  const int64_t lines = k / 2, blocks = (n_out + 63) / 64;
  for (int64_t block = 0; block < blocks; ++block) {
    const uint32_t* w = weights + block * lines * kBlockColumns;
    const int64_t first = block * kBlockColumns;
    const char* next = (m > 1 || MODE == 4) && block + 1 < blocks && MODE != 1 ? reinterpret_cast<const char*>(w + lines * kBlockColumns) : nullptr;
    const int64_t tiles_in_block = m == 1 ? 1 : (m / 2) * 2 + (m % 2);
    int64_t t = 0;
    auto ahead = [&](int64_t& count) -> const char* {
      if (!next) { count = 0; return nullptr; }
      if (MODE == 0) { count = t++ == 0 ? lines : 0; return count ? next : nullptr; }
      const int64_t share = (lines + tiles_in_block - 1) / tiles_in_block, from = std::min(lines, t++ * share);
      count = std::min(share, lines - from);
      return count > 0 ? next + from * kLineBytes : nullptr;
    };
    if (MODE == 3) {
      for (int64_t half = 0; half < 64; half += 32)
        for (int64_t r = 0; r + 1 < m; r += 2) { int64_t c; const char* a = ahead(c); kTiles[2](x + r * k, k, w + half, lines, y + r * n_out + first + half, n_out, a, c); }
      if (m % 2) { int64_t c; const char* a = ahead(c); kTiles[1](x + (m - 1) * k, k, w, lines, y + (m - 1) * n_out + first, n_out, a, c); }
      continue;
    }
    for (int64_t r = 0; r < m; r += 2) {
      const int64_t n = std::min<int64_t>(2, m - r);
      if (n == 1) { int64_t c; const char* a = ahead(c); kTiles[1](x + r * k, k, w, lines, y + r * n_out + first, n_out, a, c); continue; }
      for (int64_t half = 0; half < 64; half += 32) { int64_t c; const char* a = ahead(c); kTiles[2](x + r * k, k, w + half, lines, y + r * n_out + first + half, n_out, a, c); }
    }
  }
}
int main(int argc, char** argv) {
  struct Shape { int64_t n, k; };
  std::vector<Shape> shapes;
  for (int l = 0; l < 6; ++l) for (Shape s : {Shape{384,384},Shape{128,384},Shape{128,384},Shape{384,384},Shape{1024,384},Shape{1024,384},Shape{384,1024}}) shapes.push_back(s);
  shapes.push_back({8192, 384});
  std::vector<std::vector<uint32_t>> ws; int64_t macs = 0;
  for (auto s : shapes) { ws.emplace_back(s.n * s.k / 2); for (auto& v : ws.back()) v = 0x3f803f80u ^ (rand() & 0x00ff00ffu); macs += s.n * s.k; }
  std::vector<float> x(16 * 1024, 0.01f), y(16 * 8192);
  const int modes[] = {0, 2, 4}; const int ms[] = {1, 2, 3, 4, 5, 8};
  std::vector<double> ts[3][6];
  for (int rep = 0; rep < 40; ++rep)
    for (int mi = 0; mi < 3; ++mi) for (int j = 0; j < 6; ++j) {
      MODE = modes[mi]; int m = ms[j];
      auto t = std::chrono::steady_clock::now();
      for (size_t i = 0; i < shapes.size(); ++i) linear(x.data(), m, shapes[i].k, ws[i].data(), shapes[i].n, y.data());
      ts[mi][j].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
    }
  for (int mi = 0; mi < 3; ++mi) {
    printf("mode %d:", modes[mi]); double base = 0;
    for (int j = 0; j < 6; ++j) { auto v = ts[mi][j]; std::sort(v.begin(), v.end()); double med = v[v.size()/2]; if (j == 0) base = med; printf(" %d:%.2f(%.2f)", ms[j], med, med / base); }
    printf("\n");
  }
}
