# cmake -DSRC=<kernel source> -DOUT=<mutated copy> -DSPEC=<dir with from<i>.txt, to<i>.txt>
#       -DPAIRS=<count> -DNAME=<mutant> -P apply_mutant.cmake
# Each from<i> must occur exactly once in SRC; it is replaced by to<i>.
file(READ ${SRC} text)
foreach(i RANGE 1 ${PAIRS})
  file(READ ${SPEC}/from${i}.txt from)
  file(READ ${SPEC}/to${i}.txt to)
  string(FIND "${text}" "${from}" first)
  string(FIND "${text}" "${from}" last REVERSE)
  if(first EQUAL -1 OR NOT first EQUAL last)
    message(FATAL_ERROR "CUDA kernel mutant ${NAME}: pattern ${i} must occur exactly once in "
                        "${SRC} (the kernel changed? update tests/cuda_sim/mutants.cmake):\n"
                        "${from}")
  endif()
  string(REPLACE "${from}" "${to}" text "${text}")
endforeach()
file(WRITE ${OUT} "${text}")
