# Writes OUT, the header that gives --version mixtrain's version and commit,
# when its text changes: a build at the same commit recompiles nothing. Run at
# every build by the mix_build_info target (CMakeLists.txt) with SOURCE_DIR,
# OUT and VERSION set. A copy of the sources made by scripts/gpu_bundle.sh has
# no .git of its own and says its commit in .mix_commit; elsewhere git says it,
# or the commit is "unknown".
set(commit "unknown")
if(EXISTS "${SOURCE_DIR}/.mix_commit")
  file(STRINGS "${SOURCE_DIR}/.mix_commit" commit LIMIT_COUNT 1)
else()
  execute_process(COMMAND git -C "${SOURCE_DIR}" rev-parse --short=12 HEAD
    OUTPUT_VARIABLE head RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(rc EQUAL 0 AND head)
    set(commit "${head}")
    # Tracked files changed since that commit: the binary is not that commit's.
    execute_process(COMMAND git -C "${SOURCE_DIR}" diff --quiet HEAD RESULT_VARIABLE changed ERROR_QUIET)
    if(changed EQUAL 1)
      string(APPEND commit "+changes")
    endif()
  endif()
endif()
set(text "#pragma once\n// Written by cmake/build_info.cmake at build time.\n#define MIX_VERSION \"${VERSION}\"\n#define MIX_GIT_COMMIT \"${commit}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
