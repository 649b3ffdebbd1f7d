// Fuzz target: a checkpoint rank file (iter_0000001/mp_rank_00.mtckpt) through
// what mtrun --load and mtc reshard do with it: open the first rank's file
// from the tracker, check the saved layout against a plan, open the rank's
// file, check its parameters, read its metadata values and every tensor,
// then reshard it into the temporary directory. The plan is the seed plan
// the checkpoint seed was saved with ($MT_FUZZ_SEEDS/plan.bin).
//
// The CRC32Cs are recomputed before each load (ckpt_fixup.h), so mutations
// reach the checks behind them; test/checkpoint covers the CRC checks.
#include "fuzz/ckpt_fixup.h"
#include "fuzz/fuzz_common.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/ckpt/checkpoint_layout.h"
#include "runtime/plan/plan_reader.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <sys/stat.h>
#include <vector>

namespace {

std::unique_ptr<mt::rt::PlanFile> g_plan;
std::string g_plan_path, g_load, g_out;

void fail_harness(const std::string &msg) {
  std::fprintf(stderr, "fuzz_checkpoint: %s\n", msg.c_str());
  std::abort();
}

// An error is one line naming a file: of the load, the reshard's output or the plan.
void check_error(const std::string &err) {
  if (err.empty() || err.find('\n') != std::string::npos ||
      (err.find(mt::fuzz::temp_dir()) == std::string::npos &&
       err.find(g_plan_path) == std::string::npos))
    fail_harness("the error is not one line naming the file: '" + err + "'");
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  using namespace mt::rt;
  mt::fuzz::quiet_stdout();
  g_plan_path = mt::fuzz::seed_file("plan.bin");
  std::string err;
  g_plan = PlanFile::open(g_plan_path, &err);
  if (!g_plan)
    fail_harness("the seed plan does not load: " + err);
  g_load = mt::fuzz::temp_dir() + "/load";
  g_out = mt::fuzz::temp_dir() + "/out";
  ::mkdir(g_load.c_str(), 0755);
  ::mkdir((g_load + "/iter_0000001").c_str(), 0755);
  mt::fuzz::write_file(g_load + "/latest_checkpointed_iteration.txt", "1", 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace mt::rt;
  std::string file(reinterpret_cast<const char *>(data), size);
  mt::fuzz::fix_checkpoint_crcs(&file);
  mt::fuzz::write_file(g_load + "/iter_0000001/mp_rank_00.mtckpt", file.data(), file.size());

  const mt::plan::Plan &plan = *g_plan->plan();
  std::string err;
  auto first = CheckpointReader::open_first(g_load, -1, &err);
  if (!first) {
    check_error(err);
    return 0;
  }
  if (std::string e = check_saved_layout(*first, g_load, plan, g_plan_path); !e.empty())
    check_error(e);
  auto reader = CheckpointReader::open(g_load, first->meta().iteration, 0, 0, 1, &err);
  if (!reader) {
    check_error(err);
    return 0;
  }
  if (const mt::plan::Rank *rank = find_rank(plan, 0))
    (void)check_rank_params(*reader, plan, *rank, g_load, g_plan_path);
  int64_t v = 0;
  for (const char *key : {"optimizer_steps", "lr_scheduler_samples", "skipped_iterations",
                          "train_index_samples", "pp_size"})
    (void)reader->int_value(key, 0, kMaxCheckpointCount, 0, &v);
  // Every tensor, at the shape the file gives it, as f32 (the weights and
  // optimizer state) and, where that is refused, as the other dtypes.
  std::vector<char> buf;
  for (const std::string &name : reader->tensor_names()) {
    std::vector<int64_t> shape = reader->shape(name);
    uint64_t elems = 1;
    for (int64_t d : shape)
      elems = d > 0 && elems <= (uint64_t(1) << 26) / uint64_t(d) ? elems * uint64_t(d) : 0;
    for (const char *dtype : {"f32", "u64", "u8"}) {
      const size_t bytes = size_t(elems) * (dtype[0] == 'f' ? 4 : dtype[1] == '6' ? 8 : 1);
      buf.resize(bytes + 1);
      if (reader->read(name, dtype, shape, buf.data(), bytes).empty())
        break;
    }
  }
  reader.reset();
  first.reset();
  std::string summary;
  if (std::string e = reshard_checkpoint(g_load, -1, plan, g_plan_path, g_out, &summary);
      !e.empty())
    check_error(e);
  mt::fuzz::remove_tree(g_out, true);
  return 0;
}
