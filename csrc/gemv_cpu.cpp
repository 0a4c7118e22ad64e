// SPDX-License-Identifier: Apache-2.0
// bf16 GEMV / skinny GEMM on CPU for decode-sized M (1..16 rows; any M works, tuned for small M):
//   y[M, N] = x[M, K] @ W[N, K]^T (+ bias[N])      bf16 in, bf16 out, fp32 accumulation (AVX512-BF16 vdpbf16ps)
//
// The weight is packed once (vllm_dflash/ops/gemv.py: pack_gemv_weight) into blocks of BN = 32 output rows with
// K taken in pairs ("VNNI" layout for vdpbf16ps):
//   packed[nb, kp, j, t] = W[nb*32 + j, 2*kp + t]      shape [ceil(N/32), ceil(K/2), 32, 2], zero-padded
// so one k-pair of a block is 128 contiguous bytes (two zmm: outputs 0..15 and 16..31), and a thread's range of
// blocks is one sequential stream. For each k-pair the kernel broadcasts the pair (x[m,2kp], x[m,2kp+1]) of every
// row m as one dword and issues vdpbf16ps into 16 fp32 lanes per zmm: W is read once for all rows of a chunk,
// and no horizontal reduction is needed. Every row is summed in the same order whatever M is (one accumulator chain
// per output, K ascending), so the kernel is batch-invariant: row m of y is bitwise the same for x and for x[m:m+1].
// vdpbf16ps treats bf16 denormal inputs as zero and flushes fp32 denormal results (DAZ/FTZ), so inputs
// below 2^-126 differ from a plain fp32 reference; the output is rounded to bf16 RNE (as torch's .to(bfloat16)).
//
// The extension is built with portable flags (-mavx2 ...): the AVX512 code lives in target-attributed functions and
// is used only when the CPU reports avx512bf16 (gemv_bf16_supported()); the Python side falls back otherwise.
// The PyTorch definition it is tested against: vllm_dflash/ops/gemv.py (gemv_reference).
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

constexpr int64_t BN = 32;  // output rows per packed block (two zmm of fp32 accumulators per row of x)
constexpr int MAX_MR = 12;  // rows of x per register tile: 2*MR accumulators + 2 weight + 1 broadcast <= 32 zmm

#define GEMV_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

struct Args {
  const uint16_t* x;   // [M, ldx] bf16 bits; row m's K (padded to even) values
  int64_t ldx;
  const uint16_t* w;   // packed [nblocks, kp, 32, 2]
  int64_t kp;          // K pairs
  const void* bias;    // [N] bf16 or fp32, or null
  bool bias_bf16;
  uint16_t* y;         // [M, ldy] bf16 bits
  int64_t ldy;
  int64_t n;           // valid output columns
};

GEMV_TARGET inline __m512 load_bias16(const Args& a, int64_t col, __mmask16 mask) {
  if (a.bias == nullptr) return _mm512_setzero_ps();
  if (a.bias_bf16) {
    const __m256i b = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(a.bias) + col);
    // maskz forms: the plain ones use _mm512_undefined_*, which GCC 12 flags as maybe-uninitialized
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, b), 16));
  }
  return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(a.bias) + col);
}

// One packed block (32 outputs) x MR rows starting at row m0. KS: independent accumulators along K.
// No software prefetch: the blocks a thread reads are one sequential stream, which the hardware prefetchers follow;
// _mm_prefetch 1-4 KiB ahead measured 10-25% slower at M=1 (dev/GEMV_NOTES.md).
template <int MR, int KS>
GEMV_TARGET void block_tile(const Args& a, int64_t blk, int64_t m0) {
  __m512 acc[KS][MR][2];
#pragma GCC unroll 64
  for (int s = 0; s < KS; ++s)
#pragma GCC unroll 64
    for (int m = 0; m < MR; ++m) acc[s][m][0] = acc[s][m][1] = _mm512_setzero_ps();

  const int32_t* xr[MR];
#pragma GCC unroll 64
  for (int m = 0; m < MR; ++m) xr[m] = reinterpret_cast<const int32_t*>(a.x + (m0 + m) * a.ldx);
  const uint16_t* wb = a.w + blk * a.kp * BN * 2;
  const int64_t kp = a.kp;

  int64_t p = 0;
  for (; p + KS <= kp; p += KS) {
#pragma GCC unroll 8
    for (int s = 0; s < KS; ++s) {
      const uint16_t* wp = wb + (p + s) * (BN * 2);
      const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wp);
      const __m512bh w1 = (__m512bh)_mm512_loadu_si512(wp + 32);
#pragma GCC unroll 64
      for (int m = 0; m < MR; ++m) {
        const __m512bh xb = (__m512bh)_mm512_set1_epi32(xr[m][p + s]);
        acc[s][m][0] = _mm512_dpbf16_ps(acc[s][m][0], w0, xb);
        acc[s][m][1] = _mm512_dpbf16_ps(acc[s][m][1], w1, xb);
      }
    }
  }
  for (; p < kp; ++p) {
    const uint16_t* wp = wb + p * (BN * 2);
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wp);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(wp + 32);
#pragma GCC unroll 64
    for (int m = 0; m < MR; ++m) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(xr[m][p]);
      acc[0][m][0] = _mm512_dpbf16_ps(acc[0][m][0], w0, xb);
      acc[0][m][1] = _mm512_dpbf16_ps(acc[0][m][1], w1, xb);
    }
  }

  const int64_t col0 = blk * BN;
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    const int64_t col = col0 + h * 16;
    const int64_t left = a.n - col;
    if (left <= 0) break;
    const __mmask16 mask = left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1u);
    const __m512 b = load_bias16(a, col, mask);
#pragma GCC unroll 64
    for (int m = 0; m < MR; ++m) {
      __m512 v = acc[0][m][h];
#pragma GCC unroll 8
      for (int s = 1; s < KS; ++s) v = _mm512_add_ps(v, acc[s][m][h]);
      v = _mm512_add_ps(v, b);
      const __m256bh o = _mm512_cvtneps_pbh(v);
      _mm256_mask_storeu_epi16(a.y + (m0 + m) * a.ldy + col, mask, (__m256i)o);
    }
  }
}

using TileFn = void (*)(const Args&, int64_t, int64_t);

template <int MR>
constexpr TileFn tile_for() {
  // dpbf16 latency ~6 cycles: keep >= 8 independent accumulator chains when M is tiny
  // One accumulator chain per output for every MR: the summation order never depends on M (batch-invariant, so a
  // verify step of 8 rows gives each row the bits a 1-row decode step would). K-split accumulators (KS > 1) hide
  // the ~6-cycle dpbf16 latency at M = 1-2 but measured no faster with the weight streamed from DRAM (the decode
  // case; dev/GEMV_NOTES.md), and they make the result depend on M.
  return &block_tile<MR, 1>;
}

constexpr TileFn kTiles[MAX_MR + 1] = {nullptr,        tile_for<1>(),  tile_for<2>(),  tile_for<3>(), tile_for<4>(),
                                       tile_for<5>(),  tile_for<6>(),  tile_for<7>(),  tile_for<8>(), tile_for<9>(),
                                       tile_for<10>(), tile_for<11>(), tile_for<12>()};

// Rows per tile for the `rem` rows left: <= MAX_MR, split evenly (13..16 rows -> two tiles of 7..8).
inline int64_t rows_for(int64_t rem) {
  if (rem <= MAX_MR) return rem;
  const int64_t tiles = (rem + MAX_MR - 1) / MAX_MR;
  return (rem + tiles - 1) / tiles;
}

void run_blocks(const Args& a, int64_t M, int64_t b0, int64_t b1) {
  for (int64_t blk = b0; blk < b1; ++blk) {
    for (int64_t m0 = 0; m0 < M;) {
      const int64_t mr = rows_for(M - m0);
      kTiles[mr](a, blk, m0);
      m0 += mr;
    }
  }
}

bool cpu_has_avx512bf16() {
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bf16");
  }();
  return ok;
}

bool gemv_bf16_supported() { return cpu_has_avx512bf16(); }

// x [M, K] bf16 contiguous; w_packed [ceil(N/32), ceil(K/2)*64] bf16 contiguous; bias [N] bf16/fp32 or None.
at::Tensor gemv_bf16(const at::Tensor& x, const at::Tensor& w_packed, int64_t n,
                     const c10::optional<at::Tensor>& bias) {
  // The Python wrapper (vllm_dflash/ops/gemv.py) raises ValueErrors first; these are the last line of defence.
  TORCH_CHECK(cpu_has_avx512bf16(), "gemv_bf16: this CPU lacks avx512_bf16 (check gemv_bf16_supported())");
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.is_contiguous(),
              "x: expected a contiguous bf16 CPU [M, K] tensor");
  TORCH_CHECK(w_packed.device().is_cpu() && w_packed.scalar_type() == at::kBFloat16 && w_packed.is_contiguous(),
              "w_packed: expected a contiguous bf16 CPU tensor");
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t kp = (K + 1) / 2, nblocks = (n + BN - 1) / BN;
  TORCH_CHECK(n > 0 && w_packed.numel() == nblocks * kp * BN * 2, "w_packed: expected ", nblocks * kp * BN * 2,
              " elements for n=", n, ", K=", K, "; got ", w_packed.numel());
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias) {
    TORCH_CHECK(bias->device().is_cpu() && bias->dim() == 1 && bias->size(0) == n && bias->is_contiguous() &&
                    (bias->scalar_type() == at::kBFloat16 || bias->scalar_type() == at::kFloat),
                "bias: expected a contiguous bf16/fp32 CPU [", n, "] tensor");
  }
  at::Tensor y = at::empty({M, n}, x.options());
  if (M == 0) return y;

  // Odd K: rows are read as bf16 pairs, so pad x to an even row length with a zero (the packed W is zero there
  // too, but 0 * (whatever follows the row) could be NaN).
  at::Tensor xp = x;
  if (K % 2) {
    xp = at::zeros({M, K + 1}, x.options());
    xp.narrow(1, 0, K).copy_(x);
  }
  Args a{reinterpret_cast<const uint16_t*>(xp.data_ptr()), xp.size(1),
         reinterpret_cast<const uint16_t*>(w_packed.data_ptr()), kp,
         has_bias ? bias->data_ptr() : nullptr, has_bias && bias->scalar_type() == at::kBFloat16,
         reinterpret_cast<uint16_t*>(y.data_ptr()), n, n};
  // Split the blocks over the intra-op threads; keep >= ~64 KiB of weight per task so tiny layers stay on one
  // thread instead of paying a fork/join for a few microseconds of work.
  const int64_t block_bytes = kp * BN * 2 * 2;
  const int64_t grain = std::max<int64_t>(1, (64 * 1024) / std::max<int64_t>(block_bytes, 1));
  at::parallel_for(0, nblocks, grain, [&](int64_t b0, int64_t b1) { run_blocks(a, M, b0, b1); });
  return y;
}

// A vLLM CPU linear layer: <= max_rows rows on gemv_bf16, more on vLLM's oneDNN GEMM (csrc/cpu_linear_route.h).
at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& w_packed, int64_t n, const c10::optional<at::Tensor>& bias,
                       int64_t max_rows, const at::Tensor& onednn_handler) {
  return vllm_dflash::route_linear(x, n, bias, max_rows, onednn_handler,
                                   [&](const at::Tensor& x2) { return gemv_bf16(x2, w_packed, n, bias); });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(vllm_dflash, m) {
  m.def("gemv_bf16(Tensor x, Tensor w_packed, int n, Tensor? bias) -> Tensor");
  m.def("gemv_bf16_supported() -> bool", &gemv_bf16_supported);
  m.def("linear_bf16(Tensor x, Tensor w_packed, int n, Tensor? bias, int max_rows, Tensor onednn_handler) -> Tensor");
}

TORCH_LIBRARY_IMPL(vllm_dflash, CPU, m) {
  m.impl("gemv_bf16", &gemv_bf16);
  m.impl("linear_bf16", &linear_bf16);
}
