// plan.bin's container and its verification: nothing in a plan is used before
// every index, offset and operand signature in it has been checked.
//
// File layout (little-endian), then the FlatBuffer of plan.fbs:
//   offset  0  char[8]  magic "MTPLAN\0\0"
//   offset  8  u32      format version (kPlanFormatVersion)
//   offset 12  u32      flags, 0 (no flag is defined)
//   offset 16  u64      payload size in bytes
//   offset 24  u64      payload checksum: 64-bit FNV-1a over the payload bytes
//                       (offset basis 0xcbf29ce484222325, prime 0x100000001b3)
//   offset 32  payload  the FlatBuffer, file identifier "MTPL"
// The header size keeps the payload 8-byte aligned for the FlatBuffers
// verifier.
#ifndef MT_RUNTIME_PLAN_READER_H
#define MT_RUNTIME_PLAN_READER_H

#include "plan_generated.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mt::rt {

// Bump whenever plan.fbs or the header changes meaning.
constexpr uint32_t kPlanFormatVersion = 18;
constexpr size_t kPlanHeaderSize = 32;
// Every persistent-state offset of a Param is a multiple of this.
constexpr uint64_t kStateAlignment = 64;

// The checksum stored in the header (64-bit FNV-1a).
uint64_t plan_checksum(const uint8_t *data, size_t size);

// The header of a finished FlatBuffer payload; the file is the header, then
// the payload (mtc writes the two without copying the payload).
std::string plan_header(const uint8_t *payload, size_t size);

// The header and the payload in one string (tests, in-memory plans).
std::string wrap_plan_payload(const uint8_t *payload, size_t size);

// Bytes per element of a dtype as the plan (and the GPU) stores it.
size_t element_bytes(mt::plan::DType dtype);
// F32, BF16 or F16 (not F64, which only the MoE router's operands take).
bool is_float_dtype(mt::plan::DType dtype);
// Product of the dimensions (1 for a scalar shape []). Only meaningful on a
// verified plan, where every dimension is non-negative and the product fits.
int64_t element_count(const flatbuffers::Vector<int64_t> *shape);
inline int64_t element_count(const mt::plan::Value &v) { return element_count(v.shape()); }
// element_count * element_bytes: the value's size in the plan's address space.
uint64_t plan_bytes(const mt::plan::Value &v);
// "MATMUL", or "opcode 417" for a number the schema does not know.
std::string opcode_name(mt::plan::Opcode op);
// An instruction in messages: "#57 (decoder.layers.1 mt.attention) ATTENTION".
std::string instruction_label(const mt::plan::Instruction &ins, size_t index);
// A value in messages: "%tokens", or "%12" for an unnamed value (v may be null).
std::string value_label(const mt::plan::Value *v, uint32_t index);
// The Rank table for `rank`, or null.
const mt::plan::Rank *find_rank(const mt::plan::Plan &plan, int rank);
// Expert data parallel: tensor_parallel x data_parallel /
// (expert_model_parallel x expert_tensor_parallel) (the reader checks it
// divides; 1 for sizes it would refuse).
int64_t expert_data_parallel(const mt::plan::Plan &plan);
// The number of ranks a bucket is reduced and sharded over: data_parallel
// (group 0) or expert_data_parallel (group 6).
int64_t bucket_group_size(const mt::plan::Plan &plan, const mt::plan::Bucket &bucket);
// Where a bucket's shard starts in a rank's distributed-optimizer shard
// state: its shard_offset, or begin / data_parallel when the plan gives none
// (every bucket then a dp bucket).
int64_t bucket_shard_state_offset(const mt::plan::Plan &plan, const mt::plan::Bucket &bucket);
// A rank's expert coordinates (runtime/comm/parallel_groups.h's numbering:
// within a stage, i = tp_rank + tp x dp_rank = etp_rank + etp x (ep_rank +
// ep x edp_rank)).
struct ExpertCoords {
  int64_t etp_rank = 0, ep_rank = 0, edp_rank = 0;
};
ExpertCoords expert_coords(const mt::plan::Plan &plan, const mt::plan::Rank &rank);
ExpertCoords expert_coords(int64_t tp, int64_t ep, int64_t etp, int64_t tp_rank, int64_t dp_rank);
// The rank's place in a bucket's group: dp_rank (group 0) or edp_rank (6).
int64_t bucket_group_rank(const mt::plan::Plan &plan, const mt::plan::Rank &rank,
                          const mt::plan::Bucket &bucket);
// Whether any rank of the plan holds an expert parameter (Param.expert): its
// gradient norms and log statistics then have an expert part, summed over
// the expert groups by every rank.
bool plan_has_experts(const mt::plan::Plan &plan);
// The pointers a GEMM epilogue takes after A, B and D (plan.fbs
// GemmEpilogue): a bias (read, or for the bias gradients written), then aux.
inline bool gemm_epilogue_has_bias(mt::plan::GemmEpilogue e) {
  return e != mt::plan::GemmEpilogue::NONE && e != mt::plan::GemmEpilogue::DGELU;
}
inline bool gemm_epilogue_has_aux(mt::plan::GemmEpilogue e) {
  return e == mt::plan::GemmEpilogue::GELU_AUX_BIAS || e == mt::plan::GemmEpilogue::DGELU ||
         e == mt::plan::GemmEpilogue::DGELU_BGRAD;
}
inline bool gemm_epilogue_writes_bias(mt::plan::GemmEpilogue e) {
  return e == mt::plan::GemmEpilogue::DGELU_BGRAD || e == mt::plan::GemmEpilogue::BGRADB;
}

// Opcodes whose out[0] may lie exactly on in[0]'s bytes: RESHAPE (a view)
// and CROSS_ENTROPY_GRAD (the logits' gradient written over the logits).
// The reader accepts that alias and the executor gives both one lifetime.
inline bool out0_may_alias_in0(mt::plan::Opcode op) {
  return op == mt::plan::Opcode::RESHAPE || op == mt::plan::Opcode::CROSS_ENTROPY_GRAD;
}

// The GPU executor's device scalars (gpu_executor.h), after the kernel
// workspace: the loss scale (an f32 in an 8-byte slot), the seed, the
// program's RNG offset, then one RNG offset per micro-batch the rank's
// instructions name (a compact pipelined train_step: its
// pipeline.micro_batches; u64 each), rounded up to 256 bytes. The plan's
// Memory.workspace counts them with the kernel workspace (rounded up to 256
// bytes) and cuBLASLt's stated workspace, so what mtc prints is what mtrun
// allocates.
constexpr uint64_t kGpuScalarSlotBytes = 8;
constexpr int32_t kMaxMicroBatch = 65535; // the largest Instruction.micro_batch read
uint64_t gpu_micro_batch_slots(const mt::plan::Rank &rank);
uint64_t gpu_scalar_bytes(uint64_t micro_batch_slots);
uint64_t gpu_scalar_bytes(const mt::plan::Rank &rank);
// What the GPU executor allocates after the arena: the kernel workspace,
// then the scalars.
uint64_t gpu_executor_workspace_bytes(uint64_t kernel_workspace_bytes, uint64_t micro_batch_slots);

// "f32", "bf16", "f16", "i32", "i64".
const char *dtype_label(mt::plan::DType d);

// A plan string ("" when absent) and a parameter's (this rank's) shape.
std::string plan_string(const flatbuffers::String *s);
std::vector<int64_t> param_shape(const mt::plan::Param &p);

class PlanFile {
public:
  // Reads and verifies everything before returning; on any problem returns
  // null and sets *error to one line that starts with the file name.
  static std::unique_ptr<PlanFile> open(const std::string &path, std::string *error);
  // The same on bytes already in memory; `name` stands for the file in errors.
  static std::unique_ptr<PlanFile> from_bytes(std::string bytes, const std::string &name,
                                              std::string *error);

  const mt::plan::Plan *plan() const { return plan_; }
  const std::string &name() const { return name_; }

private:
  PlanFile() = default;
  std::string bytes_; // the whole file; plan_ points into it
  std::string name_;
  const mt::plan::Plan *plan_ = nullptr;
};

} // namespace mt::rt

#endif // MT_RUNTIME_PLAN_READER_H
