// mtrun: executes a plan.bin (runtime/train/train_loop.cpp); no MLIR or LLVM inside.
//
// The top-level handler: an exception that escapes the run (std::bad_alloc
// above all) ends it with one line that says what was being done and, for
// memory, what was needed and what this process may use, and exit status 1.
// Files are never half written (saves go through a staging directory or a
// temporary and a rename), so leaving this way keeps them whole. An
// exception on another thread, or one thrown through a noexcept function,
// ends in std::terminate: the same line, then status 1.
#include "runtime/base/activity.h"
#include "runtime/train/train_loop.h"

#include <cstdio>
#include <exception>
#include <unistd.h>

namespace {

void print_escaped() noexcept {
  try {
    std::string line = "mtrun: error: " + mt::rt::describe_escaped_exception() + "\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
  } catch (...) { // the line itself could not be built: no memory at all
    std::fputs("mtrun: error: out of memory (no more detail could be allocated)\n", stderr);
  }
  std::fflush(nullptr);
}

[[noreturn]] void on_terminate() noexcept {
  if (std::current_exception())
    print_escaped();
  else
    std::fputs("mtrun: internal error: std::terminate without an exception; please report it "
               "with the command line\n", stderr);
  std::fflush(nullptr);
  ::_exit(1);
}

} // namespace

int main(int argc, char **argv) {
  std::set_terminate(on_terminate);
  try {
    return mt::rt::mtrun_main(argc, argv);
  } catch (...) {
    print_escaped();
    return 1;
  }
}
