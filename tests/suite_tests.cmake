# Writes one ctest entry per GoogleTest suite of a test program (run with cmake -P after the
# program is linked; see tests/CMakeLists.txt). The sanitized tree uses it instead of
# gtest_discover_tests: a sanitized process costs about 0.1 s to start and to check for leaks
# at exit, so ~960 one-test processes spent a quarter of that pass starting and stopping.
#   -D PROGRAM=<test program> -D OUTPUT=<ctest file to write> -D LABEL=<label>
#   -D TIMEOUT=<seconds per suite> -D ENVIRONMENT=<VAR=value>
execute_process(COMMAND "${PROGRAM}" --gtest_list_tests OUTPUT_VARIABLE listing RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} --gtest_list_tests failed (${rc}):\n${listing}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(script "")
foreach(line IN LISTS lines)
  # Suites are the unindented lines ("Fixtures/GoldenTest.  # TypeParam ..."); tests are indented.
  if(line MATCHES "^([^ #][^ ]*)\\.")
    set(suite "${CMAKE_MATCH_1}")
    string(APPEND script
      "add_test([=[${suite}]=] [=[${PROGRAM}]=] [=[--gtest_filter=${suite}.*]=])\n"
      "set_tests_properties([=[${suite}]=] PROPERTIES LABELS [=[${LABEL}]=] TIMEOUT ${TIMEOUT} "
      "ENVIRONMENT [=[${ENVIRONMENT}]=])\n")
  endif()
endforeach()
file(WRITE "${OUTPUT}" "${script}")
