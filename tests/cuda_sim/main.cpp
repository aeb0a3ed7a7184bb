// main() of the CUDA kernel test binaries (simulator, sanitizer and mutant builds).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
