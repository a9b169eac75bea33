# Fails when a built binary carries its own copy of libstdc++ instead of using
# libstdc++.so.6 (cmake/SharedLibstdcxx.cmake says why that crashes Python).
# Looks for definitions that exist only in libstdc++'s own objects, never in
# code compiled from its headers: std::locale::classic(), std::locale::id::_M_id(),
# std::ios_base::Init::Init() and the codecvt function read_utf8_code_point.
# Usage: cmake -DNM=<nm> -DFILES="a;b;..." -P check_no_static_libstdcxx.cmake
# Files not built are listed and skipped; none checked at all is an error.
cmake_minimum_required(VERSION 3.25)
if(NOT NM OR NOT FILES)
  message(FATAL_ERROR "check_no_static_libstdcxx: pass -DNM=<nm> -DFILES=<binaries>")
endif()
set(pattern "_ZNSt6locale7classicEv|_ZNKSt6locale2id5_M_idEv|_ZNSt8ios_base4InitC[12]Ev|read_utf8_code_point")
set(bad "")
set(checked 0)
foreach(f IN LISTS FILES)
  if(NOT EXISTS "${f}")
    message(STATUS "not built, skipped: ${f}")
    continue()
  endif()
  execute_process(COMMAND ${NM} --defined-only "${f}" OUTPUT_VARIABLE syms RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "check_no_static_libstdcxx: ${NM} failed on ${f}: ${err}")
  endif()
  math(EXPR checked "${checked} + 1")
  string(REGEX MATCHALL "[^\n]*(${pattern})[^\n]*" hits "${syms}")
  if(hits)
    list(GET hits 0 first)
    list(APPEND bad "${f} (e.g. ${first})")
  endif()
endforeach()
if(checked EQUAL 0)
  message(FATAL_ERROR "check_no_static_libstdcxx: none of the ${FILES} is built")
endif()
if(bad)
  list(JOIN bad "\n  " bad_lines)
  message(FATAL_ERROR "libstdc++ linked statically into:\n  ${bad_lines}\n"
          "They must use libstdc++.so.6: see cmake/SharedLibstdcxx.cmake and docs/python.md.")
endif()
message(STATUS "${checked} binaries use the shared libstdc++")
