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
# One export file per layer (strata-<layer>-targets.cmake) and one for strata::strata, so that
# strataConfig.cmake defines only the layers a user asks for (find_package(strata COMPONENTS host))
# and finds only what those need: a user of strata::host never needs MPI, CUDA or NCCL.
# Each layer's public headers are its HEADERS file set (BASE_DIRS the source root), listed in its
# CMakeLists.txt: the public API only (no detail/, no kernel bodies, no engines), each compiling
# alone from the prefix (the test install_headers_alone).
foreach(layer IN LISTS STRATA_LAYERS)
  install(TARGETS strata_${layer} EXPORT strata_${layer}_targets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/strata)
  install(EXPORT strata_${layer}_targets NAMESPACE strata:: FILE strata-${layer}-targets.cmake
          DESTINATION ${STRATA_INSTALL_CMAKEDIR})
endforeach()
install(TARGETS strata EXPORT strata_all_targets)
install(EXPORT strata_all_targets NAMESPACE strata:: FILE strata-all-targets.cmake DESTINATION ${STRATA_INSTALL_CMAKEDIR})

# What each layer needs, read from its own target_link_libraries (so it cannot drift from the build):
# the layers it uses, and the packages an installed strataConfig.cmake finds for it (threads, tbb,
# hwloc, cuda, mpi, nccl), both closed over the layers below. A link of a kind not listed here stops
# the configure: the installed package would not know how to find it.
set(STRATA_CONFIG_LAYERS "")
foreach(layer IN LISTS STRATA_LAYERS)
  get_target_property(_libs strata_${layer} LINK_LIBRARIES)
  if(NOT _libs)
    set(_libs "")  # links nothing (core)
  endif()
  set(_uses "")
  set(_needs "")
  foreach(lib IN LISTS _libs)
    if(lib MATCHES "^\\$<BUILD_INTERFACE:")
      continue()  # header-only at build time, not part of the installed interface
    elseif(lib MATCHES "^strata::(.+)$")
      list(APPEND _uses ${CMAKE_MATCH_1} ${_strata_uses_${CMAKE_MATCH_1}})
      list(APPEND _needs ${_strata_needs_${CMAKE_MATCH_1}})
    elseif(lib STREQUAL "Threads::Threads")
      list(APPEND _needs threads)
    elseif(lib STREQUAL "TBB::tbb")
      list(APPEND _needs tbb)
    elseif(lib STREQUAL "PkgConfig::STRATA_HWLOC")
      list(APPEND _needs hwloc)
    elseif(lib MATCHES "^CUDA::")
      list(APPEND _needs cuda)
    elseif(lib STREQUAL "MPI::MPI_CXX")
      list(APPEND _needs mpi)
    elseif(lib STREQUAL "strata_deps::nccl")
      list(APPEND _needs cuda nccl)
    else()
      message(FATAL_ERROR "cmake/StrataInstall.cmake: strata_${layer} links '${lib}', which the installed package "
                          "does not know how to find (add it to the list of kinds here and to strataConfig.cmake.in)")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _uses)
  list(REMOVE_DUPLICATES _needs)
  set(_strata_uses_${layer} ${_uses})
  set(_strata_needs_${layer} ${_needs})
  string(APPEND STRATA_CONFIG_LAYERS "set(_strata_uses_${layer} \"${_uses}\")\nset(_strata_needs_${layer} \"${_needs}\")\n")
endforeach()

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/strataConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/strataConfig.cmake INSTALL_DESTINATION ${STRATA_INSTALL_CMAKEDIR})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/strataConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/strataConfig.cmake ${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/StrataNccl.cmake
        DESTINATION ${STRATA_INSTALL_CMAKEDIR})

# strata.pc: the archives top layer first (each before the layers it uses), then what they need. The
# libraries are static, so what they link goes in Libs (and Requires), which a plain
# `pkg-config --libs strata` prints. No absolute library file of this machine: packages with a
# pkg-config module of their own are required by name (tbb, hwloc, MPI's), the others are linked by
# name (-lnccl), with their folder, when the linker does not search it anyway, in a variable of
# strata.pc (cuda_libdir, nccl_libdir) that a user can redefine (pkg-config --define-variable).
set(STRATA_PC_REQUIRES "tbb hwloc")
set(STRATA_PC_VARIABLES "")
set(STRATA_PC_LIBS "-L\${libdir}")
set(_layers_top_down ${STRATA_LAYERS})
list(REVERSE _layers_top_down)
foreach(layer IN LISTS _layers_top_down)
  string(APPEND STRATA_PC_LIBS " -lstrata_${layer}")
endforeach()
# strata_pc_link(VARIABLE LIBRARY_FILE): appends -l<name> for LIBRARY_FILE (libNAME.a, libNAME.so[.N]) to
# STRATA_PC_LIBS, after -L${VARIABLE} (and its run path for a shared library) with VARIABLE=its folder
# when the linker does not search that folder by default; anything but an absolute path as it is.
function(strata_pc_link variable file)
  if(NOT IS_ABSOLUTE "${file}")  # a flag or a bare name (-lfoo, foo): as it is
    set(STRATA_PC_LIBS "${STRATA_PC_LIBS} ${file}" PARENT_SCOPE)
    return()
  endif()
  get_filename_component(dir ${file} DIRECTORY)
  get_filename_component(name ${file} NAME)
  string(REGEX REPLACE "^lib([^.]+)\\..*$" "\\1" name "${name}")
  set(libs "${STRATA_PC_LIBS}")
  if(NOT dir IN_LIST CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES)
    if(NOT STRATA_PC_VARIABLES MATCHES "(^|\n)${variable}=")
      set(STRATA_PC_VARIABLES "${STRATA_PC_VARIABLES}${variable}=${dir}\n" PARENT_SCOPE)
    endif()
    string(APPEND libs " -L\${${variable}}")
    if(file MATCHES "\\.so(\\.[0-9]+)*$")
      string(APPEND libs " -Wl,-rpath,\${${variable}}")
    endif()
  endif()
  set(STRATA_PC_LIBS "${libs} -l${name}" PARENT_SCOPE)
endfunction()
if(STRATA_HAVE_NCCL)
  strata_pc_link(nccl_libdir ${STRATA_NCCL_LIBRARY})
endif()
if(STRATA_HAVE_MPI)
  # The mpi communicator uses MPI's C API: its C module (Debian's mpi-c follows the default MPI).
  pkg_search_module(STRATA_PC_MPI QUIET mpi-c ompi-c mpich)
  if(STRATA_PC_MPI_FOUND)
    string(APPEND STRATA_PC_REQUIRES " ${STRATA_PC_MPI_MODULE_NAME}")
  else()
    foreach(lib IN LISTS MPI_CXX_LIBRARIES)
      strata_pc_link(mpi_libdir ${lib})
    endforeach()
  endif()
endif()
if(STRATA_HAVE_CUDA)
  strata_pc_link(cuda_libdir ${CUDA_cudart_static_LIBRARY})
  string(APPEND STRATA_PC_LIBS " -ldl -lrt")
endif()
string(APPEND STRATA_PC_LIBS " -pthread")
# prefix is found from the .pc file's own folder, so an installed tree can be moved.
file(RELATIVE_PATH STRATA_PC_PREFIX_FROM_PCFILEDIR /root/${CMAKE_INSTALL_LIBDIR}/pkgconfig /root)
string(REGEX REPLACE "/$" "" STRATA_PC_PREFIX_FROM_PCFILEDIR "${STRATA_PC_PREFIX_FROM_PCFILEDIR}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/strata.pc.in ${PROJECT_BINARY_DIR}/strata.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/strata.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
