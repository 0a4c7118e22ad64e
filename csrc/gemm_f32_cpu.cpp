// SPDX-License-Identifier: Apache-2.0
// fp32 skinny GEMM on CPU (AVX2 + FMA) for decode- and verify-sized M (1..~64 rows):
//   y[M, N] = x[M, K] @ W[N, K]^T (+ bias[N])      fp32 in, fp32 out
//
// Why: on CPUs without avx512_bf16 vLLM serves float32, and gives every linear layer to oneDNN. On a 2-core AVX2
// EPYC oneDNN reads a decode step's weights at ~19.6 GB/s with 1 row, but needs 31 / 44 / 63 ms at 4 / 8 / 16 rows
// against 27 ms at 1 (dev/GEMM_F32_NOTES.md): verifying a speculative block costs far more than the weights' read.
// With 16 FMAs per 64 bytes of weight per row, 8 rows still fit under the memory time here.
//
// Layout: the weight is packed once (vllm_dflash/ops/gemm_f32.py: pack_f32_weight) into blocks of BN = 16 output
// rows with K contiguous inside a block:
//   packed[nb, k, j] = W[nb*16 + j, k]        shape [ceil(N/16), K, 16], zero rows past N
// so step k of a block is one 64-byte cache line (two ymm: outputs 0..7 and 8..15), and a thread's blocks are one
// sequential stream. For each k the kernel broadcasts x[m, k] of every row m of a tile and issues two FMAs per row.
// Register tile: MR <= 6 rows x 16 outputs = 12 ymm accumulators + 2 weight + 1 broadcast <= 16 ymm (the classic
// 6x16 AVX2 SGEMM tile); with more rows every tile runs on one k-chunk of the block (in L1) before the next chunk.
//
// Batch invariance: every output is one FMA chain over k = 0..K-1 starting from 0.0f, then + bias, whatever M, the
// tile or the thread is. Row m of y is bitwise the same for x and for x[m:m+1]: a verify step of 8 rows gives each
// row exactly the bits a 1-row decode step would. (It differs from oneDNN's summation order in the last bits.)
//
// Built with the portable flags (-mavx2 -mfma); the code sits in target-attributed functions and runs only when
// the CPU reports avx2 and fma (gemm_f32_supported()). The PyTorch definition it is tested against:
// vllm_dflash/ops/gemm_f32.py (gemm_f32_reference).
// Per-operator ATen headers and torch/library.h, not torch/extension.h (the whole C++ API and pybind11): the build
// is several times faster (scripts/setup.sh, CI). The Python module vllm_dflash._C is csrc/cpu_module.cpp.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "cpu_linear_route.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t BN = 16;  // output rows per packed block: two ymm of fp32 accumulators per row of x
constexpr int MAX_MR = 6;   // rows per register tile: 2*MR accumulators + 2 weight + 1 broadcast <= 16 ymm

#define F32_TARGET __attribute__((target("avx2,fma")))

struct Args {
  const float* x;     // [M, ldx]
  int64_t ldx;
  const float* w;     // packed [nblocks, K, 16]
  int64_t k;
  const float* bias;  // [N] or null
  float* y;           // [M, ldy]
  int64_t ldy;
  int64_t n;          // valid output columns
};

// One packed block (16 outputs) x MR rows starting at row m0, for k in [k0, k1): one FMA chain per output, k
// ascending. The chain starts from 0 (k0 == 0) or from the partial sums a previous k-chunk left in `part`
// ([MR, 16] fp32: storing and reloading fp32 changes no bits); the last chunk (k1 == K) adds the bias and writes y.
// pd > 0: every `pf_every`-th k step, from step `pf_phase` on, also prefetches the weight line pd steps ahead (the
// thread's blocks are one stream, so that runs into its next block; a prefetch past the end of the weight does not
// fault). See `prefetch_single` and `run_blocks`.
template <int MR>
F32_TARGET void block_tile(const Args& a, int64_t blk, int64_t m0, int64_t k0, int64_t k1, float* part,
                           int64_t pd, int64_t pf_every, int64_t pf_phase) {
  __m256 acc[MR][2];
  if (k0 == 0) {
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  } else {
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      acc[m][0] = _mm256_loadu_ps(part + m * BN);
      acc[m][1] = _mm256_loadu_ps(part + m * BN + 8);
    }
  }
  const float* xr[MR];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) xr[m] = a.x + (m0 + m) * a.ldx;
  const float* wb = a.w + blk * a.k * BN;
  int64_t until_pf = pf_phase + 1;  // k steps until the next prefetch (a countdown: no division in the loop)
#pragma GCC unroll 4
  for (int64_t p = k0; p < k1; ++p) {
    if (pd > 0 && --until_pf == 0) {
      until_pf = pf_every;
      _mm_prefetch(reinterpret_cast<const char*>(wb + (p + pd) * BN), _MM_HINT_T0);
    }
    const __m256 w0 = _mm256_loadu_ps(wb + p * BN);
    const __m256 w1 = _mm256_loadu_ps(wb + p * BN + 8);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m256 xb = _mm256_broadcast_ss(xr[m] + p);
      acc[m][0] = _mm256_fmadd_ps(xb, w0, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(xb, w1, acc[m][1]);
    }
  }
  if (k1 < a.k) {
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      _mm256_storeu_ps(part + m * BN, acc[m][0]);
      _mm256_storeu_ps(part + m * BN + 8, acc[m][1]);
    }
    return;
  }

  const int64_t col0 = blk * BN;
  const int64_t left = std::min<int64_t>(BN, a.n - col0);
  alignas(32) float b[BN] = {0};
  if (a.bias != nullptr)
    for (int64_t j = 0; j < left; ++j) b[j] = a.bias[col0 + j];
  const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) {
    const __m256 v0 = _mm256_add_ps(acc[m][0], b0), v1 = _mm256_add_ps(acc[m][1], b1);
    float* out = a.y + (m0 + m) * a.ldy + col0;
    if (left == BN) {
      _mm256_storeu_ps(out, v0);
      _mm256_storeu_ps(out + 8, v1);
    } else {  // N tail: the packed rows past N are zero; write only the valid columns
      alignas(32) float tmp[BN];
      _mm256_store_ps(tmp, v0);
      _mm256_store_ps(tmp + 8, v1);
      for (int64_t j = 0; j < left; ++j) out[j] = tmp[j];
    }
  }
}

using TileFn = void (*)(const Args&, int64_t, int64_t, int64_t, int64_t, float*, int64_t, int64_t, int64_t);
constexpr TileFn kTiles[MAX_MR + 1] = {nullptr,         &block_tile<1>, &block_tile<2>, &block_tile<3>,
                                       &block_tile<4>,  &block_tile<5>, &block_tile<6>};

// Rows per tile for the `rem` rows left: <= MAX_MR, split evenly (7 rows -> 4 + 3, 8 -> 4 + 4) so no tile is tiny.
inline int64_t rows_for(int64_t rem) {
  if (rem <= MAX_MR) return rem;
  const int64_t tiles = (rem + MAX_MR - 1) / MAX_MR;
  return (rem + tiles - 1) / tiles;
}

// More rows than one tile: the block is walked in k-chunks of KC (KC x 64 bytes of weight stay in L1) and every
// tile runs on a chunk before the next chunk is read, so the weight streams from memory once, at the pace of one
// pass, instead of once per tile. Partial sums wait in `part` ([M, 16] per thread).
// Above KC_MAX_ROWS rows the block (<= 96 KB) is reused from L2 by many tiles and the chunk bookkeeping costs more
// than it saves (measured: 0.86x at 256 rows, 1.20x at 64; dev/GEMM_F32_NOTES.md).
constexpr int64_t KC = 128;
constexpr int64_t KC_MAX_ROWS = 64;

// Software prefetch, so the weight's memory stream keeps going while the FMAs run. Without it the two serialise
// from a few rows on: the hardware prefetcher runs only a little ahead of the loads, so once a step's FMAs take as
// long as its line takes to arrive, memory idles during them (and during the L1 tiles of a k-chunk). Measured on the
// 2-core AVX2 EPYC, interleaved with the kernel without prefetch (121 GEMMs of a SmolLM2-135M step): 1.03-1.12x at
// 3-6 rows, 1.07-1.15x at 8-12, 1.03-1.09x at 16-32; at 1 row, where the loop is a pure stream the hardware
// prefetcher already keeps full, it cost 0.85x, so 1-2 rows issue none (dev/GEMM_F32_NOTES.md).
//   whole-K tiles: the first tile of a block fetches the line PD_SINGLE k steps ahead, from 3 rows on;
//   k-chunks: the chunk's T tiles fetch the next chunk (KC steps ahead) into L1 together, tile t at its k steps
//   t, t + T, t + 2T, ..., so the stream is fed at an even pace while all of them run. When the first tile fetched
//   the whole next chunk, the other tiles ran with no line on its way. Spreading the fetches took the 121 GEMMs of
//   a step from 37-40 to 34-36 ms at 8 rows, 58-60 to 54-56 at 24 and 72-78 to 59-63 at 32 (2-core AVX2 EPYC, four
//   interleaved rounds; dev/GEMM_F32_NOTES.md, session 37).
constexpr int64_t PD_SINGLE = 32;
constexpr int64_t PD_MIN_ROWS = 3;

inline int64_t prefetch_single(int64_t M) { return M >= PD_MIN_ROWS ? PD_SINGLE : 0; }

void run_blocks(const Args& a, int64_t M, int64_t b0, int64_t b1) {
  if (M <= MAX_MR || M > KC_MAX_ROWS) {  // one tile, or so many rows that the block is reused from L2 anyway
    for (int64_t blk = b0; blk < b1; ++blk) {
      for (int64_t m0 = 0; m0 < M;) {
        const int64_t mr = rows_for(M - m0);
        kTiles[mr](a, blk, m0, 0, a.k, nullptr, m0 == 0 ? prefetch_single(M) : 0, 1, 0);
        m0 += mr;
      }
    }
    return;
  }
  std::vector<float> part(static_cast<size_t>(M * BN));
  int64_t tiles = 0;  // tiles per chunk: the next chunk's KC lines are fetched by all of them, one in `tiles` steps
  for (int64_t m0 = 0; m0 < M; m0 += rows_for(M - m0)) ++tiles;
  for (int64_t blk = b0; blk < b1; ++blk) {
    for (int64_t k0 = 0; k0 < a.k; k0 += KC) {
      const int64_t k1 = std::min(a.k, k0 + KC);
      int64_t t = 0;
      for (int64_t m0 = 0; m0 < M; ++t) {
        const int64_t mr = rows_for(M - m0);
        kTiles[mr](a, blk, m0, k0, k1, part.data() + m0 * BN, KC, tiles, t);
        m0 += mr;
      }
    }
  }
}

bool gemm_f32_supported() {
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return ok;
}

// x [M, K] fp32 contiguous; w_packed [ceil(N/16), K*16] fp32 contiguous; bias [N] fp32 or None.
at::Tensor gemm_f32(const at::Tensor& x, const at::Tensor& w_packed, int64_t n, const c10::optional<at::Tensor>& bias) {
  // The Python wrapper (vllm_dflash/ops/gemm_f32.py) raises ValueErrors first; these are the last line of defence.
  TORCH_CHECK(gemm_f32_supported(), "gemm_f32: this CPU lacks avx2/fma (check gemm_f32_supported())");
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
              "x: expected a contiguous fp32 CPU [M, K] tensor");
  TORCH_CHECK(w_packed.device().is_cpu() && w_packed.scalar_type() == at::kFloat && w_packed.is_contiguous(),
              "w_packed: expected a contiguous fp32 CPU tensor");
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t nblocks = (n + BN - 1) / BN;
  TORCH_CHECK(n > 0 && K > 0 && w_packed.numel() == nblocks * K * BN, "w_packed: expected ", nblocks * K * BN,
              " elements for n=", n, ", K=", K, "; got ", w_packed.numel());
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias) {
    TORCH_CHECK(bias->device().is_cpu() && bias->dim() == 1 && bias->size(0) == n && bias->is_contiguous() &&
                    bias->scalar_type() == at::kFloat,
                "bias: expected a contiguous fp32 CPU [", n, "] tensor");
  }
  at::Tensor y = at::empty({M, n}, x.options());  // [M, N]
  if (M == 0) return y;
  Args a{x.data_ptr<float>(), K, w_packed.data_ptr<float>(), K, has_bias ? bias->data_ptr<float>() : nullptr,
         y.data_ptr<float>(), n, n};
  // Split the blocks over the intra-op threads; >= ~64 KiB of weight per task so tiny layers stay on one thread.
  const int64_t block_bytes = K * BN * 4;
  const int64_t grain = std::max<int64_t>(1, (64 * 1024) / std::max<int64_t>(block_bytes, 1));
  at::parallel_for(0, nblocks, grain, [&](int64_t b0, int64_t b1) { run_blocks(a, M, b0, b1); });
  return y;
}

// A vLLM CPU linear layer: <= max_rows rows on gemm_f32, more on vLLM's oneDNN GEMM (csrc/cpu_linear_route.h).
at::Tensor linear_f32(const at::Tensor& x, const at::Tensor& w_packed, int64_t n, const c10::optional<at::Tensor>& bias,
                      int64_t max_rows, const at::Tensor& onednn_handler) {
  return vllm_dflash::route_linear(x, n, bias, max_rows, onednn_handler,
                                   [&](const at::Tensor& x2) { return gemm_f32(x2, w_packed, n, bias); });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(vllm_dflash, m) {
  m.def("gemm_f32(Tensor x, Tensor w_packed, int n, Tensor? bias) -> Tensor");
  m.def("gemm_f32_supported() -> bool", &gemm_f32_supported);
  m.def("linear_f32(Tensor x, Tensor w_packed, int n, Tensor? bias, int max_rows, Tensor onednn_handler) -> Tensor");
}

TORCH_LIBRARY_IMPL(vllm_dflash, CPU, m) {
  m.impl("gemm_f32", &gemm_f32);
  m.impl("linear_f32", &linear_f32);
}
