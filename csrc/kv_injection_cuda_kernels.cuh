// SPDX-License-Identifier: Apache-2.0
// CUDA kernels of the fused DFlash KV injection (no torch dependency: compile-checked on its own with nvcc).
//
//   rms_norm_rows:  x[t] = (ctx[t] * rsqrt(mean(ctx[t]^2) + eps)) -> T, times w          one block per row
//   knorm_rope_scatter: for every (token t < n_tokens, layer l, kv head h):
//       k = RoPE(RMSNorm(kv[t, l, K, h]) * k_norm_w[l], positions[t]);  v = kv[t, l, V, h]
//       cache_l[blk, h, off, 0:hd] = k;  cache_l[blk, h, off, hd:2hd] = v   (slot = blk*bs + off; -1 skipped)
//   with the cache addressed through its strides (vLLM 0.32 CUDA backends: logical [nb, nkv, bs, 2*hd],
//   any physical permutation). One warp per (t, l, h); lanes own RoPE pairs, so norm + rotation + stores are
//   one pass over registers: reads kv once, writes K and V once -- the memory-bound minimum.
#pragma once

#include <cstdint>

namespace vllm_dflash_cuda {

template <typename T> __device__ __forceinline__ float ld(const T* p) { return static_cast<float>(*p); }
template <typename T> __device__ __forceinline__ T cvt(float v) { return static_cast<T>(v); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__global__ void rms_norm_rows(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ out, int64_t H,
                              float eps) {
  const int64_t t = blockIdx.x;
  const T* row = x + t * H;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
    const float v = ld(row + i);
    ss += v * v;
  }
  __shared__ float part[32];
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float s = threadIdx.x < (blockDim.x + 31) / 32 ? part[threadIdx.x] : 0.f;
    s = warp_sum(s);
    if (threadIdx.x == 0) part[0] = s;
  }
  __syncthreads();
  const float r = rsqrtf(part[0] / static_cast<float>(H) + eps);
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x)
    out[t * H + i] = cvt<T>(static_cast<float>(cvt<T>(ld(row + i) * r)) * ld(w + i));
}

struct CacheView {
  void* base[8];  // per layer (at most 8 draft layers per launch)
  int64_t s_blk[8], s_head[8], s_tok[8], s_dim[8], num_blocks[8];
};

// grid: (ceil(n_tokens * L * nkv / warps_per_block)), block: 32 * warps_per_block
template <typename T, int MAX_PAIRS>
__global__ void knorm_rope_scatter(const T* __restrict__ kv, const int64_t* __restrict__ positions,
                                   const int64_t* __restrict__ slots, const T* __restrict__ k_norm_w,
                                   const T* __restrict__ cos_sin, CacheView cache, int64_t n_tokens, int64_t L,
                                   int64_t nkv, int64_t hd, int64_t block_size, int64_t max_pos, float eps,
                                   bool neox) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp >= n_tokens * L * nkv) return;
  const int64_t h = warp % nkv, l = (warp / nkv) % L, t = warp / (nkv * L);
  const int64_t slot = slots[t];
  const int64_t p = positions[t];
  if (slot < 0 || p < 0 || p >= max_pos) return;  // padding (or an invalid position: never read garbage)
  const int64_t blk = slot / block_size, off = slot % block_size;
  if (blk >= cache.num_blocks[l]) return;
  const int64_t kvsz = nkv * hd, half = hd / 2;
  const T* ksrc = kv + t * (L * 2 * kvsz) + l * 2 * kvsz + h * hd;
  const T* vsrc = ksrc + kvsz;
  float a[MAX_PAIRS], b[MAX_PAIRS];
  int64_t ia[MAX_PAIRS], ib[MAX_PAIRS];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < MAX_PAIRS; ++j) {
    const int64_t q = lane + 32 * j;  // RoPE pair index
    ia[j] = -1;
    if (q < half) {
      ia[j] = neox ? q : 2 * q;
      ib[j] = neox ? q + half : 2 * q + 1;
      a[j] = ld(ksrc + ia[j]);
      b[j] = ld(ksrc + ib[j]);
      ss += a[j] * a[j] + b[j] * b[j];
    }
  }
  const float r = rsqrtf(warp_sum(ss) / static_cast<float>(hd) + eps);
  const T* kw = k_norm_w + l * hd;
  const T* cs = cos_sin + p * hd;
  T* dst = static_cast<T*>(cache.base[l]) + blk * cache.s_blk[l] + h * cache.s_head[l] + off * cache.s_tok[l];
  const int64_t sd = cache.s_dim[l];
#pragma unroll
  for (int j = 0; j < MAX_PAIRS; ++j) {
    if (ia[j] < 0) continue;
    const int64_t q = lane + 32 * j;
    const float x = static_cast<float>(cvt<T>(static_cast<float>(cvt<T>(a[j] * r)) * ld(kw + ia[j])));
    const float y = static_cast<float>(cvt<T>(static_cast<float>(cvt<T>(b[j] * r)) * ld(kw + ib[j])));
    const float c = ld(cs + q), s = ld(cs + half + q);
    dst[ia[j] * sd] = cvt<T>(x * c - y * s);
    dst[ib[j] * sd] = cvt<T>(y * c + x * s);
  }
  for (int64_t d = lane; d < hd; d += 32) dst[(hd + d) * sd] = vsrc[d];
}

}  // namespace vllm_dflash_cuda
