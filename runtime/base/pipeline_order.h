// Megatron-LM's pipeline schedules, shared by the compiler (mt-schedule-pp,
// mt-plan-memory, the order proof) and the runtime, which expands a
// pipelined train_step from the plan's compact description: one micro-batch's
// program cut into segments (a chunk's forward or backward, or for the
// interleaved schedule its receives, computation and sends), and the order in
// which a rank runs them for every micro-batch of a step.
#ifndef MT_RUNTIME_BASE_PIPELINE_ORDER_H
#define MT_RUNTIME_BASE_PIPELINE_ORDER_H

#include <cstdint>
#include <string>
#include <vector>

namespace mt::rt {

// One forward or backward of one micro-batch through one model chunk. Steps
// of one `unit` run back to back between two exchanges with the neighbouring
// stages (interleaved schedule: a warm-up forward, a steady forward and
// backward pair, a cool-down backward).
struct PipelineStep {
  bool forward = true;
  int64_t micro_batch = 0, chunk = 0, unit = 0;
};

// Megatron-LM's order for pipeline rank `rank` of `pp`, with `vp` model
// chunks per rank and `m` micro-batches (schedules.py:
// forward_backward_pipelining_without_interleaving, and _with_interleaving
// when vp > 1, which needs m % pp == 0).
std::vector<PipelineStep> pipeline_order(int64_t pp, int64_t vp, int64_t rank, int64_t m);

// Which instructions of a (forward or backward, chunk) a segment holds: all
// of them in program order (1F1B), or, for the interleaved schedule's
// exchanges, its receives, its computation or its sends.
enum class SegmentPart : uint8_t { All = 0, Recv = 1, Compute = 2, Send = 3 };

struct SegmentKey {
  bool forward = true;
  int64_t chunk = 0;
  SegmentPart part = SegmentPart::All;
};

// One segment run for one micro-batch.
struct ScheduledSegment {
  int32_t segment = 0;
  int32_t micro_batch = 0;
};

// The whole step of rank `rank` as the segments `segments` run, in order.
// 1F1B (vp == 1): each step's (forward, chunk, All) segment. Interleaved:
// the first unit's receives, then per unit its steps' computation, their
// sends and the next unit's receives (Megatron's exchange after each unit),
// which needs Recv/Compute/Send segments. A (forward, chunk, part) with no
// segment has no instructions and is skipped. Returns an empty list and sets
// *error when the arguments do not describe a schedule.
std::vector<ScheduledSegment> expand_pipeline(int64_t pp, int64_t vp, int64_t rank, int64_t m,
                                              const std::vector<SegmentKey> &segments,
                                              std::string *error);

// Whether `fewer`, the step of `micro_batches` micro-batches, runs exactly
// the segments that `full` (a step of more) runs for micro-batches below
// `micro_batches`, in the same order. Then every two values that live at
// once in the shorter step live at once in the longer one, so a memory
// plan of the longer step (its slots restricted to the first micro-batches)
// holds the shorter one: a batch ramp-up's smaller steps run inside the
// arena planned for the full batch. Megatron's 1F1B and interleaved
// schedules have this property for every count they accept; the compiler
// checks it for each count a ramp-up reaches and mtrun before it runs one.
// Returns "" or one line naming the first step where they differ.
std::string check_restriction(const std::vector<ScheduledSegment> &full,
                              const std::vector<ScheduledSegment> &fewer, int64_t micro_batches);

// The most micro-batches of chunk `chunk` whose forward has run and whose
// backward has not, over the step (what the memory report states).
int64_t micro_batches_in_flight(const std::vector<PipelineStep> &order, int64_t chunk);

} // namespace mt::rt

#endif // MT_RUNTIME_BASE_PIPELINE_ORDER_H
