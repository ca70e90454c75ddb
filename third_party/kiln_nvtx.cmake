# NVTX (NVIDIA Tools Extension, header-only v3): kiln's named ranges (lib/kiln/common/nvtx.cpp) for
# Nsight Systems' timeline and Nsight Compute's --nvtx-include filters. Costs nothing without a
# tool: the first call looks for one (NVTX_INJECTION64_PATH, or a tool that preloads itself) and,
# finding none, every later call returns at once. Looked for in this order (any build, CUDA or not):
#   1. the torch wheel's (nvidia/cu13/include for CUDA 13 wheels, nvidia/nvtx/include for CUDA 12);
#   2. the toolkit of the nvcc in use, or /usr/local/cuda.
# Results: KILN_WITH_NVTX (ON/OFF), KILN_NVTX_INCLUDE_DIR, KILN_NVTX_INFO.
set(KILN_WITH_NVTX OFF)
set(KILN_NVTX_INCLUDE_DIR "")
set(KILN_NVTX_INFO "not found (no nvtx3/nvToolsExt.h in the torch wheel or a CUDA toolkit): ranges compiled out")
set(_kiln_wheel "${TORCH_INSTALL_PREFIX}/../nvidia")
set(_kiln_cuda "${CUDA_TOOLKIT_ROOT_DIR}")
if(NOT _kiln_cuda)
  set(_kiln_cuda "/usr/local/cuda")
endif()
foreach(_kiln_inc IN ITEMS "${_kiln_wheel}/cu13/include" "${_kiln_wheel}/nvtx/include" "${_kiln_cuda}/include")
  if(EXISTS "${_kiln_inc}/nvtx3/nvToolsExt.h")
    get_filename_component(KILN_NVTX_INCLUDE_DIR "${_kiln_inc}" REALPATH)
    set(KILN_WITH_NVTX ON)
    set(KILN_NVTX_INFO "${KILN_NVTX_INCLUDE_DIR}/nvtx3")
    break()
  endif()
endforeach()
message(STATUS "kiln: NVTX ranges: ${KILN_NVTX_INFO}")
