// main() of every test binary: a child started by loom::test::run_ranks runs its worker;
// otherwise Catch2 runs the test cases.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "harness/multiprocess.h"

int main(int argc, char** argv) {
  int worker_status = loom::test::run_worker_if_requested();
  if (worker_status >= 0) return worker_status;
  return Catch::Session().run(argc, argv);
}
