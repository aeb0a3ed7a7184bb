// main() of the CUDA kernel test binaries (simulator, sanitizer and mutant builds). Wide
// console lines: the simulator's errors stay on one line (the mutation test matches them).
// No signal handlers: a kernel that corrupts the heap would deadlock Catch2's handler in
// malloc; without it the crash ends the test at once.
#define CATCH_CONFIG_CONSOLE_WIDTH 300
#define CATCH_CONFIG_NO_POSIX_SIGNALS
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
