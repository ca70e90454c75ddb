# The run-time search path a program linked against the PyPI wheel's LibTorch needs: the wheel's
# libtorch_cuda.so has no RUNPATH (Python preloads the CUDA libraries of the nvidia-* wheels), so
# a C++ program must name those folders itself. Old-style DT_RPATH (--disable-new-dtags), which
# unlike DT_RUNPATH also applies to libtorch's own dependencies. Used by kiln's build
# (kiln_torch.cmake) and by the installed package (kilnConfig.cmake) for its consumers.
#
# kiln_torch_link_options(<out-var> <torch-install-prefix>): linker options, empty for a LibTorch
# that is not the wheel's (one with its own RUNPATH, e.g. the libtorch zip).
function(kiln_torch_link_options out prefix)
  file(GLOB _dirs LIST_DIRECTORIES true "${prefix}/../nvidia/*/lib")
  set(_options "")
  if(_dirs)
    set(_rpath "${prefix}/lib")
    foreach(_d IN LISTS _dirs)
      get_filename_component(_d "${_d}" REALPATH)
      string(APPEND _rpath ":${_d}")
    endforeach()
    set(_options "LINKER:--disable-new-dtags" "LINKER:-rpath,${_rpath}")
  endif()
  set(${out} "${_options}" PARENT_SCOPE)
endfunction()
