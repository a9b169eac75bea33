# `cmake --install` and the exported package: a separate project does
#   find_package(handgrad REQUIRED)
#   target_link_libraries(app PRIVATE handgrad::handgrad)
# The package finds Eigen, spdlog (and CUDAToolkit when built with CUDA) with
# find_dependency, so it needs them installed as packages: with the bundled
# headers of .deps (scripts/pack_device_deps.sh) there is nothing to point an
# installed package at, and the install rules are left out.
include(CMakePackageConfigHelpers)

if(NOT TARGET Eigen3::Eigen OR NOT TARGET spdlog::spdlog)
  set(HG_INSTALL OFF)
  message(STATUS "handgrad: install/export rules OFF (Eigen or spdlog come from the .deps bundle, not packages)")
  return()
endif()
set(HG_INSTALL ON)
message(STATUS "handgrad: install/export rules ON (cmake --install <build> --prefix <dir>)")

target_link_libraries(handgrad INTERFACE $<INSTALL_INTERFACE:Eigen3::Eigen> $<INSTALL_INTERFACE:spdlog::spdlog>)
set_target_properties(handgrad PROPERTIES EXPORT_NAME handgrad)

install(TARGETS handgrad EXPORT handgradTargets ARCHIVE DESTINATION lib LIBRARY DESTINATION lib)
foreach(dir core ops models cuda dist)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ DESTINATION include/handgrad/${dir}
          FILES_MATCHING PATTERN "*.hpp" PATTERN "*.cuh")
endforeach()
foreach(program train translate hg_op layernorm_gradcheck)
  install(TARGETS ${program} RUNTIME DESTINATION bin)
endforeach()

install(EXPORT handgradTargets NAMESPACE handgrad:: DESTINATION lib/cmake/handgrad)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/handgradConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/handgradConfig.cmake INSTALL_DESTINATION lib/cmake/handgrad)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/handgradConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/handgradConfig.cmake ${PROJECT_BINARY_DIR}/handgradConfigVersion.cmake
        DESTINATION lib/cmake/handgrad)
