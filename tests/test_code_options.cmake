# The test code itself at -O1 in optimised builds; what it tests (the libraries it links) keeps the
# build's own flags (-O3 in Release). SNAP_TEST_CODE_OPTIONS: the options; tests/CMakeLists.txt
# applies them to its whole directory, snap_test_code(<target>...) to the tests built elsewhere
# (tests/cuda's in kernels/cuda, host/ and emu/; tests/comm's in comm/), which compiled at -O3
# before: the three e2e device tests took ~20 s each (now built twice: the CUDA one and the host
# twin's, which the emulator's tests run too).
set(SNAP_TEST_CODE_OPTIONS "")
if(CMAKE_BUILD_TYPE MATCHES "^(Release|RelWithDebInfo|MinSizeRel)$")
  set(SNAP_TEST_CODE_OPTIONS $<$<COMPILE_LANGUAGE:CXX>:-O1>)
endif()
function(snap_test_code)
  foreach(t ${ARGN})
    target_compile_options(${t} PRIVATE ${SNAP_TEST_CODE_OPTIONS})
  endforeach()
endfunction()
