# Resolves Eigen, spdlog (+fmt), CLI11, nlohmann-json and Catch2 (v2 or v3)
# into the targets hg::eigen, hg::spdlog, hg::cli11, hg::json and hg::catch2
# (the last with a main()).

set(_hg_bundle "${HG_DEPS_DIR}/include")

# Eigen 3.4 (header-only)
find_package(Eigen3 3.4 QUIET NO_MODULE)
add_library(hg_eigen INTERFACE)
if(TARGET Eigen3::Eigen)
  target_link_libraries(hg_eigen INTERFACE Eigen3::Eigen)
elseif(EXISTS "${_hg_bundle}/eigen3/Eigen/Core")
  target_include_directories(hg_eigen SYSTEM INTERFACE "${_hg_bundle}/eigen3")
else()
  message(FATAL_ERROR "Eigen 3.4 not found: run scripts/install_deps.sh")
endif()
add_library(hg::eigen ALIAS hg_eigen)

# spdlog with fmt
find_package(spdlog QUIET)
add_library(hg_spdlog INTERFACE)
if(TARGET spdlog::spdlog)
  target_link_libraries(hg_spdlog INTERFACE spdlog::spdlog)
elseif(EXISTS "${_hg_bundle}/spdlog/spdlog.h")
  target_include_directories(hg_spdlog SYSTEM INTERFACE "${_hg_bundle}")
  target_compile_definitions(hg_spdlog INTERFACE SPDLOG_HEADER_ONLY SPDLOG_FMT_EXTERNAL FMT_HEADER_ONLY)
else()
  message(FATAL_ERROR "spdlog not found: run scripts/install_deps.sh")
endif()
add_library(hg::spdlog ALIAS hg_spdlog)

# CLI11 (header-only)
find_package(CLI11 QUIET)
add_library(hg_cli11 INTERFACE)
if(TARGET CLI11::CLI11)
  target_link_libraries(hg_cli11 INTERFACE CLI11::CLI11)
elseif(EXISTS "${_hg_bundle}/CLI/CLI.hpp")
  target_include_directories(hg_cli11 SYSTEM INTERFACE "${_hg_bundle}")
elseif(EXISTS "/usr/include/CLI/CLI.hpp")
  # Debian's libcli11-dev ships headers without a usable config on some versions
else()
  message(FATAL_ERROR "CLI11 not found: run scripts/install_deps.sh")
endif()
add_library(hg::cli11 ALIAS hg_cli11)

# nlohmann-json (header-only): the programs' run records and --config files
find_package(nlohmann_json 3 QUIET)
add_library(hg_json INTERFACE)
if(TARGET nlohmann_json::nlohmann_json)
  target_link_libraries(hg_json INTERFACE nlohmann_json::nlohmann_json)
elseif(EXISTS "${_hg_bundle}/nlohmann/json.hpp")
  target_include_directories(hg_json SYSTEM INTERFACE "${_hg_bundle}")
else()
  message(FATAL_ERROR "nlohmann-json not found: run scripts/install_deps.sh")
endif()
add_library(hg::json ALIAS hg_json)

# Catch2: v3 (Ubuntu 24.04) provides Catch2WithMain; v2 (Debian 12) does not,
# so tests/catch_main.cpp supplies the main there.
find_package(Catch2 QUIET)
if(Catch2_FOUND AND Catch2_VERSION VERSION_GREATER_EQUAL 3)
  add_library(hg_catch2 INTERFACE)
  target_link_libraries(hg_catch2 INTERFACE Catch2::Catch2WithMain)
  set(HG_CATCH2_VERSION 3)
elseif(Catch2_FOUND)
  add_library(hg_catch2 STATIC ${CMAKE_CURRENT_SOURCE_DIR}/tests/catch_main.cpp)
  target_link_libraries(hg_catch2 PUBLIC Catch2::Catch2)
  set(HG_CATCH2_VERSION 2)
elseif(EXISTS "${_hg_bundle}/catch2/catch.hpp")
  # Bundled single-header Catch2 v2 (machines without a Catch2 package).
  add_library(hg_catch2 STATIC ${CMAKE_CURRENT_SOURCE_DIR}/tests/catch_main.cpp)
  target_include_directories(hg_catch2 SYSTEM PUBLIC "${_hg_bundle}")
  set(HG_CATCH2_VERSION 2)
else()
  message(FATAL_ERROR "Catch2 not found: run scripts/install_deps.sh")
endif()
if(HG_CATCH2_VERSION EQUAL 2 AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  # Catch2 v2's main instantiates std::regex; under ASan at -O1, g++ 12 warns
  # -Wmaybe-uninitialized inside libstdc++'s std::function. Not our code.
  target_compile_options(hg_catch2 PRIVATE -Wno-maybe-uninitialized)
endif()
add_library(hg::catch2 ALIAS hg_catch2)
message(STATUS "handgrad: Catch2 v${HG_CATCH2_VERSION}")
