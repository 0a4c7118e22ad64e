// SPDX-License-Identifier: Apache-2.0
// CUDA implementations of torch.ops.vllm_dflash.fused_context_kv{,_to_cache} (the schemas are defined by the
// CPU extension vllm_dflash._C, which must be imported first; vllm_dflash/ops/_ext.py does that).
//
// hidden RMSNorm (one block per row) -> ONE cuBLAS GEMM for all draft layers (at::mm) -> fused
// k_norm + RoPE + paged-cache scatter (one warp per token x layer x kv head, kernels in
// kv_injection_cuda_kernels.cuh). No host synchronisation: positions are not range-checked on the host;
// a token whose position is outside the RoPE cache is not written (the CPU path raises instead; in serving the
// drafter never passes one: vllm_dflash/integration/vllm_model.py `_in_rope_range`). Shapes, dtypes and devices
// are checked as in the CPU op, each with a TORCH_CHECK naming the argument.
//
// Per-operator ATen headers, not <torch/extension.h> (all of ATen and pybind11): nvcc builds this file in a third
// of the time. The Python module `_C_cuda` itself is kv_injection_cuda_module.cpp.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include "kv_injection_cuda_kernels.cuh"

namespace {

using vllm_dflash_cuda::CacheView;


at::Tensor normed(const at::Tensor& ctx, const at::Tensor& hnw, double eps) {
  at::Tensor x = at::empty_like(ctx);
  const int64_t T = ctx.size(0), H = ctx.size(1);
  if (T == 0) return x;
  auto stream = c10::cuda::getCurrentCUDAStream();
  if (ctx.scalar_type() == at::kFloat)
    vllm_dflash_cuda::rms_norm_rows<float><<<T, 256, 0, stream>>>(ctx.data_ptr<float>(), hnw.data_ptr<float>(),
                                                                   x.data_ptr<float>(), H, static_cast<float>(eps));
  else
    vllm_dflash_cuda::rms_norm_rows<c10::BFloat16><<<T, 256, 0, stream>>>(
        ctx.data_ptr<c10::BFloat16>(), hnw.data_ptr<c10::BFloat16>(), x.data_ptr<c10::BFloat16>(), H,
        static_cast<float>(eps));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return x;
}

template <typename T>
void launch(const at::Tensor& kv, const at::Tensor& positions, const at::Tensor& slots, const at::Tensor& knw,
            const at::Tensor& cs, const CacheView& view, int64_t n, int64_t L, int64_t nkv, int64_t hd, int64_t bs,
            double eps, bool neox) {
  const int64_t warps = n * L * nkv;
  if (warps == 0) return;
  constexpr int kWarpsPerBlock = 8;
  const int64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  auto stream = c10::cuda::getCurrentCUDAStream();
  auto go = [&](auto pairs_tag) {
    constexpr int P = decltype(pairs_tag)::value;
    vllm_dflash_cuda::knorm_rope_scatter<T, P><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(
        kv.data_ptr<T>(), positions.data_ptr<int64_t>(), slots.data_ptr<int64_t>(), knw.data_ptr<T>(),
        cs.data_ptr<T>(), view, n, L, nkv, hd, bs, cs.size(0), static_cast<float>(eps), neox);
  };
  if (hd <= 64)
    go(std::integral_constant<int, 1>{});
  else if (hd <= 128)
    go(std::integral_constant<int, 2>{});
  else
    go(std::integral_constant<int, 8>{});  // up to hd 512
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

constexpr size_t kMaxLayers = 8;  // CacheView's per-layer arrays (ops/kv_injection.py routes more to the reference)

// The same input checks as the CPU op (kv_injection_cpu.cpp check_inputs), plus devices. -> L, the draft layers.
int64_t check_inputs(const at::Tensor& ctx, const at::Tensor& positions, const at::Tensor& hnw, const at::Tensor& W,
                     const at::Tensor& knw, const at::Tensor& cs, int64_t nkv, int64_t hd) {
  TORCH_CHECK(ctx.is_cuda(), "ctx: must be a CUDA tensor");
  TORCH_CHECK(ctx.dim() == 2 && ctx.is_contiguous(), "ctx: contiguous [T, H]");
  TORCH_CHECK(ctx.scalar_type() == at::kFloat || ctx.scalar_type() == at::kBFloat16, "ctx: float32 or bfloat16");
  TORCH_CHECK(nkv > 0, "num_kv_heads: must be > 0, got ", nkv);
  TORCH_CHECK(hd > 0 && hd % 2 == 0 && hd <= 512, "head_dim: even and <= 512");
  for (const auto* t : {&hnw, &W, &knw, &cs}) {
    TORCH_CHECK(t->device() == ctx.device(), "weights: must be on ", ctx.device(), " (ctx's device), got ",
                t->device());
    TORCH_CHECK(t->scalar_type() == ctx.scalar_type() && t->is_contiguous(), "weights: contiguous, same dtype as ctx");
  }
  TORCH_CHECK(positions.device() == ctx.device(), "positions: must be on ", ctx.device(), " (ctx's device), got ",
              positions.device());
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.dim() == 1 && positions.numel() == ctx.size(0),
              "positions: int64 [T] (T = ", ctx.size(0), "), got ", positions.scalar_type(), " ", positions.sizes());
  const int64_t H = ctx.size(1);
  TORCH_CHECK(hnw.numel() == H && W.dim() == 2 && W.size(1) == H, "hidden size mismatch: ctx [T, ", H,
              "], hidden_norm_weight ", hnw.sizes(), ", kv_weight ", W.sizes());
  TORCH_CHECK(W.size(0) > 0 && W.size(0) % (2 * nkv * hd) == 0, "kv_weight rows must be L * 2 * nkv * hd (nkv ", nkv,
              ", hd ", hd, "), got ", W.size(0));
  const int64_t L = W.size(0) / (2 * nkv * hd);
  TORCH_CHECK(knw.dim() == 2 && knw.size(0) == L && knw.size(1) == hd, "k_norm_weight: [L, hd] = [", L, ", ", hd,
              "], got ", knw.sizes());
  TORCH_CHECK(cs.dim() == 2 && cs.size(1) == hd, "cos_sin_cache: [max_pos, hd] (hd ", hd, "), got ", cs.sizes());
  return L;
}

CacheView make_view(at::TensorList caches, int64_t nkv, int64_t hd, at::ScalarType dt, at::Device dev) {
  TORCH_CHECK(caches.size() <= kMaxLayers, "caches: at most ", kMaxLayers, " draft layers per call, got ",
              caches.size(), " (ops/kv_injection.py runs larger drafts on the PyTorch reference path)");
  CacheView v{};
  for (size_t l = 0; l < caches.size(); ++l) {
    const at::Tensor& c = caches[l];
    TORCH_CHECK(c.device() == dev, "caches[", l, "]: must be on ", dev, " (ctx's device), got ", c.device());
    TORCH_CHECK(c.is_cuda() && c.dim() == 4 && c.size(1) == nkv && c.size(3) == 2 * hd && c.scalar_type() == dt,
                "caches[", l, "]: expected a CUDA [num_blocks, ", nkv, ", block_size, ", 2 * hd, "] tensor of the ctx dtype");
    v.base[l] = c.data_ptr();
    v.s_blk[l] = c.stride(0);
    v.s_head[l] = c.stride(1);
    v.s_tok[l] = c.stride(2);
    v.s_dim[l] = c.stride(3);
    v.num_blocks[l] = c.size(0);
  }
  return v;
}

void fused_context_kv_to_cache_cuda(const at::Tensor& ctx, const at::Tensor& positions, const at::Tensor& slot_mapping,
                                    const at::Tensor& hnw, const at::Tensor& W, const at::Tensor& knw,
                                    const at::Tensor& cs, at::TensorList caches, int64_t nkv, int64_t hd, double eps,
                                    bool neox) {
  const int64_t L = check_inputs(ctx, positions, hnw, W, knw, cs, nkv, hd);
  const c10::cuda::CUDAGuard guard(ctx.device());
  TORCH_CHECK(static_cast<int64_t>(caches.size()) == L, "caches: one per draft layer (", L, "), got ", caches.size());
  TORCH_CHECK(slot_mapping.device() == ctx.device(), "slot_mapping: must be on ", ctx.device(), " (ctx's device), got ",
              slot_mapping.device());
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.dim() == 1 && slot_mapping.numel() <= ctx.size(0),
              "slot_mapping: int64 [<= T] (T = ", ctx.size(0), "), got ", slot_mapping.scalar_type(), " ",
              slot_mapping.sizes());
  const CacheView view = make_view(caches, nkv, hd, ctx.scalar_type(), ctx.device());
  at::Tensor kv = at::mm(normed(ctx, hnw, eps), W.t());  // [T, L*2*nkv*hd], one GEMM for all layers
  const int64_t bs = caches[0].size(2);
  if (ctx.scalar_type() == at::kFloat)
    launch<float>(kv, positions, slot_mapping, knw, cs, view, slot_mapping.numel(), L, nkv, hd, bs, eps, neox);
  else
    launch<c10::BFloat16>(kv, positions, slot_mapping, knw, cs, view, slot_mapping.numel(), L, nkv, hd, bs, eps, neox);
}

std::tuple<at::Tensor, at::Tensor> fused_context_kv_cuda(const at::Tensor& ctx, const at::Tensor& positions,
                                                         const at::Tensor& hnw, const at::Tensor& W,
                                                         const at::Tensor& knw, const at::Tensor& cs, int64_t nkv,
                                                         int64_t hd, double eps, bool neox) {
  // K/V as [L, T, nkv, hd]: the same kernel writing into a "cache" of T one-token blocks whose strides
  // put K and V in two separate dense tensors.
  const int64_t L = check_inputs(ctx, positions, hnw, W, knw, cs, nkv, hd), T = ctx.size(0);
  TORCH_CHECK(static_cast<size_t>(L) <= kMaxLayers, "kv_weight: at most ", kMaxLayers, " draft layers per call, got ",
              L, " (ops/kv_injection.py runs larger drafts on the PyTorch reference path)");
  at::Tensor KV = at::empty({L, T, nkv, 2, hd}, ctx.options());
  std::vector<at::Tensor> views;
  for (int64_t l = 0; l < L; ++l) views.push_back(KV[l].view({T, nkv, 1, 2 * hd}));
  at::Tensor slots = at::arange(T, positions.options());
  fused_context_kv_to_cache_cuda(ctx, positions, slots, hnw, W, knw, cs, views, nkv, hd, eps, neox);
  return {KV.select(3, 0).contiguous(), KV.select(3, 1).contiguous()};
}

}  // namespace

TORCH_LIBRARY_IMPL(vllm_dflash, CUDA, m) {
  m.impl("fused_context_kv", &fused_context_kv_cuda);
  m.impl("fused_context_kv_to_cache", &fused_context_kv_to_cache_cuda);
}
