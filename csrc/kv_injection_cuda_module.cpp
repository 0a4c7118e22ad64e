// SPDX-License-Identifier: Apache-2.0
// The Python module vllm_dflash._C_cuda: importing it loads the library, whose TORCH_LIBRARY_IMPL
// (kv_injection_cuda.cu) registers the CUDA kernels of torch.ops.vllm_dflash.*. It holds no Python functions, so
// it needs only Python's C API, not pybind11 (kept out of the .cu, which nvcc builds far faster without it).
#include <Python.h>

static struct PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_C_cuda",
                                     "vllm_dflash CUDA kernels (implementations of torch.ops.vllm_dflash.*)", -1,
                                     nullptr};

PyMODINIT_FUNC PyInit__C_cuda(void) { return PyModule_Create(&kModule); }
