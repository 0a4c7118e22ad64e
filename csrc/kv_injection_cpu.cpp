// SPDX-License-Identifier: Apache-2.0
// Fused DFlash KV injection on CPU (C++, OpenMP, AVX2-vectorised loops).
//
// For the context rows of one drafter step (fc-projected target features):
//   x      = RMSNorm(ctx) * hidden_norm_w                 [T, H]     (fp32 math, cast to dtype like vLLM)
//   kv     = x @ W_kv^T                                    [T, L*2*nkv*hd]  ONE GEMM for all draft layers (BLAS)
//   K_l    = RoPE(RMSNorm(kv_l.K) * k_norm_w[l], pos)      per layer l, head h   (fused epilogue, fp32 math)
//   V_l    = kv_l.V
// and, in the `_to_cache` variant, writes K/V straight into every layer's paged KV cache at
// slot_mapping (-1 = padding, not written) in vLLM 0.32's CPU attention layout ("vec"/"vec16" ISA):
//   cache [num_blocks, nkv, block_size, 2*hd]; per (block, head): K as [hd, block_size] (transposed),
//   then V as [block_size, hd]   (verified against vllm._custom_ops.cpu_attn_reshape_and_cache).
// The PyTorch definition every path is tested against: vllm_dflash/ops/kv_injection.py.
// Per-operator ATen headers and torch/library.h, not torch/extension.h (the whole C++ API and pybind11): the build
// is several times faster (scripts/setup.sh, CI). The Python module vllm_dflash._C is csrc/cpu_module.cpp.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>
#include <c10/util/BFloat16.h>

#include <cmath>
#include <vector>

namespace {

inline float to_f(float v) { return v; }
inline float to_f(c10::BFloat16 v) { return static_cast<float>(v); }
template <typename T> inline T from_f(float v) { return static_cast<T>(v); }

// x [H] -> out [H] = (x * rsqrt(mean(x^2) + eps)) cast to T, times w (T arithmetic, as vLLM/our reference).
template <typename T>
void rms_row(const T* __restrict x, const T* __restrict w, T* __restrict out, int64_t H, float eps) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < H; ++i) {
    float v = to_f(x[i]);
    ss += v * v;
  }
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(H) + eps);
  for (int64_t i = 0; i < H; ++i) out[i] = from_f<T>(to_f(from_f<T>(to_f(x[i]) * r)) * to_f(w[i]));
}

// One K head row in place in fp32 scratch: k_norm, then RoPE at `pos` (neox halves or GPT-J pairs).
// The rounding to T after the norm mirrors the reference (norm output is cast to the model dtype).
template <typename T>
void knorm_rope(float* __restrict k, const T* __restrict kw, const T* __restrict cs, int64_t hd, float eps,
                bool neox) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < hd; ++i) ss += k[i] * k[i];
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(hd) + eps);
#pragma omp simd
  for (int64_t i = 0; i < hd; ++i) k[i] = to_f(from_f<T>(to_f(from_f<T>(k[i] * r)) * to_f(kw[i])));
  const int64_t half = hd / 2;
  float tmp[512];
  if (neox) {
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float c = to_f(cs[i]), s = to_f(cs[half + i]);
      tmp[i] = k[i] * c - k[half + i] * s;
      tmp[half + i] = k[half + i] * c + k[i] * s;
    }
  } else {
    for (int64_t i = 0; i < half; ++i) {
      const float c = to_f(cs[i]), s = to_f(cs[half + i]);
      tmp[2 * i] = k[2 * i] * c - k[2 * i + 1] * s;
      tmp[2 * i + 1] = k[2 * i + 1] * c + k[2 * i] * s;
    }
  }
#pragma omp simd
  for (int64_t i = 0; i < hd; ++i) k[i] = tmp[i];
}

struct Dims {
  int64_t T, H, L, nkv, hd;
};

Dims check_inputs(const at::Tensor& ctx, const at::Tensor& positions, const at::Tensor& hnw, const at::Tensor& W,
                  const at::Tensor& knw, const at::Tensor& cs, int64_t nkv, int64_t hd) {
  TORCH_CHECK(ctx.device().is_cpu(), "ctx: must be a CPU tensor");
  TORCH_CHECK(ctx.dim() == 2 && ctx.is_contiguous(), "ctx: expected a contiguous [T, H] tensor");
  TORCH_CHECK(ctx.scalar_type() == at::kFloat || ctx.scalar_type() == at::kBFloat16, "ctx: float32 or bfloat16");
  for (const auto* t : {&hnw, &W, &knw, &cs})
    TORCH_CHECK(t->scalar_type() == ctx.scalar_type() && t->is_contiguous(), "weights: contiguous, same dtype as ctx");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.numel() == ctx.size(0), "positions: int64 [T]");
  TORCH_CHECK(hd % 2 == 0 && hd <= 512, "head_dim: even and <= 512");
  const int64_t H = ctx.size(1);
  TORCH_CHECK(hnw.numel() == H && W.size(1) == H, "hidden size mismatch");
  TORCH_CHECK(W.size(0) % (2 * nkv * hd) == 0, "kv_weight rows must be L * 2 * nkv * hd");
  const int64_t L = W.size(0) / (2 * nkv * hd);
  TORCH_CHECK(knw.dim() == 2 && knw.size(0) == L && knw.size(1) == hd, "k_norm_weight: [L, hd]");
  TORCH_CHECK(cs.dim() == 2 && cs.size(1) == hd, "cos_sin_cache: [max_pos, hd]");
  return {ctx.size(0), H, L, nkv, hd};
}

// normalised context, then the single GEMM for all layers: [T, L*2*nkv*hd]
template <typename T>
void norm_rows(const at::Tensor& ctx, const at::Tensor& hnw, at::Tensor& x, float eps) {
  const int64_t T_ = ctx.size(0), H = ctx.size(1);
  const T* cp = ctx.data_ptr<T>();
  const T* wp = hnw.data_ptr<T>();
  T* xp = x.data_ptr<T>();
  at::parallel_for(0, T_, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) rms_row<T>(cp + t * H, wp, xp + t * H, H, eps);
  });
}

at::Tensor project(const at::Tensor& ctx, const at::Tensor& hnw, const at::Tensor& W, float eps) {
  at::Tensor x = at::empty_like(ctx);
  if (ctx.scalar_type() == at::kFloat)
    norm_rows<float>(ctx, hnw, x, eps);
  else
    norm_rows<c10::BFloat16>(ctx, hnw, x, eps);
  return at::mm(x, W.t());
}

// Epilogue over (t, l): k_norm + RoPE per head, then `sink(t, l, h, k_fp32, v_src)`.
template <typename T, typename Sink>
void epilogue(const at::Tensor& kv, const at::Tensor& positions, const at::Tensor& knw, const at::Tensor& cs,
              const Dims& d, float eps, bool neox, int64_t n_tokens, Sink sink) {
  const int64_t row = d.L * 2 * d.nkv * d.hd, kvsz = d.nkv * d.hd, max_pos = cs.size(0);
  const T* kvp = kv.data_ptr<T>();
  const T* kw = knw.data_ptr<T>();
  const T* csp = cs.data_ptr<T>();
  const int64_t* pos = positions.data_ptr<int64_t>();
  // Validate before the parallel region: nothing may throw inside it (an exception leaving an OpenMP worker is
  // undefined behaviour; it crashed a build with another compiler than torch's, H200 machine, torch 2.11).
  for (int64_t t = 0; t < n_tokens; ++t)
    TORCH_CHECK(pos[t] >= 0 && pos[t] < max_pos, "positions: ", pos[t], " is outside the RoPE cache (", max_pos, " rows)");
  at::parallel_for(0, n_tokens * d.L, 8, [&](int64_t b, int64_t e) {
    float k[512];
    for (int64_t i = b; i < e; ++i) {
      const int64_t t = i / d.L, l = i % d.L;
      const int64_t p = pos[t];
      const T* src = kvp + t * row + l * 2 * kvsz;
      for (int64_t h = 0; h < d.nkv; ++h) {
        const T* ks = src + h * d.hd;
#pragma omp simd
        for (int64_t j = 0; j < d.hd; ++j) k[j] = to_f(ks[j]);
        knorm_rope<T>(k, kw + l * d.hd, csp + p * d.hd, d.hd, eps, neox);
        sink(t, l, h, k, src + kvsz + h * d.hd);
      }
    }
  });
}

template <typename T>
void compute_kv(const at::Tensor& kv, const at::Tensor& positions, const at::Tensor& knw, const at::Tensor& cs,
                const Dims& d, float eps, bool neox, at::Tensor& K, at::Tensor& V) {
  T* Kp = K.data_ptr<T>();
  T* Vp = V.data_ptr<T>();
  epilogue<T>(kv, positions, knw, cs, d, eps, neox, d.T, [&](int64_t t, int64_t l, int64_t h, const float* k, const T* v) {
    const int64_t o = ((l * d.T + t) * d.nkv + h) * d.hd;
    for (int64_t j = 0; j < d.hd; ++j) Kp[o + j] = from_f<T>(k[j]);
    for (int64_t j = 0; j < d.hd; ++j) Vp[o + j] = v[j];
  });
}

std::tuple<at::Tensor, at::Tensor> fused_context_kv(const at::Tensor& ctx, const at::Tensor& positions,
                                                    const at::Tensor& hnw, const at::Tensor& W, const at::Tensor& knw,
                                                    const at::Tensor& cs, int64_t nkv, int64_t hd, double eps,
                                                    bool neox) {
  const Dims d = check_inputs(ctx, positions, hnw, W, knw, cs, nkv, hd);
  at::Tensor kv = project(ctx, hnw, W, static_cast<float>(eps));
  at::Tensor K = at::empty({d.L, d.T, nkv, hd}, ctx.options());
  at::Tensor V = at::empty({d.L, d.T, nkv, hd}, ctx.options());
  if (ctx.scalar_type() == at::kFloat)
    compute_kv<float>(kv, positions, knw, cs, d, static_cast<float>(eps), neox, K, V);
  else
    compute_kv<c10::BFloat16>(kv, positions, knw, cs, d, static_cast<float>(eps), neox, K, V);
  return {K, V};
}

template <typename T>
void write_cache(const at::Tensor& kv, const at::Tensor& positions, const at::Tensor& knw, const at::Tensor& cs,
                 const Dims& d, float eps, bool neox, const int64_t* slots, int64_t n, int64_t bs,
                 const std::vector<void*>& base, const std::vector<int64_t>& sb, const std::vector<int64_t>& sh,
                 const std::vector<int64_t>& nb) {
  const int64_t hd = d.hd;
  for (int64_t t = 0; t < n; ++t)  // validated up front: nothing throws inside the parallel epilogue
    for (int64_t l = 0; l < d.L; ++l)
      TORCH_CHECK(slots[t] < 0 || slots[t] / bs < nb[l], "slot_mapping: slot ", slots[t], " beyond the cache (",
                  nb[l], " blocks)");
  epilogue<T>(kv, positions, knw, cs, d, eps, neox, n, [&](int64_t t, int64_t l, int64_t h, const float* k, const T* v) {
    const int64_t s = slots[t];
    if (s < 0) return;  // padding
    const int64_t blk = s / bs, off = s % bs;
    T* p = static_cast<T*>(base[l]) + blk * sb[l] + h * sh[l];
    for (int64_t j = 0; j < hd; ++j) p[j * bs + off] = from_f<T>(k[j]);  // K: [hd, block_size]
    T* pv = p + bs * hd + off * hd;                                      // V: [block_size, hd]
#pragma omp simd
    for (int64_t j = 0; j < hd; ++j) pv[j] = v[j];
  });
}

// Writes into vLLM's CPU ("vec"/"vec16") paged layout. Tokens t >= slot_mapping.numel() are padding.
void fused_context_kv_to_cache(const at::Tensor& ctx, const at::Tensor& positions, const at::Tensor& slot_mapping,
                               const at::Tensor& hnw, const at::Tensor& W, const at::Tensor& knw, const at::Tensor& cs,
                               at::TensorList caches, int64_t nkv, int64_t hd, double eps, bool neox) {
  const Dims d = check_inputs(ctx, positions, hnw, W, knw, cs, nkv, hd);
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.dim() == 1 && slot_mapping.numel() <= d.T,
              "slot_mapping: int64 [<= T]");
  TORCH_CHECK(static_cast<int64_t>(caches.size()) == d.L, "caches: one per draft layer (", d.L, "), got ", caches.size());
  const int64_t bs = caches[0].size(2);
  std::vector<void*> base(d.L);
  std::vector<int64_t> sb(d.L), sh(d.L), nb(d.L);
  for (int64_t l = 0; l < d.L; ++l) {
    const at::Tensor& c = caches[l];
    TORCH_CHECK(c.dim() == 4 && c.size(1) == nkv && c.size(2) == bs && c.size(3) == 2 * hd,
                "caches[", l, "]: expected [num_blocks, ", nkv, ", block_size, ", 2 * hd, "]");
    TORCH_CHECK(c.scalar_type() == ctx.scalar_type(), "caches[", l, "]: dtype must match ctx (fp8 caches are not fused)");
    TORCH_CHECK(c.stride(3) == 1 && c.stride(2) == 2 * hd, "caches[", l, "]: block interior must be contiguous");
    base[l] = c.data_ptr();
    sb[l] = c.stride(0);
    sh[l] = c.stride(1);
    nb[l] = c.size(0);
  }
  at::Tensor kv = project(ctx, hnw, W, static_cast<float>(eps));
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const int64_t n = slot_mapping.numel();
  if (ctx.scalar_type() == at::kFloat)
    write_cache<float>(kv, positions, knw, cs, d, static_cast<float>(eps), neox, slots, n, bs, base, sb, sh, nb);
  else
    write_cache<c10::BFloat16>(kv, positions, knw, cs, d, static_cast<float>(eps), neox, slots, n, bs, base, sb, sh, nb);
}

}  // namespace

TORCH_LIBRARY(vllm_dflash, m) {
  m.def("fused_context_kv(Tensor ctx, Tensor positions, Tensor hidden_norm_weight, Tensor kv_weight, "
        "Tensor k_norm_weight, Tensor cos_sin_cache, int num_kv_heads, int head_dim, float eps, bool is_neox) "
        "-> (Tensor, Tensor)");
  m.def("fused_context_kv_to_cache(Tensor ctx, Tensor positions, Tensor slot_mapping, Tensor hidden_norm_weight, "
        "Tensor kv_weight, Tensor k_norm_weight, Tensor cos_sin_cache, Tensor(a!)[] caches, int num_kv_heads, "
        "int head_dim, float eps, bool is_neox) -> ()");
}

TORCH_LIBRARY_IMPL(vllm_dflash, CPU, m) {
  m.impl("fused_context_kv", &fused_context_kv);
  m.impl("fused_context_kv_to_cache", &fused_context_kv_to_cache);
}

