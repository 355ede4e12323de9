# One precompiled <torch/torch.h> for every C++ target that compiles against
# libtorch (KAPPA_PCH, on by default).
#
# Why: parsing and instantiating libtorch's API was most of what a libtorch
# translation unit cost (tests/algo/losses_test.cc: ~51 s of CPU with g++ and
# no PCH, ~29 s with g++'s PCH, 7 s with clang's, which instantiates the
# templates once with -fpch-instantiate-templates; docs/running.md, "Build
# time"). The PCH is built once, by kappa_torch_pch, and every other libtorch
# target reuses it (REUSE_FROM).
#
# Which targets: those whose compile includes libtorch, i.e. that link
# kappa_torch directly or through a library's public interface (not through a
# private link: those do not see libtorch's headers). Torch-free targets
# (proto, services, tasks, verifier, the tokenizers) never get it, and
# tests/includes/check_include_rules.py keeps their sources free of libtorch
# headers. Targets with CUDA sources are left alone (nvcc reads no PCH).
#
# The PCH must fit every user: a macro defined differently (or, for g++, at
# all) where it is included than where it was built makes the compiler refuse
# it. CMake adds -Winvalid-pch, so with -Werror g++ fails the build instead of
# silently parsing the header again; clang refuses conflicting definitions
# outright. Flags that define macros go on kappa_torch for all (-pthread).
#
# With ccache, PCH users are cached only with sloppiness
# pch_defines,time_macros (ccache's manual, "Precompiled headers"): the top
# CMakeLists.txt passes it to the launcher.

option(KAPPA_PCH "Precompile <torch/torch.h> once for every libtorch target" ON)

# True in `out` when compiling `target` puts libtorch's headers on the include
# path: kappa_torch is among its direct links, or among the public
# (INTERFACE_LINK_LIBRARIES, not $<LINK_ONLY:...>) links of those, recursively.
function(kappa_compiles_against_torch out target)
  set(${out} FALSE PARENT_SCOPE)
  get_target_property(direct ${target} LINK_LIBRARIES)
  if(NOT direct)
    return()
  endif()
  set(todo ${direct})
  set(seen "")
  while(todo)
    list(POP_FRONT todo lib)
    if(lib STREQUAL "kappa_torch")
      set(${out} TRUE PARENT_SCOPE)
      return()
    endif()
    if(lib IN_LIST seen OR NOT TARGET ${lib})
      continue()
    endif()
    list(APPEND seen ${lib})
    get_target_property(imported ${lib} IMPORTED)
    if(imported)
      continue()  # abseil, gRPC, libtorch itself: none links kappa_torch
    endif()
    get_target_property(public ${lib} INTERFACE_LINK_LIBRARIES)
    if(public)
      foreach(dep ${public})
        if(NOT dep MATCHES "^\\$<LINK_ONLY:")
          list(APPEND todo ${dep})
        endif()
      endforeach()
    endif()
  endwhile()
endfunction()

# Every buildsystem target defined in `dir` and its subdirectories.
function(kappa_targets_under out dir)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub ${subdirs})
    kappa_targets_under(sub_targets ${sub})
    list(APPEND targets ${sub_targets})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# Sorts the project's targets into those that compile against libtorch and
# the torch-free rest. Writes the torch-free targets' source files, one path a
# line, to ${CMAKE_BINARY_DIR}/torch_free_sources.txt: the ctest
# build_include_rules (tests/includes/check_include_rules.py) fails when one of
# them reaches a libtorch header, since Debian's libtorch headers sit on the
# default include path and the compiler alone would not stop it. With
# KAPPA_PCH, every libtorch target reuses kappa_torch_pch's precompiled
# <torch/torch.h>.
# REQUIRES: called once, after every add_subdirectory of the project.
function(kappa_sort_torch_targets)
  if(KAPPA_TORCH AND KAPPA_PCH)
    add_library(kappa_torch_pch OBJECT ${PROJECT_SOURCE_DIR}/cmake/torch_pch.cc)
    target_link_libraries(kappa_torch_pch PRIVATE kappa_torch)
    target_precompile_headers(kappa_torch_pch PRIVATE <torch/torch.h>)
  endif()
  kappa_targets_under(targets ${PROJECT_SOURCE_DIR})
  set(users "")
  set(torch_free_sources "")
  foreach(target ${targets})
    get_target_property(type ${target} TYPE)
    if(target STREQUAL "kappa_torch_pch" OR NOT type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|OBJECT_LIBRARY|SHARED_LIBRARY)$")
      continue()
    endif()
    get_target_property(sources ${target} SOURCES)
    get_target_property(source_dir ${target} SOURCE_DIR)
    kappa_compiles_against_torch(uses_torch ${target})
    if(NOT uses_torch)
      foreach(source ${sources})
        get_filename_component(path ${source} ABSOLUTE BASE_DIR ${source_dir})
        list(APPEND torch_free_sources ${path})
      endforeach()
      continue()
    endif()
    set(cuda_sources ${sources})
    list(FILTER cuda_sources INCLUDE REGEX "\\.cu$")
    if(KAPPA_TORCH AND KAPPA_PCH AND NOT cuda_sources)
      target_precompile_headers(${target} REUSE_FROM kappa_torch_pch)
      list(APPEND users ${target})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES torch_free_sources)
  list(JOIN torch_free_sources "\n" lines)
  file(WRITE ${CMAKE_BINARY_DIR}/torch_free_sources.txt "${lines}\n")
  if(users)
    list(LENGTH users count)
    message(STATUS "kappa: <torch/torch.h> precompiled once for ${count} libtorch targets (KAPPA_PCH)")
  endif()
endfunction()
