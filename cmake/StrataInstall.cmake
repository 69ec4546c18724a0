# Install rules: headers, static libraries, the CMake package `strata` and strata.pc.
#
# Headers keep the layout of the source tree under include/strata/ (include/strata/core/status.hpp):
# Strata's headers include each other as "core/status.hpp", so users write the same, with
# <prefix>/include/strata on their include path (the exported targets and strata.pc put it there).
# The layer folders (core/, host/, ...) are thus inside a folder Strata owns instead of directly in
# <prefix>/include, where names as common as core/ or cache/ would meet other packages'.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(STRATA_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/strata CACHE STRING "Where strataConfig.cmake goes")
set(_strata_targets strata)
foreach(layer IN LISTS STRATA_LAYERS)
  list(APPEND _strata_targets strata_${layer})
endforeach()
# Each layer's public headers are its HEADERS file set (BASE_DIRS the source root), listed in its
# CMakeLists.txt: the public API only (no detail/, no kernel bodies, no engines), each compiling
# alone from the prefix (the test install_headers_alone).
install(TARGETS ${_strata_targets} EXPORT strataTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/strata)
install(EXPORT strataTargets NAMESPACE strata:: DESTINATION ${STRATA_INSTALL_CMAKEDIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/strataConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/strataConfig.cmake INSTALL_DESTINATION ${STRATA_INSTALL_CMAKEDIR})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/strataConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/strataConfig.cmake ${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/StrataNccl.cmake
        DESTINATION ${STRATA_INSTALL_CMAKEDIR})

# strata.pc: the archives top layer first (each before the layers it uses), then what they need.
set(STRATA_PC_LIBS "-L\${libdir}")
set(_layers_top_down ${STRATA_LAYERS})
list(REVERSE _layers_top_down)
foreach(layer IN LISTS _layers_top_down)
  string(APPEND STRATA_PC_LIBS " -lstrata_${layer}")
endforeach()
if(STRATA_HAVE_NCCL)
  get_filename_component(_nccl_dir ${STRATA_NCCL_LIBRARY} DIRECTORY)
  string(APPEND STRATA_PC_LIBS " -L${_nccl_dir} -Wl,-rpath,${_nccl_dir} -lnccl")
endif()
if(STRATA_HAVE_MPI)
  foreach(lib IN LISTS MPI_CXX_LIBRARIES)
    string(APPEND STRATA_PC_LIBS " ${lib}")
  endforeach()
endif()
if(STRATA_HAVE_CUDA)
  string(APPEND STRATA_PC_LIBS " ${CUDA_cudart_static_LIBRARY} -ldl -lrt")
endif()
string(APPEND STRATA_PC_LIBS " -pthread")
# prefix is found from the .pc file's own folder, so an installed tree can be moved.
file(RELATIVE_PATH STRATA_PC_PREFIX_FROM_PCFILEDIR /root/${CMAKE_INSTALL_LIBDIR}/pkgconfig /root)
string(REGEX REPLACE "/$" "" STRATA_PC_PREFIX_FROM_PCFILEDIR "${STRATA_PC_PREFIX_FROM_PCFILEDIR}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/strata.pc.in ${PROJECT_BINARY_DIR}/strata.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/strata.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
