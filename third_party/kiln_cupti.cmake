# CUPTI, for the GPU's hardware counters (lib/kiln/profile/counters/cupti*.cpp): the range profiler
# and profiler host APIs (cupti_range_profiler.h, cupti_profiler_host.h, CUDA 12.6 and newer).
# Only in a build with kiln's CUDA sources (KILN_WITH_CUDA) and its counters (KILN_PROFILE_COUNTERS).
# Looked for, headers and library as one pair, in this order:
#   1. the torch wheel's (nvidia/cu13 for CUDA 13 wheels, nvidia/cuda_cupti for CUDA 12 ones): the
#      libcupti.so.N that LibTorch itself loads (libtorch_cpu.so needs it for Kineto), so that a
#      process has one CUPTI, found at run time through the wheel's RPATH entries
#      (kiln_torch_rpath.cmake);
#   2. the toolkit of the nvcc in use (include/ and lib64/, or extras/CUPTI/).
# The headers are copied into the build folder (kiln_cupti_include/) and given to the
# counters/cupti*.cpp sources alone, first, so that a toolkit's own older CUPTI headers never mix
# with the chosen library's.
# Results: KILN_WITH_CUPTI (ON/OFF), KILN_CUPTI_INFO (what was found, or why not),
# KILN_CUPTI_INCLUDE_DIR, and the INTERFACE target kiln::cupti (the library).
add_library(kiln_cupti INTERFACE)
add_library(kiln::cupti ALIAS kiln_cupti)
set(KILN_WITH_CUPTI OFF)
set(KILN_CUPTI_INCLUDE_DIR "")
if(NOT KILN_PROFILE_COUNTERS)
  set(KILN_CUPTI_INFO "off (KILN_PROFILE_COUNTERS=OFF)")
elseif(NOT KILN_WITH_CUDA)
  set(KILN_CUPTI_INFO "off (no CUDA sources in this build)")
else()
  set(KILN_CUPTI_INFO "not found (no cupti_range_profiler.h + libcupti.so.N in the torch wheel or the CUDA toolkit)")
  set(_kiln_wheel "${TORCH_INSTALL_PREFIX}/../nvidia")
  set(_kiln_cuda "${CUDA_TOOLKIT_ROOT_DIR}")
  if(NOT _kiln_cuda)
    set(_kiln_cuda "/usr/local/cuda")
  endif()
  foreach(_kiln_pair IN ITEMS "${_kiln_wheel}/cu13/include|${_kiln_wheel}/cu13/lib"
                              "${_kiln_wheel}/cuda_cupti/include|${_kiln_wheel}/cuda_cupti/lib"
                              "${_kiln_cuda}/include|${_kiln_cuda}/lib64"
                              "${_kiln_cuda}/extras/CUPTI/include|${_kiln_cuda}/extras/CUPTI/lib64")
    string(REPLACE "|" ";" _kiln_pair "${_kiln_pair}")
    list(GET _kiln_pair 0 _kiln_inc)
    list(GET _kiln_pair 1 _kiln_lib)
    file(GLOB _kiln_so "${_kiln_lib}/libcupti.so.[0-9]*")
    if(_kiln_so AND EXISTS "${_kiln_inc}/cupti_range_profiler.h" AND EXISTS "${_kiln_inc}/cupti_profiler_host.h")
      list(SORT _kiln_so) # libcupti.so.13 before libcupti.so.13.0.85
      list(GET _kiln_so 0 _kiln_so)
      get_filename_component(_kiln_inc "${_kiln_inc}" REALPATH)
      get_filename_component(_kiln_so "${_kiln_so}" REALPATH)
      # Only CUPTI's own headers (cupti*.h and the cuda_stdint.h and generated_*.h they include), into a folder of their own.
      set(KILN_CUPTI_INCLUDE_DIR "${CMAKE_BINARY_DIR}/kiln_cupti_include")
      file(REMOVE_RECURSE "${KILN_CUPTI_INCLUDE_DIR}")
      file(GLOB _kiln_headers "${_kiln_inc}/cupti*.h" "${_kiln_inc}/cuda_stdint.h" "${_kiln_inc}/generated_*.h")
      file(COPY ${_kiln_headers} DESTINATION "${KILN_CUPTI_INCLUDE_DIR}")
      set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_kiln_headers})
      target_link_libraries(kiln_cupti INTERFACE "${_kiln_so}")
      if(NOT _kiln_so MATCHES "/nvidia/")
        # The toolkit's: its folder on the run-time search path (the wheel's folders already are).
        get_filename_component(_kiln_so_dir "${_kiln_so}" DIRECTORY)
        target_link_options(kiln_cupti INTERFACE "LINKER:-rpath,${_kiln_so_dir}")
      endif()
      set(KILN_WITH_CUPTI ON)
      set(KILN_CUPTI_INFO "${_kiln_so} (headers ${_kiln_inc})")
      break()
    endif()
  endforeach()
endif()
message(STATUS "kiln: CUPTI (GPU hardware counters): ${KILN_CUPTI_INFO}")
