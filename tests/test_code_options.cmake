# snap_test_code(<target>...): a test's own code at -O1 in optimised builds, as tests/CMakeLists.txt
# does for every target under tests/ (directory scope). The tests built elsewhere (tests/cuda's in
# kernels/cuda, host/ and emu/; tests/comm's in comm/) compiled at the build's -O3 instead: the
# three e2e device tests took ~20 s each, built three times. What a test calls (the libraries it
# links) keeps the build's own flags; only the test's sources change.
function(snap_test_code)
  if(CMAKE_BUILD_TYPE MATCHES "^(Release|RelWithDebInfo|MinSizeRel)$")
    foreach(t ${ARGN})
      target_compile_options(${t} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O1>)
    endforeach()
  endif()
endfunction()
