// Fuzz target: the tracker file latest_checkpointed_iteration.txt, read as
// mtrun --load reads it (checkpoint_exists, checkpoint_contents, then
// CheckpointReader::open_first and open from the tracker) in a load
// directory that holds the seed checkpoint's iter_0000001 ($MT_FUZZ_SEEDS/
// ckpt), so a tracker that names it opens a real rank file.
#include "fuzz/fuzz_common.h"
#include "runtime/ckpt/checkpoint.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace {

std::string g_load;

void check_error(const std::string &err) {
  if (err.empty() || err.find('\n') != std::string::npos || err.find(g_load) == std::string::npos) {
    std::fprintf(stderr, "fuzz_tracker: the error is not one line naming the load: '%s'\n",
                 err.c_str());
    std::abort();
  }
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  mt::fuzz::quiet_stdout();
  g_load = mt::fuzz::temp_dir() + "/load";
  const std::string seed = mt::fuzz::seed_file("ckpt/iter_0000001/mp_rank_00.mtckpt");
  std::filesystem::create_directories(g_load + "/iter_0000001");
  std::filesystem::copy_file(seed, g_load + "/iter_0000001/mp_rank_00.mtckpt");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace mt::rt;
  mt::fuzz::write_file(g_load + "/latest_checkpointed_iteration.txt", data, size);
  if (!checkpoint_exists(g_load))
    std::abort(); // the harness just wrote it
  (void)checkpoint_contents(g_load);
  std::string err;
  auto first = CheckpointReader::open_first(g_load, -1, &err);
  if (!first) {
    check_error(err);
    return 0;
  }
  auto reader = CheckpointReader::open(g_load, -1, 0, 0, 1, &err);
  if (!reader)
    check_error(err);
  return 0;
}
