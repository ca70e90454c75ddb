# Finds LibTorch and decides whether kiln's CUDA kernels are built.
#
# LibTorch comes from the PyPI `torch` wheel (scripts/setup.sh puts it in $KILN_HOME/venv) or from
# the user's own LibTorch through Torch_DIR. Results:
#   kiln::torch      INTERFACE target: LibTorch's libraries, includes and ABI flags
#   KILN_WITH_CUDA       ON when the CUDA sources are compiled (CUDA language enabled)
#   KILN_TORCH_HAS_CUDA  ON when LibTorch itself has CUDA (whether or not kiln's kernels are built)
#
# Two things about TorchConfig that this file works around, and why:
#  * Caffe2's cuda.cmake ignores CMAKE_CUDA_ARCHITECTURES (with a warning) and appends its own
#    -gencode flags for TORCH_CUDA_ARCH_LIST, or for every arch it knows when no GPU can be
#    detected (this machine). We hand it our arch list so it has nothing to detect, hide
#    CMAKE_CUDA_ARCHITECTURES during the call, then take its -gencode flags back out so that
#    CMake's own CUDA_ARCHITECTURES property is the single source of truth.
#    (Its "not compatible with CMAKE_CUDA_ARCHITECTURES" warning on a first configure comes from
#    its own enable_language(CUDA) and is harmless: the -gencode flags it means are removed.)
#  * The wheel's libtorch_cuda.so has no RUNPATH: Python preloads the CUDA libraries from the
#    nvidia-* wheels. A C++ program must find them itself, so we record their folders as RPATH
#    (kiln_torch_rpath.cmake, shared with the installed package).

if(NOT Torch_DIR AND DEFINED ENV{Torch_DIR})
  set(Torch_DIR "$ENV{Torch_DIR}" CACHE PATH "LibTorch's CMake package folder")
endif()
if(NOT Torch_DIR)
  set(_kiln_python "$ENV{KILN_PYTHON}")
  if(NOT _kiln_python)
    set(_kiln_python python3)
  endif()
  execute_process(
    COMMAND "${_kiln_python}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _kiln_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_kiln_torch_prefix)
    set(Torch_DIR "${_kiln_torch_prefix}/Torch" CACHE PATH "LibTorch's CMake package folder")
  endif()
endif()

set(_kiln_archs "${CMAKE_CUDA_ARCHITECTURES}")
if(NOT DEFINED TORCH_CUDA_ARCH_LIST)
  set(TORCH_CUDA_ARCH_LIST "")
  foreach(_a IN LISTS _kiln_archs)
    string(REGEX REPLACE "^([0-9]+)([0-9])([a-z]?)(-real|-virtual)?$" "\\1.\\2\\3" _v "${_a}")
    list(APPEND TORCH_CUDA_ARCH_LIST "${_v}")
  endforeach()
endif()
unset(CMAKE_CUDA_ARCHITECTURES)
unset(CMAKE_CUDA_ARCHITECTURES CACHE)

# Caffe2's cuda.cmake takes the CUDA libraries it links (cudart, nvrtc) from CMake's legacy
# FindCUDA, which looks for nvcc on PATH and then in /usr/local/cuda, not at the compiler this
# build uses: with a CUDA 12 nvcc elsewhere (the V100 set-up, $KILN_HOME/cuda-12) beside CUDA 13 in
# /usr/local/cuda, kiln linked CUDA 13's runtime next to LibTorch's CUDA 12 one ("DSO missing from
# command line"). The toolkit is the one of the nvcc in use (CUDACXX / CMAKE_CUDA_COMPILER).
set(_kiln_nvcc "${CMAKE_CUDA_COMPILER}")
if(NOT _kiln_nvcc AND DEFINED ENV{CUDACXX})
  set(_kiln_nvcc "$ENV{CUDACXX}")
endif()
if(_kiln_nvcc)
  get_filename_component(_kiln_cuda_root "${_kiln_nvcc}" DIRECTORY)
  get_filename_component(_kiln_cuda_root "${_kiln_cuda_root}" DIRECTORY)
  if(EXISTS "${_kiln_cuda_root}/include/cuda_runtime.h")
    set(CUDA_TOOLKIT_ROOT_DIR "${_kiln_cuda_root}" CACHE PATH "CUDA toolkit of the nvcc in use" FORCE)
  endif()
endif()

find_package(Torch REQUIRED)

unset(CMAKE_CUDA_ARCHITECTURES) # TorchConfig sets it OFF as a normal variable, shadowing the cache
set(CMAKE_CUDA_ARCHITECTURES "${_kiln_archs}" CACHE STRING
    "CUDA architectures for kiln's kernels (80 = A100, 90 = H100/H200)" FORCE)
if(CMAKE_CUDA_FLAGS)
  string(REGEX REPLACE "-gencode[ =]+arch=compute_[0-9a-z]+,code=[a-z_0-9]+" "" CMAKE_CUDA_FLAGS
                       "${CMAKE_CUDA_FLAGS}")
endif()

# KILN_TORCH_HAS_CUDA: LibTorch itself runs on GPUs (NCCL for data parallelism follows it, not
# KILN_WITH_CUDA: a build without kiln's kernels still trains on GPUs with ATen's ops).
set(_kiln_torch_has_cuda OFF)
if(CAFFE2_USE_CUDA AND TORCH_CUDA_LIBRARIES)
  set(_kiln_torch_has_cuda ON)
endif()
set(KILN_TORCH_HAS_CUDA ${_kiln_torch_has_cuda})
if(KILN_CUDA STREQUAL "AUTO")
  set(KILN_WITH_CUDA ${_kiln_torch_has_cuda})
elseif(KILN_CUDA)
  if(NOT _kiln_torch_has_cuda)
    message(FATAL_ERROR "KILN_CUDA=ON but the LibTorch at ${TORCH_INSTALL_PREFIX} has no CUDA")
  endif()
  set(KILN_WITH_CUDA ON)
else()
  set(KILN_WITH_CUDA OFF)
endif()
if(KILN_WITH_CUDA)
  enable_language(CUDA) # already done by TorchConfig; repeated so the intent reads here
endif()

add_library(kiln_torch INTERFACE)
add_library(kiln::torch ALIAS kiln_torch)
# libstdc++ first: the wheel's libtorch.so exports its own statically linked copies of newer
# libstdc++ parts (std::filesystem, std::chrono time zones). Linked after libtorch, the system
# libstdc++ loses the symbol lookup and our std::filesystem calls land in libtorch's copy, which
# crashes (seen: std::filesystem::remove_all -> SIGSEGV). Listed first, the system library wins.
target_link_libraries(kiln_torch INTERFACE stdc++ ${TORCH_LIBRARIES})
target_include_directories(kiln_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})

# The CUDA runtime and NVRTC kiln links are the ones LibTorch runs with: a wheel's own copies
# (nvidia/cuda_runtime, nvidia/cuda_nvrtc for CUDA 12 wheels, nvidia/cu13 for CUDA 13 ones), not
# the toolkit's, which may be older: torch 2.10.0+cu128 needs CUDA 12.5's
# cudaGetDriverEntryPointByVersion, which Debian's CUDA 12.4 (the V100 set-up's nvcc) lacks.
foreach(_kiln_lib cudart nvrtc)
  if(TARGET CUDA::${_kiln_lib})
    file(GLOB _kiln_wheel_lib "${TORCH_INSTALL_PREFIX}/../nvidia/cuda_runtime/lib/lib${_kiln_lib}.so.[0-9]*"
         "${TORCH_INSTALL_PREFIX}/../nvidia/cuda_nvrtc/lib/lib${_kiln_lib}.so.[0-9]*"
         "${TORCH_INSTALL_PREFIX}/../nvidia/cu[0-9]*/lib/lib${_kiln_lib}.so.[0-9]*")
    if(_kiln_wheel_lib)
      list(GET _kiln_wheel_lib 0 _kiln_wheel_lib)
      set_target_properties(CUDA::${_kiln_lib} PROPERTIES IMPORTED_LOCATION "${_kiln_wheel_lib}")
    endif()
  endif()
endforeach()

include(kiln_torch_rpath)
kiln_torch_link_options(_kiln_torch_link "${TORCH_INSTALL_PREFIX}")
if(_kiln_torch_link)
  target_link_options(kiln_torch INTERFACE ${_kiln_torch_link})
endif()
