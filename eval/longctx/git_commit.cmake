# The snapserve git commit, compiled into eval records. Included from the root
# CMakeLists.txt it defines target snap_git_commit, which runs this file as a script at
# every build; the script writes <build>/generated/snap_git_commit.h only when the commit
# (with "-dirty" for uncommitted changes to tracked files) changed, so nothing else rebuilds.
if(CMAKE_SCRIPT_MODE_FILE)
  execute_process(COMMAND git -C "${SRC}" rev-parse HEAD OUTPUT_VARIABLE commit
                  OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc ERROR_QUIET)
  if(NOT rc EQUAL 0 OR commit STREQUAL "")
    set(commit "unknown")
  else()
    execute_process(COMMAND git -C "${SRC}" diff --quiet HEAD RESULT_VARIABLE dirty ERROR_QUIET)
    if(dirty EQUAL 1)
      string(APPEND commit "-dirty")
    endif()
  endif()
  file(WRITE "${OUT}.tmp" "#pragma once\n#define SNAP_GIT_COMMIT \"${commit}\"\n")
  execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different "${OUT}.tmp" "${OUT}")
  file(REMOVE "${OUT}.tmp")
else()
  set(snap_git_commit_header ${CMAKE_BINARY_DIR}/generated/snap_git_commit.h)
  add_custom_target(snap_git_commit
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/generated
    COMMAND ${CMAKE_COMMAND} -DSRC=${CMAKE_SOURCE_DIR} -DOUT=${snap_git_commit_header}
            -P ${CMAKE_SOURCE_DIR}/eval/longctx/git_commit.cmake
    BYPRODUCTS ${snap_git_commit_header}
    COMMENT "snapserve git commit -> generated/snap_git_commit.h")
  add_dependencies(snap_eval_longctx snap_git_commit)
  target_include_directories(snap_eval_longctx PRIVATE ${CMAKE_BINARY_DIR}/generated)
endif()
