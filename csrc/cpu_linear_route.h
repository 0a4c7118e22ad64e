// SPDX-License-Identifier: Apache-2.0
// A vLLM CPU linear layer with few rows on one of our kernels and the rest on vLLM's own oneDNN GEMM, shared by
// linear_bf16 (gemv_cpu.cpp) and linear_f32 (gemm_f32_cpu.cpp):
//   x [..., K] -> [..., N]: M = x.numel() / K rows; M <= max_rows: ours(x2 [M, K]) -> [M, N]; else vLLM's
//   _C::onednn_mm with the layer's oneDNN handler (made by vllm._custom_ops.create_onednn_mm from the same weight).
// The choice happens here, at run time: under torch.compile a Python branch on M would be traced for one shape.
// Contract: vLLM 0.32's `_C::onednn_mm(Tensor(a!) c, Tensor a, Tensor? bias, Tensor handler_tensor) -> ()`
// (vllm_dflash/integration/seam.py checks the schema before the patch that uses these ops is applied).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>

#include <vector>

namespace vllm_dflash {

template <typename Ours>
at::Tensor route_linear(const at::Tensor& x, int64_t n, const c10::optional<at::Tensor>& bias, int64_t max_rows,
                        const at::Tensor& onednn_handler, Ours&& ours) {
  const int64_t K = x.size(-1);
  const int64_t M = K > 0 ? x.numel() / K : 0;
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = n;
  const at::Tensor x2 = x.reshape({M, K}).contiguous();  // [M, K] (a view for the usual 2-D contiguous input)
  if (M <= max_rows) return ours(x2).view(out_shape);
  static const auto onednn_mm =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("_C::onednn_mm", "")
          .typed<void(at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&, const at::Tensor&)>();
  at::Tensor y = at::empty({M, n}, x.options());  // [M, N]
  onednn_mm.call(y, x2, bias, onednn_handler);
  return y.view(out_shape);
}

}  // namespace vllm_dflash
