# ccache for C++ and CUDA. The sloppiness settings let ccache serve objects built with the
# precompiled LibTorch header (whose timestamps and defines it otherwise refuses to trust).
if(NOT KILN_CCACHE)
  return()
endif()
find_program(KILN_CCACHE_PROGRAM ccache)
if(NOT KILN_CCACHE_PROGRAM)
  return()
endif()
set(_kiln_ccache_launcher
    "${CMAKE_COMMAND}" -E env
    "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
    "CCACHE_BASEDIR=${CMAKE_SOURCE_DIR}" "${KILN_CCACHE_PROGRAM}")
set(CMAKE_CXX_COMPILER_LAUNCHER "${_kiln_ccache_launcher}")
set(CMAKE_CUDA_COMPILER_LAUNCHER "${_kiln_ccache_launcher}")
message(STATUS "kiln: compiling through ${KILN_CCACHE_PROGRAM}")
