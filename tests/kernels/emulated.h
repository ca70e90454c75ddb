// Entry points of kiln's CUDA kernel sources compiled for the CPU emulation
// (tests/kernels/*_emulated.cpp). Pointers are host memory; the stream is ignored.
#pragma once

#include "kiln/kernels/flash_attention.cuh"

namespace kiln::kernels::emulated {

bool flash_supported(const FlashShape& shape);
size_t flash_smem_bytes(int head_dim);
void launch_flash_fwd(const FlashFwdParams& params, Stream stream);
void launch_flash_bwd(const FlashBwdParams& params, Stream stream);

}  // namespace kiln::kernels::emulated
