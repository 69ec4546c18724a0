# strata_find_nccl(FOUND_VAR): looks for NCCL (nccl.h and libnccl, not part of the CUDA toolkit:
# NVIDIA's libnccl-dev, or a copy under the toolkit) and, when found, defines the imported target
# strata_deps::nccl and sets FOUND_VAR to ON. Used by Strata's build and by its installed
# strataConfig.cmake, so that both name the library the same way. Needs find_package(CUDAToolkit)
# first (its folders are searched); STRATA_NCCL_INCLUDE_DIR and STRATA_NCCL_LIBRARY override.
function(strata_find_nccl found_var)
  find_path(STRATA_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(STRATA_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(NOT STRATA_NCCL_INCLUDE_DIR OR NOT STRATA_NCCL_LIBRARY)
    set(${found_var} OFF PARENT_SCOPE)
    return()
  endif()
  if(NOT TARGET strata_deps::nccl)
    add_library(strata_deps::nccl UNKNOWN IMPORTED)
    set_target_properties(strata_deps::nccl PROPERTIES IMPORTED_LOCATION "${STRATA_NCCL_LIBRARY}"
                                                       INTERFACE_INCLUDE_DIRECTORIES "${STRATA_NCCL_INCLUDE_DIR}")
  endif()
  set(${found_var} ON PARENT_SCOPE)
endfunction()
