// A pipelined train_step from its compact form (one micro-batch's program,
// Program.pipeline) to the form the executors run: the whole step's
// schedule, unrolled over every micro-batch.
//
// mtc writes each pipeline stage's train_step once, for one micro-batch, cut
// into segments (plan.fbs PipelineSchedule), so its compile time and plan do
// not grow with the micro-batch count. mtrun expands it at load: the step
// runs the segments in Megatron-LM's order (runtime/base/pipeline_order.h),
// each for one micro-batch m, and that copy of an instruction
//   - reads and writes micro-batch m's copy of each value with
//     slot_offsets (slot m % slots),
//   - sends and receives with tag ints[1] + m * tag_stride (SEND, RECV),
//   - draws its dropout masks from micro-batch m's RNG offset
//     (micro_batch = m),
//   - runs only for m == 0 (runs_in FIRST) or m == M - 1 (LAST) when it
//     says so.
// The result is the program in the unrolled form (unrolled_micro_batches
// M; inputs and outputs named "tokens.0", "loss.3", ...), so the executors
// and the training loop run it as any unrolled step.
#ifndef MT_RUNTIME_PLAN_PIPELINE_EXPAND_H
#define MT_RUNTIME_PLAN_PIPELINE_EXPAND_H

#include "plan_generated.h"
#include "runtime/base/pipeline_order.h"

#include <string>
#include <vector>

namespace mt::rt {

// The segment keys of a schedule, in its order (for expand_pipeline).
std::vector<SegmentKey> segment_keys(const mt::plan::PipelineSchedule &schedule);

// Checks a program that has a `pipeline` against itself: the schedule's
// fields, segments that cover the instructions contiguously in order, an
// order expand_pipeline accepts, slot_offsets (ARENA values only, slot 0 at
// `offset`, exactly micro_batches slots on every input and output), runs_in,
// micro_batch -1, SEND/RECV tags that stay in range. Returns "" and the
// step's order in *order, or one line that names the field ("pipeline.
// segments[3] begins at ..."). The plan verifier adds what needs the plan
// (stages, rank, micro-batch count, arena bounds).
std::string check_pipeline_schedule(const mt::plan::Program &program,
                                    std::vector<ScheduledSegment> *order);

// The unrolled program of `compact` (which has a `pipeline`), in a buffer
// of its own whose root is a mt::plan::Program
// (flatbuffers::GetRoot<mt::plan::Program>(buffer.data())). Values keep
// their indices (slot 0); each value with S slots gains S - 1 values after
// them, for slots 1 to S - 1. Returns an empty buffer and sets *error to one
// line starting "program NAME: " when `compact` is inconsistent.
// `micro_batches` > 0 expands a step of that many micro-batches instead of
// the schedule's own (a batch-size ramp-up's smaller steps): at most the
// planned count, one the schedule accepts (interleaved: a multiple of the
// stages), whose order is the planned one's restricted to its micro-batches
// (check_restriction), so that the planned arena and slots hold it.
flatbuffers::DetachedBuffer expand_pipeline_program(const mt::plan::Program &compact,
                                                    std::string *error,
                                                    int64_t micro_batches = 0);

// A rank's programs as the executors run them: the plan's own, except that
// a compact train_step is replaced by its expansion, whose bytes this holds
// (keep it alive as long as the programs are used).
class RankPrograms {
public:
  // "" or one line naming the rank and the program that does not expand.
  std::string load(const mt::plan::Rank &rank);
  const std::vector<const mt::plan::Program *> &all() const { return programs_; }
  // The program named `name`, or null.
  const mt::plan::Program *find(const std::string &name) const;
  // `name` expanded for a step of `micro_batches` micro-batches (a ramp-up's
  // smaller batch): find(name) when it is not pipelined or has that count;
  // else its expansion for that count, held until the next such call for
  // another count (which invalidates it). Null and *error on failure.
  const mt::plan::Program *for_micro_batches(const std::string &name, int64_t micro_batches,
                                             std::string *error);

private:
  const mt::plan::Rank *rank_ = nullptr;
  flatbuffers::DetachedBuffer resized_;
  const mt::plan::Program *resized_program_ = nullptr;
  int64_t resized_micro_batches_ = 0;
  std::string resized_name_;
  std::vector<flatbuffers::DetachedBuffer> expanded_;
  std::vector<const mt::plan::Program *> programs_;
};

} // namespace mt::rt

#endif // MT_RUNTIME_PLAN_PIPELINE_EXPAND_H
