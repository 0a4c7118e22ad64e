// SPDX-License-Identifier: Apache-2.0
// The Python module vllm_dflash._C: importing it loads the library, whose TORCH_LIBRARY blocks (kv_injection_cpu.cpp,
// gemv_cpu.cpp, gemm_f32_cpu.cpp) register the CPU kernels of torch.ops.vllm_dflash.*. It holds no Python functions,
// so it needs only Python's C API, not pybind11 (the kernels' files build several times faster without it).
#include <Python.h>

static struct PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_C",
                                     "vllm_dflash CPU kernels (registered as torch.ops.vllm_dflash.*)", -1, nullptr};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&kModule); }
