# Fails when an object of core/isa/gemm_level.cpp (one per CPU level) defines
# a weak or global symbol outside its own renamed Eigen namespace and its
# one entry point. Such a symbol (an inline function of a standard header,
# say) exists in every level's object under the same name: the linker keeps
# one copy, maybe the AVX-512 one, and the baseline path would then run
# AVX-512 code on a CPU without it.
# Usage: cmake -DNM=<nm> -DOBJECTS=<obj;obj...> -P check_gemm_symbols.cmake
cmake_minimum_required(VERSION 3.25)
if(NOT NM OR NOT OBJECTS)
  message(FATAL_ERROR "check_gemm_symbols: pass -DNM=<nm> -DOBJECTS=<objects>")
endif()
set(bad "")
set(checked 0)
foreach(obj IN LISTS OBJECTS)
  execute_process(COMMAND ${NM} --defined-only ${obj} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "check_gemm_symbols: ${NM} failed on ${obj}")
  endif()
  string(REPLACE "\n" ";" lines "${out}")
  foreach(line IN LISTS lines)
    # "<address> <type> <name>": local symbols (lower-case types) cannot clash.
    if(NOT line MATCHES "^[0-9a-fA-F]* ([A-Za-z]) (.*)$")
      continue()
    endif()
    set(type "${CMAKE_MATCH_1}")
    set(name "${CMAKE_MATCH_2}")
    if(type MATCHES "^[a-z]$" AND NOT type STREQUAL "u" AND NOT type STREQUAL "v" AND NOT type STREQUAL "w")
      continue()
    endif()
    math(EXPR checked "${checked} + 1")
    # Mangled names: the renamed Eigen (hg_eigen_<level>), the level's entry
    # point hg::cpu::isa::gemm_<level>(), and the exception personality
    # pointer every C++ object with exceptions carries (data, identical).
    if(name MATCHES "hg_eigen_(baseline|x86_64_v3|x86_64_v4)" OR name MATCHES "^_ZN2hg3cpu3isa[0-9]+gemm_"
       OR name STREQUAL "DW.ref.__gxx_personality_v0")
      continue()
    endif()
    list(APPEND bad "${obj}: ${type} ${name}")
  endforeach()
endforeach()
if(bad)
  list(JOIN bad "\n  " text)
  message(FATAL_ERROR "check_gemm_symbols: shared symbols in per-level GEMM objects:\n  ${text}")
endif()
list(LENGTH OBJECTS n)
message(STATUS "check_gemm_symbols: ${n} object(s), ${checked} non-local symbol(s), all private to their level")
