// Whether a plan's communication between pipeline stages completes under
// NCCL's rules, checked before anything runs.
//
// The CPU executor's point-to-point messages are buffered and tagged, so any
// order in which the stages send and receive works there. On GPUs every
// operation of a rank is issued on one CUDA stream, in program order, and
// NCCL's are stricter:
//   - messages between two ranks match by order (no tags): the k-th send
//     from a to b is the k-th receive at b from a, and must have its size;
//   - a send or receive completes only while its partner is posted (a
//     rendezvous; NCCL buffers small messages, but nothing may rely on it);
//   - the executor issues a run of adjacent SEND/RECV instructions as one
//     NCCL group: every operation in it is posted at once and the stream
//     moves on when all of them have completed;
//   - a collective over ranks of several stages (the pipeline and model-
//     parallel groups) completes when every member has reached it.
// Within a stage, the tensor- and data-parallel ranks run the same programs
// and exchange only with their own counterparts in other stages, so one
// rank per stage stands for all of them.
//
// check_comm_order replays every program of the plan under these rules, one
// stage per pipeline rank, and reports the first way it would fail: a
// mismatched pair of messages, or a point where the stages would wait on
// each other for ever. mtc runs it on every plan it writes.
#ifndef MT_RUNTIME_COMM_ORDER_H
#define MT_RUNTIME_COMM_ORDER_H

#include "plan_generated.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mt::rt {

// A SEND or RECV instruction that the GPU executor runs over NCCL (its one
// GPU step is NATIVE); adjacent ones are issued as one NCCL group.
bool issued_as_p2p(const mt::plan::Instruction &ins);

// The group (plan numbering: 0 dp, 1 tp, 2 pp, 3 mp) over which an
// instruction's NATIVE step runs a collective (ALL_REDUCE, SEQ_*, the
// gradient reductions and the parameter gather name it in ints[0]); -1 for
// any other instruction.
int native_collective_group(const mt::plan::Instruction &ins);

// One stage's communication in one program, in stream order.
struct CommOp {
  bool send = false;
  int peer = 0;        // pipeline rank
  int64_t tag = 0;     // the plan's tag (the CPU executor's; NCCL has none)
  uint64_t bytes = 0;
};
struct CommEvent {
  // P2P: `ops` posted together (an NCCL group). COLLECTIVE: one collective
  // over `group` (plan group number) of `bytes`.
  enum Kind { P2P, COLLECTIVE } kind = P2P;
  std::vector<CommOp> ops;
  int group = -1;
  uint64_t bytes = 0;
  uint32_t instruction = 0; // the (first) instruction that issues it
  int32_t micro_batch = -1; // the micro-batch it runs for (Instruction.micro_batch)
};

// The events of `program` as the GPU executor issues them; collectives over
// groups inside one stage (tensor, data parallel) are left out. A compact
// pipelined train_step (Program.pipeline) gives the events of its expansion
// (runtime/plan/pipeline_expand.h), found without building it: the
// schedule's segments for each micro-batch, their communicating
// instructions only, tags as the expansion sets them; `instruction` is then
// the compact program's index. A schedule that does not expand gives none
// (check_comm_order reports it).
std::vector<CommEvent> comm_events(const mt::plan::Rank &rank, const mt::plan::Program &program);

// The replay over given events: events[s] is pipeline rank s's. Returns ""
// or one line naming the stages, their instructions and what they wait for;
// `where(s, event)` describes the instruction that issues one of stage s's
// events.
std::string check_comm_events(const std::vector<std::vector<CommEvent>> &events,
                              const std::function<std::string(int, const CommEvent &)> &where);

// Every program of `plan`, each stage represented by its rank with tp and
// dp rank 0. "" or one line saying which program fails and how.
std::string check_comm_order(const mt::plan::Plan &plan);

} // namespace mt::rt

#endif // MT_RUNTIME_COMM_ORDER_H
