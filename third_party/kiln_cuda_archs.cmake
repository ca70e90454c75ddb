# The default CMAKE_CUDA_ARCHITECTURES, decided before project() (so that CMake's own default,
# the compiler's oldest architecture, never applies) from the nvcc this configure will use:
#   70  V100 (Volta: the kernels' sm_70 paths, fp16), whenever the nvcc can still target it:
#       CUDA 12 and older (CUDA 13 dropped sm_70)
#   80  A100 (and, through its machine code, the sm_86/sm_89 cards)
#   90  H100/H200
# A user's own list (-DCMAKE_CUDA_ARCHITECTURES=...) wins. The nvcc is CMAKE_CUDA_COMPILER, else
# CUDACXX, else nvcc on PATH, else /usr/local/cuda/bin/nvcc: the order CMake itself searches.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(_kiln_nvcc "${CMAKE_CUDA_COMPILER}")
  if(NOT _kiln_nvcc AND DEFINED ENV{CUDACXX})
    set(_kiln_nvcc "$ENV{CUDACXX}")
  endif()
  if(NOT _kiln_nvcc)
    find_program(_kiln_nvcc_found nvcc PATHS /usr/local/cuda/bin)
    set(_kiln_nvcc "${_kiln_nvcc_found}")
  endif()
  set(_kiln_default_archs "80;90")
  if(_kiln_nvcc)
    execute_process(COMMAND "${_kiln_nvcc}" --version OUTPUT_VARIABLE _kiln_nvcc_version ERROR_QUIET)
    if(_kiln_nvcc_version MATCHES "release ([0-9]+)\\.")
      set(KILN_NVCC_MAJOR "${CMAKE_MATCH_1}")
      if(KILN_NVCC_MAJOR LESS 13)
        set(_kiln_default_archs "70;80;90")
      endif()
    endif()
  endif()
  set(CMAKE_CUDA_ARCHITECTURES "${_kiln_default_archs}" CACHE STRING
      "CUDA architectures for kiln's kernels (70 = V100 with CUDA 12, 80 = A100, 90 = H100/H200)")
endif()
