# Apache Arrow C++ with Parquet, for .parquet inputs (lib/kiln/data/parquet_reader.cpp, the one
# source that includes Arrow). Optional: KILN_PARQUET = AUTO (use it when found), ON (required)
# or OFF. Looked for in this order:
#   1. a system Arrow/Parquet (find_package(Arrow)/(Parquet), e.g. Apache's libparquet-dev);
#   2. the pyarrow wheel in ${KILN_PYTHON}'s environment (scripts/setup.sh installs it, as the
#      torch wheel provides LibTorch): its headers (pyarrow.get_include()) and its versioned
#      libarrow.so.N / libparquet.so.N, linked by full path (the wheel has no unversioned .so
#      links, and the build never writes into the environment), found at run time through an
#      RPATH entry for the wheel's folder. A link test checks that this compiler's C++ ABI
#      (std::string's mangled names) matches the wheel's before it is used.
# Results: KILN_WITH_PARQUET (ON/OFF), KILN_PARQUET_INFO (what was found, or why not), and the
# INTERFACE target kiln::parquet (libraries and RPATH; the include folder is in
# KILN_PARQUET_INCLUDE_DIRS, given to parquet_reader.cpp alone).
set(KILN_PARQUET "AUTO" CACHE STRING "Read .parquet inputs through Apache Arrow C++: AUTO, ON or OFF")
set_property(CACHE KILN_PARQUET PROPERTY STRINGS AUTO ON OFF)

add_library(kiln_parquet INTERFACE)
add_library(kiln::parquet ALIAS kiln_parquet)
set(KILN_WITH_PARQUET OFF)
set(KILN_PARQUET_INCLUDE_DIRS "")
set(KILN_PARQUET_INFO "")

function(_kiln_arrow_from_system)
  find_package(Arrow CONFIG QUIET)
  if(NOT Arrow_FOUND)
    set(_why "no system Arrow (find_package(Arrow))" PARENT_SCOPE)
    return()
  endif()
  find_package(Parquet CONFIG QUIET)
  if(NOT Parquet_FOUND OR NOT TARGET Parquet::parquet_shared)
    set(_why "system Arrow ${Arrow_VERSION} has no Parquet (find_package(Parquet))" PARENT_SCOPE)
    return()
  endif()
  if(Arrow_VERSION VERSION_LESS 16)
    set(_why "system Arrow ${Arrow_VERSION} is older than 16" PARENT_SCOPE)
    return()
  endif()
  target_link_libraries(kiln_parquet INTERFACE Parquet::parquet_shared Arrow::arrow_shared)
  get_target_property(_inc Arrow::arrow_shared INTERFACE_INCLUDE_DIRECTORIES)
  set(KILN_PARQUET_INCLUDE_DIRS "${_inc}" PARENT_SCOPE)
  set(KILN_WITH_PARQUET ON PARENT_SCOPE)
  set(KILN_PARQUET_INFO "system Arrow ${Arrow_VERSION} at ${Arrow_DIR}" PARENT_SCOPE)
endfunction()

function(_kiln_arrow_from_pyarrow)
  set(_python "$ENV{KILN_PYTHON}")
  if(NOT _python)
    set(_python "${KILN_PYTHON}")
  endif()
  if(NOT _python)
    set(_why "no system Arrow, and KILN_PYTHON is not set to look for the pyarrow wheel" PARENT_SCOPE)
    return()
  endif()
  execute_process(
    COMMAND "${_python}" -c "import pyarrow; print(pyarrow.__version__); print(pyarrow.get_include()); print(pyarrow.get_library_dirs()[0])"
    OUTPUT_VARIABLE _out OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    set(_why "no system Arrow, and no pyarrow in ${_python} (scripts/setup.sh installs it)" PARENT_SCOPE)
    return()
  endif()
  string(REPLACE "\n" ";" _out "${_out}")
  list(GET _out 0 _version)
  list(GET _out 1 _include)
  list(GET _out 2 _libdir)
  # libarrow.so.2600, not libarrow.so.2600.1.0 (the wheel ships only the soname files).
  foreach(_lib arrow parquet)
    file(GLOB _found "${_libdir}/lib${_lib}.so.[0-9]*")
    list(FILTER _found INCLUDE REGEX "/lib${_lib}\\.so\\.[0-9]+$")
    if(NOT _found)
      set(_why "pyarrow ${_version} at ${_libdir} has no lib${_lib}.so.N" PARENT_SCOPE)
      return()
    endif()
    list(GET _found 0 _path_${_lib})
  endforeach()
  if(NOT EXISTS "${_include}/parquet/arrow/reader.h")
    set(_why "pyarrow ${_version} has no headers at ${_include}" PARENT_SCOPE)
    return()
  endif()
  # The link test: a call that takes a std::string links only when both sides mangle it alike
  # (_GLIBCXX_USE_CXX11_ABI); cached, so it runs once per build folder and wheel.
  set(_key "${_version}|${_path_arrow}|${CMAKE_CXX_COMPILER}")
  if(NOT KILN_PYARROW_LINK_TEST_KEY STREQUAL _key)
    set(_dir "${CMAKE_BINARY_DIR}/CMakeFiles/kiln_pyarrow_link_test")
    file(WRITE "${_dir}/main.cpp"
         "#include <arrow/io/file.h>\n#include <parquet/arrow/reader.h>\n"
         "int main(int argc, char** argv) {\n"
         "  auto f = arrow::io::ReadableFile::Open(argc > 1 ? argv[1] : \"x\");\n"
         "  return f.ok() && parquet::arrow::OpenFile(*f, arrow::default_memory_pool()).ok() ? 0 : 1;\n}\n")
    try_compile(_ok "${_dir}/build" SOURCES "${_dir}/main.cpp"
      CMAKE_FLAGS "-DINCLUDE_DIRECTORIES=${_include}"
      LINK_LIBRARIES "${_path_parquet}" "${_path_arrow}"
      CXX_STANDARD 20 CXX_STANDARD_REQUIRED ON
      OUTPUT_VARIABLE _log)
    set(KILN_PYARROW_LINK_TEST_OK ${_ok} CACHE INTERNAL "")
    set(KILN_PYARROW_LINK_TEST_KEY "${_key}" CACHE INTERNAL "")
    if(NOT _ok)
      file(WRITE "${_dir}/log.txt" "${_log}")
    endif()
  endif()
  if(NOT KILN_PYARROW_LINK_TEST_OK)
    set(_log "${CMAKE_BINARY_DIR}/CMakeFiles/kiln_pyarrow_link_test/log.txt")
    set(_why "pyarrow ${_version}'s libraries do not link with this compiler (C++ ABI?; see ${_log})" PARENT_SCOPE)
    return()
  endif()
  target_link_libraries(kiln_parquet INTERFACE "${_path_parquet}" "${_path_arrow}")
  target_link_options(kiln_parquet INTERFACE "LINKER:-rpath,${_libdir}")
  set(KILN_PARQUET_INCLUDE_DIRS "${_include}" PARENT_SCOPE)
  set(KILN_WITH_PARQUET ON PARENT_SCOPE)
  set(KILN_PARQUET_INFO "pyarrow ${_version} at ${_libdir}" PARENT_SCOPE)
endfunction()

if(KILN_PARQUET)
  set(_why "")
  _kiln_arrow_from_system()
  if(NOT KILN_WITH_PARQUET)
    _kiln_arrow_from_pyarrow()
  endif()
  if(NOT KILN_WITH_PARQUET)
    set(KILN_PARQUET_INFO "${_why}")
    if(KILN_PARQUET STREQUAL "ON")
      message(FATAL_ERROR "kiln: KILN_PARQUET=ON but no Arrow C++ with Parquet: ${_why}")
    endif()
  endif()
else()
  set(KILN_PARQUET_INFO "KILN_PARQUET=OFF")
endif()

if(KILN_WITH_PARQUET)
  message(STATUS "kiln: parquet support: ON (${KILN_PARQUET_INFO})")
else()
  message(STATUS "kiln: parquet support: OFF (${KILN_PARQUET_INFO}; .parquet inputs are refused)")
endif()
