// The sm_80+ flash-attention backward (placeholder: the WMMA kernels with cp.async, until the
// FA2-class kernels land). Included by flash_attention.cu.
#pragma once

namespace KILN_KERNELS_NS {
namespace {

template <int D>
constexpr size_t bwd_sm80_smem_bytes() {
  return bwd_smem_bytes<D>();
}

template <typename T, int D>
void launch_bwd_sm80(const FlashBwdParams& p, Stream stream) {
  launch_bwd<T, D, true>(p, stream);
}

}  // namespace
}  // namespace KILN_KERNELS_NS
