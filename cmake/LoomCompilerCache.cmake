# ccache for C++ and CUDA when available. The sloppiness settings let ccache cache
# translation units that use the precompiled header.
find_program(LOOM_CCACHE ccache)
if(LOOM_CCACHE)
  set(_launcher ${CMAKE_COMMAND} -E env
      CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      CCACHE_BASEDIR=${CMAKE_SOURCE_DIR}
      CCACHE_MAXSIZE=5G ${LOOM_CCACHE})
  set(CMAKE_C_COMPILER_LAUNCHER ${_launcher})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${_launcher})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${_launcher})
endif()
