// Entry points of kiln's CUDA kernel sources compiled for the CPU emulation
// (tests/kernels/*_emulated.cpp, one translation unit per .cu). Pointers are host memory; the
// stream is ignored.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kiln/kernels/cross_entropy.cuh"
#include "kiln/kernels/flash_attention.cuh"
#include "kiln/kernels/rmsnorm.cuh"
#include "kiln/kernels/rope.cuh"
#include "kiln/kernels/swiglu.cuh"

namespace kiln::kernels::emulated {

bool flash_supported(const FlashShape& shape);
size_t flash_smem_bytes(int head_dim, int arch);
size_t flash_doc_ranges_ints(int batch, int seq_k);
void launch_flash_fwd(const FlashFwdParams& params, Stream stream);
void launch_flash_bwd(const FlashBwdParams& params, Stream stream);

void launch_rmsnorm_fwd(const RmsNormFwdParams& params, Stream stream);
int64_t rmsnorm_bwd_smem_bytes(int64_t cols);
int64_t rmsnorm_bwd_static_smem_bytes();
int64_t rmsnorm_bwd_max_smem(int64_t device_optin);
bool rmsnorm_bwd_fits(int64_t cols, int64_t device_optin);
int rmsnorm_bwd_blocks(const RmsNormBwdParams& params, int64_t sms);
bool rmsnorm_bwd_uses_registers(const RmsNormBwdParams& params);
void launch_rmsnorm_bwd(const RmsNormBwdParams& params, Stream stream);
void launch_rope(const RopeParams& params, Stream stream);
void launch_rope_mixed(const RopeMixedParams& params, Stream stream);
void launch_swiglu_fwd(const SwiGluParams& params, Stream stream);
void launch_swiglu_bwd(const SwiGluParams& params, Stream stream);
void launch_cross_entropy_fwd_bwd(const CrossEntropyParams& params, Stream stream);

}  // namespace kiln::kernels::emulated
