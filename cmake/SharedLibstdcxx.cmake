# Every handgrad binary uses the shared libstdc++ (libstdc++.so.6), never a
# static copy. A static copy inside the Python module crashed the interpreter
# on the GPU machine (docs/python.md, "The crash with NumPy imported first"):
# its compiler, /opt/gcc/bin/g++ (GCC 13.3), links libstdc++.a by default, so
# _C.so carried GCC 13.3's std::locale next to the system's libstdc++.so.6
# (GCC 14) that NumPy had loaded; the two disagree on facet indices, and
# `ostream << double` in an hg::Error message called the wrong facet.
#
# Probe: link a tiny shared library the way the module is linked and look for
# libstdc++'s own definitions (std::locale::classic, std::locale::id::_M_id)
# in it. If the compiler links libstdc++ statically, put the shared library
# on every link line (CMAKE_<LANG>_STANDARD_LIBRARIES, after the target's own
# libraries): the linker then resolves std:: from it, and the compiler's
# implicit libstdc++.a, coming last, has nothing left to contribute.
# tests/cmake/check_no_static_libstdcxx.cmake (CTest no_static_libstdcxx)
# checks the built binaries.
if(NOT CMAKE_SYSTEM_NAME STREQUAL "Linux" OR NOT CMAKE_NM
   OR NOT (CMAKE_CXX_COMPILER_ID STREQUAL "GNU" OR CMAKE_CXX_COMPILER_ID MATCHES "Clang"))
  return()
endif()

set(_hg_probe_dir ${CMAKE_BINARY_DIR}/CMakeFiles/hg_libstdcxx_probe)
file(WRITE ${_hg_probe_dir}/probe.cpp
     "#include <sstream>\nstd::string hg_probe(double x) { std::ostringstream s; s << x; return s.str(); }\n")

# hg_probe_static(<out> [extra link items]): TRUE if the probe library defines libstdc++'s symbols.
function(hg_probe_static out)
  separate_arguments(_flags UNIX_COMMAND "${CMAKE_MODULE_LINKER_FLAGS} ${CMAKE_SHARED_LINKER_FLAGS}")
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -shared -fPIC ${_flags} probe.cpp ${ARGN} -o probe.so
                  WORKING_DIRECTORY ${_hg_probe_dir} RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(WARNING "handgrad: the libstdc++ probe did not link (${err}); not checked")
    set(${out} FALSE PARENT_SCOPE)
    return()
  endif()
  execute_process(COMMAND ${CMAKE_NM} --defined-only probe.so WORKING_DIRECTORY ${_hg_probe_dir}
                  OUTPUT_VARIABLE syms ERROR_QUIET)
  if(syms MATCHES "_ZNSt6locale7classicEv|_ZNKSt6locale2id5_M_idEv")
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

hg_probe_static(_hg_static)
if(NOT _hg_static)
  return()
endif()

# The compiler's own shared libstdc++ when it has one (its headers match),
# else the system's, the one the dynamic loader will find at run time.
execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so.6
                OUTPUT_VARIABLE _hg_own OUTPUT_STRIP_TRAILING_WHITESPACE)
if(IS_ABSOLUTE "${_hg_own}" AND EXISTS "${_hg_own}")
  cmake_path(NORMAL_PATH _hg_own)
  set(HG_SHARED_LIBSTDCXX "${_hg_own}" CACHE FILEPATH "The shared libstdc++ every binary links")
else()
  find_library(HG_SHARED_LIBSTDCXX NAMES libstdc++.so.6 libstdc++.so PATHS ${CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES})
endif()
if(HG_SHARED_LIBSTDCXX)
  hg_probe_static(_hg_still_static ${HG_SHARED_LIBSTDCXX})
endif()
if(NOT HG_SHARED_LIBSTDCXX OR _hg_still_static)
  message(WARNING "handgrad: ${CMAKE_CXX_COMPILER} links libstdc++ statically and no shared libstdc++ "
          "(libstdc++.so.6) could replace it; the Python module is turned off (a second libstdc++ in the "
          "interpreter crashes it). Use a compiler that links libstdc++.so.6 (e.g. -DCMAKE_CXX_COMPILER=/usr/bin/g++).")
  set(HG_STATIC_LIBSTDCXX ON)
  return()
endif()
message(STATUS "handgrad: ${CMAKE_CXX_COMPILER} links libstdc++ statically by default; "
        "every binary links ${HG_SHARED_LIBSTDCXX} instead")
foreach(lang CXX CUDA)
  string(APPEND CMAKE_${lang}_STANDARD_LIBRARIES " ${HG_SHARED_LIBSTDCXX}")
endforeach()
