# `cmake --install BUILD --prefix P`: the troupe binary, the public API's
# headers under P/include/troupe (<troupe/troupe.hpp> and what it includes, at
# their source paths, so they include each other as in the tree), the static
# libraries, and a CMake package: find_package(troupe) + troupe::troupe.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
set(TROUPE_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)

# One umbrella target for programs: everything a custom loop or a job needs.
add_library(troupe_package INTERFACE)
target_link_libraries(troupe_package INTERFACE troupe_api troupe_report)
set_target_properties(troupe_package PROPERTIES EXPORT_NAME troupe)
add_library(troupe::troupe ALIAS troupe_package)

set(TROUPE_EXPORTED troupe_package troupe_flags troupe_messages troupe_kernels troupe_devices troupe_collectives
  troupe_models troupe_envs troupe_data troupe_config troupe_checkpoint troupe_actors
  troupe_strategies troupe_runtime troupe_report troupe_api troupe_trace troupe_monitoring
  troupe_net troupe_net_socket troupe_crypto)
if(TARGET troupe_kernels_cuda)
  list(APPEND TROUPE_EXPORTED troupe_kernels_cuda)
endif()
install(TARGETS ${TROUPE_EXPORTED} EXPORT troupeTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS troupe RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT troupeTargets NAMESPACE troupe:: DESTINATION ${TROUPE_INSTALL_CMAKEDIR})

# The public API's headers only: <troupe/troupe.hpp> and what it includes,
# under their source paths. The runtime's own headers (actors, strategies,
# runtime, devices) stay out, so a program sees none of their names.
# custom_loop_install builds a program against exactly these.
set(TROUPE_PUBLIC_HEADERS actors/job_options.hpp config/cluster.hpp config/job_config.hpp config/reducer_links.hpp
  data/dataset.hpp data/idx.hpp envs/env.hpp kernels/activation.hpp kernels/backend.hpp
  kernels/elementwise.hpp kernels/layer_ops.hpp
  kernels/optimizer.hpp messages/reduce_op.hpp messages/tensor.hpp models/model.hpp
  runtime/job.hpp)
foreach(header ${TROUPE_PUBLIC_HEADERS})
  get_filename_component(dir ${header} DIRECTORY)
  install(FILES ${header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/troupe/${dir})
endforeach()
install(FILES api/troupe.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/troupe)
# The native environment plugins' C ABI (docs/environments.md): plain C, so a
# plugin builds against it alone.
install(FILES envs/troupe_env_plugin.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/troupe/envs)

set(TROUPE_PACKAGE_CUDA ${TROUPE_HAVE_CUDA})
configure_package_config_file(cmake/troupeConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/troupeConfig.cmake INSTALL_DESTINATION ${TROUPE_INSTALL_CMAKEDIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/troupeConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/troupeConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/troupeConfigVersion.cmake cmake/FindCAF.cmake
  DESTINATION ${TROUPE_INSTALL_CMAKEDIR})
