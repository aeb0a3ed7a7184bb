# The mutation test: each mutant is a seeded kernel bug applied to a scratch copy of one
# kernel source (extensions/src/cuda), compiled with the simulator into its own test binary;
# ctest cuda_sim/mutant/<name> runs the tests of the affected kernel and passes only when
# they fail in the expected way (a failed comparison or the simulator's or a sanitizer's
# own error). A pattern that no longer occurs exactly once fails the build, naming the mutant.
#
# loom_cuda_mutant(<name> <file in extensions/src/cuda> <Catch2 test filter> <expected output
#                  regex> <from> <to> [<from> <to>])
function(loom_cuda_mutant name file filter expect)
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/mutants/${name})
  set(spec_files "")
  set(i 4)
  set(n 0)
  while(i LESS ARGC)
    math(EXPR j "${i} + 1")
    math(EXPR n "${n} + 1")
    file(WRITE ${dir}/from${n}.txt "${ARGV${i}}")
    file(WRITE ${dir}/to${n}.txt "${ARGV${j}}")
    list(APPEND spec_files ${dir}/from${n}.txt ${dir}/to${n}.txt)
    math(EXPR i "${i} + 2")
  endwhile()
  set(mutated ${dir}/cuda/${file})
  add_custom_command(OUTPUT ${mutated}
    COMMAND ${CMAKE_COMMAND} -DSRC=${_ext}/src/cuda/${file} -DOUT=${mutated} -DSPEC=${dir}
            -DPAIRS=${n} -DNAME=${name} -P ${CMAKE_CURRENT_SOURCE_DIR}/apply_mutant.cmake
    DEPENDS ${_ext}/src/cuda/${file} ${spec_files} ${CMAKE_CURRENT_SOURCE_DIR}/apply_mutant.cmake
    COMMENT "CUDA kernel mutant ${name}")
  set_source_files_properties(${mutated} PROPERTIES HEADER_FILE_ONLY ON)  # included, not compiled
  set(target loom_cuda_mutant_${name})
  if(file STREQUAL "common.cuh")  # every kernel source includes it: recompile all three
    add_executable(${target} ${_kernel_tus} ${mutated})
    target_include_directories(${target} BEFORE PRIVATE ${dir})
  else()
    string(REGEX REPLACE "\\.cu$" "" stem ${file})
    file(GENERATE OUTPUT ${dir}/mutant_${stem}.cpp CONTENT "#include \"${mutated}\"\n")
    add_executable(${target} ${dir}/mutant_${stem}.cpp ${mutated})
    foreach(k ${_kernels})
      if(NOT k STREQUAL stem)
        target_sources(${target} PRIVATE $<TARGET_OBJECTS:loom_cuda_sim_${k}>)
      endif()
    endforeach()
  endif()
  loom_cuda_sim_setup(${target})
  target_compile_options(${target} PRIVATE -fsanitize=alignment -fno-sanitize-recover=alignment)
  target_link_options(${target} PRIVATE -fsanitize=alignment)
  target_link_libraries(${target} PRIVATE loom_cuda_sim)
  loom_cuda_sim_executable(${target})
  add_test(NAME cuda_sim/mutant/${name}
           COMMAND ${CMAKE_COMMAND} -DBIN=$<TARGET_FILE:${target}> -DFILTER=${filter}
                   -DEXPECT=${expect} -DNAME=${name}
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/expect_caught.cmake)
  set_tests_properties(cuda_sim/mutant/${name} PROPERTIES TIMEOUT 300)
endfunction()

set(_failed "FAILED")                   # a comparison with the references failed
set(_sim "cuda_sim: kernel")            # the simulator's own error

loom_cuda_mutant(barrier_before_scratch_write common.cuh "[softmax]" "${_failed}"
[==[  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;]==]
[==[  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;]==])

loom_cuda_mutant(barrier_after_scratch_write common.cuh "[layer_norm]" "${_failed}"
[==[  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;]==]
[==[  if (lane == 0) scratch[warp] = v;
  v = lane < warps ? scratch[lane] : 0.0f;]==])

loom_cuda_mutant(shuffle_offset common.cuh "[layer_norm]" "${_failed}"
[==[  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);]==]
[==[  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);]==])

loom_cuda_mutant(half_mask common.cuh "[softmax]" "${_sim}.*(outside the mask|does not name)"
[==[v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));]==]
[==[v = fmaxf(v, __shfl_xor_sync(0x0000ffffu, v, o));]==])

loom_cuda_mutant(overlapping_shared_slots common.cuh "[layer_norm]" "${_failed}"
[==[    scratch[32 + warp] = b;]==]
[==[    scratch[1 + warp] = b;]==]
[==[  b = lane < warps ? scratch[32 + lane] : 0.0f;]==]
[==[  b = lane < warps ? scratch[1 + lane] : 0.0f;]==])

loom_cuda_mutant(causal_off_by_one softmax.cu "[softmax]" "${_failed}"
[==[q + (sk - sq) + 1)]==]
[==[q + (sk - sq) + 2)]==])

# (block_sum shuffles before its barrier: the returned lanes are missed there first)
loom_cuda_mutant(early_return_before_barrier layer_norm.cu "[layer_norm]"
                 "${_sim}.*(a barrier every live thread must reach|returns while lane|has exited)"
[==[  const float mu = kRms ? 0.0f : block_sum(sum, scratch) / static_cast<float>(cols);]==]
[==[  if (threadIdx.x >= packs) return;
  const float mu = kRms ? 0.0f : block_sum(sum, scratch) / static_cast<float>(cols);]==])

loom_cuda_mutant(vector_path_misaligned layer_norm.cu "[layer_norm]" "misaligned address"
[==[  const bool vector = cols % kPack == 0 && aligned16(x) && aligned16(y) && aligned16(gamma) &&
                      (kRms || aligned16(beta));]==]
[==[  const bool vector = cols % kPack == 0;]==])

# paged_attention: each query misses its own key (an off-by-one in the causal limit).
loom_cuda_mutant(paged_causal_off_by_one paged_attention.cu "[paged_attention]" "${_failed}"
[==[const int64_t visible = lens[r] - n + i + 1;]==]
[==[const int64_t visible = lens[r] - n + i;]==])

# paged_attention's flat form: a query at the first slot of its row is given the row before.
loom_cuda_mutant(paged_flat_row_search paged_attention.cu "[paged_attention]" "${_failed}"
[==[if (starts[mid] <= i) lo = mid;]==]
[==[if (starts[mid] < i) lo = mid;]==])

# RMSNorm (layer_norm.cu's kRms instances): the mean is subtracted (LayerNorm's statistic).
loom_cuda_mutant(rms_norm_subtracts_mean layer_norm.cu "[rms_norm]" "${_failed}"
[==[  const float mu = kRms ? 0.0f : block_sum(sum, scratch) / static_cast<float>(cols);]==]
[==[  const float mu = block_sum(sum, scratch) / static_cast<float>(cols);]==])

# rotary: every row reads the first batch row's tables (as if the tables were shared).
loom_cuda_mutant(rotary_table_batch rotary.cu "[rotary]" "${_failed}"
[==[    const T* c = cos + b * table_batch_stride + s * r;]==]
[==[    const T* c = cos + s * r;]==])

# swiglu: the sigmoid's derivative σ(1 − σ) taken as σ².
loom_cuda_mutant(swiglu_gate_derivative swiglu.cu "[swiglu]" "${_failed}"
[==[d * u * sg * (1.0f + g * (1.0f - sg))]==]
[==[d * u * sg * (1.0f + g * sg)]==])
