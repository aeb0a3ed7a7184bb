# LibTorch from the pip wheel: the prefix comes from torch.utils.cmake_prefix_path of the
# interpreter in LOOM_PYTHON (default: the project's .venv, made by tools/setup.sh).
# Torch's CMake config resets CMAKE_CUDA_ARCHITECTURES, so the architectures are set
# before and again after find_package(Torch).
set(LOOM_CUDA_ARCHS "80;90" CACHE STRING "CUDA architectures compiled for (sm_80 A100, sm_90 H100/H200)")

if(NOT LOOM_PYTHON)
  if(EXISTS ${CMAKE_SOURCE_DIR}/.venv/bin/python)
    set(LOOM_PYTHON ${CMAKE_SOURCE_DIR}/.venv/bin/python)
  else()
    find_program(LOOM_PYTHON NAMES python3 python REQUIRED)
  endif()
endif()
execute_process(
  COMMAND ${LOOM_PYTHON} -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
  OUTPUT_VARIABLE _torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE _torch_rc ERROR_QUIET)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "Loom: cannot import torch with ${LOOM_PYTHON}; run tools/setup.sh first "
                      "or pass -DLOOM_PYTHON=/path/to/python with torch installed")
endif()
list(APPEND CMAKE_PREFIX_PATH ${_torch_prefix})
get_filename_component(LOOM_TORCH_SITE ${_torch_prefix}/../../.. ABSOLUTE)   # .../site-packages

if(LOOM_WITH_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_ARCHITECTURES ${LOOM_CUDA_ARCHS})
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
  else()
    message(WARNING "Loom: nvcc not found, building without CUDA kernels")
    set(LOOM_WITH_CUDA OFF)
  endif()
endif()

# Torch's config adds -gencode flags for TORCH_CUDA_ARCH_LIST to every CUDA target; derive it
# from LOOM_CUDA_ARCHS (80 -> 8.0, 90a -> 9.0a) so that a one-architecture build (the GPU
# bring-up's -DLOOM_CUDA_ARCHS=90) compiles the kernels once, not for sm_80 as well.
set(TORCH_CUDA_ARCH_LIST "")
foreach(_arch IN LISTS LOOM_CUDA_ARCHS)
  string(REGEX REPLACE "^([0-9]+)([0-9])([a-z]?)$" "\\1.\\2\\3" _torch_arch "${_arch}")
  list(APPEND TORCH_CUDA_ARCH_LIST "${_torch_arch}")
endforeach()
unset(CMAKE_CUDA_ARCHITECTURES)   # torch's config warns when it is set; restored below
find_package(Torch REQUIRED)
set(CMAKE_CUDA_ARCHITECTURES ${LOOM_CUDA_ARCHS})
# Torch exports its flags through TORCH_CXX_FLAGS; the imported targets already carry them.

# c10d: the Gloo classes only exist with USE_C10D_GLOO; NCCL's with USE_C10D_NCCL and nccl.h
# (shipped by the nvidia-nccl wheel, or in the CUDA toolkit).
add_library(loom_torch INTERFACE)
target_link_libraries(loom_torch INTERFACE ${TORCH_LIBRARIES})
# The wheel ships fmt 12 headers (torch/include/fmt) but not its library, and they shadow
# Debian's fmt 9 in every torch translation unit: use them header-only there.
target_compile_definitions(loom_torch INTERFACE USE_C10D_GLOO FMT_HEADER_ONLY)
if(LOOM_WITH_CUDA AND TARGET torch_cuda)
  find_path(LOOM_NCCL_INCLUDE nccl.h
            HINTS ${LOOM_TORCH_SITE}/nvidia/nccl/include /usr/local/cuda/include)
  if(LOOM_NCCL_INCLUDE)
    target_compile_definitions(loom_torch INTERFACE USE_C10D_NCCL LOOM_HAVE_NCCL)
    target_include_directories(loom_torch SYSTEM INTERFACE ${LOOM_NCCL_INCLUDE})
  endif()
endif()
message(STATUS "Loom: torch ${Torch_VERSION} from ${_torch_prefix}; CUDA ${LOOM_WITH_CUDA} (${LOOM_CUDA_ARCHS})")
