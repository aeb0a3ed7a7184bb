# cmake -DBIN=<mutant test binary> -DFILTER=<Catch2 filter> -DEXPECT=<regex> -DNAME=<mutant>
#       -P expect_caught.cmake
# Passes when the mutant's tests fail and their output matches EXPECT (how it must be caught).
execute_process(COMMAND ${BIN} ${FILTER} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err TIMEOUT 240)
set(all "${out}\n${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "CUDA kernel mutant ${NAME} survived: ${BIN} ${FILTER} passed")
endif()
if(NOT all MATCHES "${EXPECT}")
  message(FATAL_ERROR "CUDA kernel mutant ${NAME} failed (${rc}) but not as expected "
                      "(no match for '${EXPECT}'):\n${all}")
endif()
string(REGEX MATCH "[^\n]*(${EXPECT})[^\n]*" line "${all}")
message(STATUS "CUDA kernel mutant ${NAME} caught (exit ${rc}): ${line}")
