// Fuzz target: plan.bin through the loader mtrun and mtc reshard use
// (PlanFile::from_bytes, the same code as PlanFile::open after reading the
// file): header, FlatBuffers verifier, semantic and training checks. A
// plan it accepts then goes through what every rank computes from it
// before training: its rank tables, the NCCL order check, the checkpoint
// file names and the parameter and shard layouts.
//
// The header's payload checksum is recomputed before the load, so that a
// mutation reaches the checks behind it rather than stopping at "checksum
// mismatch" (that check is a compare of two numbers, tested by
// test/mtrun/plan-errors.test). The rest of the header stays as mutated.
#include "fuzz/fuzz_common.h"
#include "runtime/ckpt/checkpoint_layout.h"
#include "runtime/comm/comm_order.h"
#include "runtime/plan/plan_reader.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace mt::rt;
  std::string bytes(reinterpret_cast<const char *>(data), size);
  auto *p = reinterpret_cast<uint8_t *>(bytes.data());
  if (size >= kPlanHeaderSize && std::memcmp(p, "MTPLAN", 6) == 0 &&
      mt::fuzz::get_u64(p + 16) == size - kPlanHeaderSize)
    mt::fuzz::put_u64(p + 24, plan_checksum(p + kPlanHeaderSize, size - kPlanHeaderSize));
  std::string err;
  std::unique_ptr<PlanFile> file = PlanFile::from_bytes(std::move(bytes), "fuzz.plan", &err);
  if (!file) {
    if (err.rfind("fuzz.plan: error: ", 0) != 0 || err.find('\n') != std::string::npos) {
      std::fprintf(stderr, "fuzz_plan: the error is not one line naming the file: '%s'\n",
                   err.c_str());
      std::abort();
    }
    return 0;
  }
  const mt::plan::Plan &plan = *file->plan();
  (void)check_comm_order(plan);
  (void)checkpoint_files_of(plan);
  for (int r = 0; r < plan.world_size(); ++r) {
    const mt::plan::Rank *rank = find_rank(plan, r);
    if (!rank)
      continue;
    (void)param_layout(*rank);
    (void)shard_layout(plan, *rank);
  }
  return 0;
}
