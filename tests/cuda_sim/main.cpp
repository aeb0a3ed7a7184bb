// main() of the CUDA kernel test binaries (simulator, sanitizer and mutant builds). Wide
// console lines: the simulator's errors stay on one line (the mutation test matches them).
#define CATCH_CONFIG_CONSOLE_WIDTH 300
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
