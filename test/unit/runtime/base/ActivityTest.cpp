// The activity a top-level handler reports (runtime/base/activity.h), and
// its line for each kind of escaped exception.
#include "runtime/base/activity.h"

#include <gtest/gtest.h>

#include <new>
#include <stdexcept>
#include <string>

namespace {

std::string line_for(void (*thrower)()) {
  try {
    thrower();
  } catch (...) {
    return mt::rt::describe_escaped_exception();
  }
  return "nothing thrown";
}

TEST(Activity, ScopesNestAndRestore) {
  mt::rt::set_activity("reading the plan p");
  {
    mt::rt::ActivityScope saving("saving the checkpoint", 1024, "the plan's state_bytes");
    EXPECT_EQ(mt::rt::current_activity().what, "saving the checkpoint");
    EXPECT_EQ(mt::rt::current_activity().bytes, 1024u);
  }
  EXPECT_EQ(mt::rt::current_activity().what, "reading the plan p");
  EXPECT_EQ(mt::rt::current_activity().bytes, 0u);
}

TEST(Activity, LinesForEscapedExceptions) {
  mt::rt::set_activity_speaker("rank 3: ");
  mt::rt::set_activity("training iteration 7", 3u << 20, "the plan's arena_bytes of rank 3");
  std::string oom = line_for([] { throw std::bad_alloc(); });
  EXPECT_EQ(oom.rfind("rank 3: out of memory while training iteration 7: a host allocation "
                      "failed (std::bad_alloc); this step needs at least 3145728 bytes (3.0 MiB, "
                      "the plan's arena_bytes of rank 3)",
                      0),
            0u)
      << oom;
  EXPECT_EQ(oom.find('\n'), std::string::npos);
  mt::rt::set_activity("loading the checkpoint in /ckpt");
  EXPECT_EQ(line_for([] { throw std::out_of_range("vector::_M_range_check"); }),
            "rank 3: internal error: an exception escaped while loading the checkpoint in /ckpt: "
            "vector::_M_range_check; please report it with the command line");
  EXPECT_EQ(line_for([] { throw 42; }),
            "rank 3: internal error: an exception of unknown type escaped while loading the "
            "checkpoint in /ckpt; please report it with the command line");
  mt::rt::set_activity_speaker("");
}

} // namespace
