// What the process is doing now ("loading the checkpoint in /ckpt",
// "training iteration 12"), kept so that the one line mtrun's top-level
// handler prints when an exception escapes (std::bad_alloc above all) says
// what failed, not only how. Setting it is cheap: a mutex and a string copy.
#ifndef MT_RUNTIME_ACTIVITY_H
#define MT_RUNTIME_ACTIVITY_H

#include <cstdint>
#include <string>

namespace mt::rt {

// Who is speaking, for lines of several ranks: "rank 1: " (or "").
void set_activity_speaker(const std::string &speaker);
std::string activity_speaker();

// `what` reads after "while": "loading the plan plan.bin". `bytes` is the
// host memory the step is known to need (0: not known), `source` where that
// figure comes from ("the plan's arena_bytes of rank 0").
//
// Test hook (compiled in where MT_TEST_HOOKS is defined, the CMake option
// of that name): with MT_TEST_BAD_ALLOC_AT=PREFIX in the environment, an
// activity starting with PREFIX throws std::bad_alloc once it is set, so
// that tests reach the top-level handler at a known step. Only the
// environment arms it, never a plan or a flag.
void set_activity(const std::string &what, uint64_t bytes = 0, const std::string &source = "");

struct Activity {
  std::string what;
  uint64_t bytes = 0;
  std::string source;
};
Activity current_activity();

// Sets an activity for a scope and puts the previous one back after it.
class ActivityScope {
public:
  explicit ActivityScope(const std::string &what, uint64_t bytes = 0,
                         const std::string &source = "");
  ~ActivityScope();
  ActivityScope(const ActivityScope &) = delete;
  ActivityScope &operator=(const ActivityScope &) = delete;

private:
  Activity saved_;
};

// This process's host memory limits, for errors about a failed
// allocation: "this process may map at most 300.0 MiB (ulimit -v) and maps
// 210.3 MiB; the machine has 20.1 GiB available" (the parts that apply; ""
// when none does). `limited` tells whether an address-space limit is set.
std::string host_memory_limits(bool *limited = nullptr);

// Bytes as "1.5 GiB" or "300.0 MiB".
std::string bytes_text(uint64_t n);

// The line for an exception that escaped to a top-level handler, without
// the tool's prefix: for std::bad_alloc, "out of memory while WHAT: ..."
// with the known need and this process's limits (ulimit -v, the machine's
// available memory); otherwise "internal error: ... escaped while WHAT".
// Call it inside a catch block (it looks at the current exception).
std::string describe_escaped_exception();

} // namespace mt::rt

#endif // MT_RUNTIME_ACTIVITY_H
