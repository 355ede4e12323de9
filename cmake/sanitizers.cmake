# Sanitizer and fuzzing flags for every target of the build (the project's own
# code and the generated protobuf code; system libraries stay uninstrumented).
# Used by scripts/sanitize.sh (build-asan, build-tsan) and scripts/fuzz.sh
# (build-fuzz); the normal build sets neither option and is unaffected.

if(KAPPA_SANITIZE)
  # Frame pointers give full stacks in reports; UBSan findings abort the test
  # instead of printing and carrying on, so ctest sees them as failures.
  add_compile_options(-fsanitize=${KAPPA_SANITIZE} -fno-omit-frame-pointer -g)
  add_link_options(-fsanitize=${KAPPA_SANITIZE})
  if(KAPPA_SANITIZE MATCHES "undefined")
    add_compile_options(-fno-sanitize-recover=undefined)
  endif()
endif()

if(KAPPA_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "KAPPA_FUZZ needs clang (libFuzzer); configure with -DCMAKE_CXX_COMPILER=clang++")
  endif()
  # Coverage feedback from every library the targets call into; only the
  # fuzz executables link libFuzzer's main (tests/fuzz/CMakeLists.txt).
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
