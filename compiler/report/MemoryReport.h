// The per-rank memory and feasibility plan `mtc compile` prints: figures from
// the planned state and arena (mt-plan-memory), not from a formula.
#ifndef MT_COMPILER_MEMORYREPORT_H
#define MT_COMPILER_MEMORYREPORT_H

#include "spec/Spec.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <functional>
#include <optional>
#include <string>

namespace mt {

// Stated, not measured by mtc: what the CUDA runtime needs beside the plan.
constexpr int64_t kCublasWorkspaceBytes = 32ll << 20;   // cuBLASLt on Hopper
constexpr int64_t kCudaContextReserveBytes = 768ll << 20; // context, handles, modules

struct RankMemory {
  std::string rank = "0";          // "stage 0 / tp 0" once there are several
  int64_t weights = 0, grads = 0, master = 0, moments = 0;
  int64_t activations = 0, workspace = 0, reserve = 0;
  // Pipeline stages: the most micro-batches whose forward has run and whose
  // backward has not, over the stage's schedule (0 without pipelining).
  int64_t inFlight = 0;
  int64_t total() const {
    return weights + grads + master + moments + activations + workspace + reserve;
  }
};

struct MemoryPlan {
  std::vector<RankMemory> ranks;
  int64_t deviceBytes = 0;
  std::string device;
  int heaviest = 0;
  bool fits() const { return ranks[heaviest].total() <= deviceBytes; }
  // When it does not fit: changes that make it fit, each checked by planning
  // the changed spec (not estimated).
  std::vector<std::string> suggestions;
  // Set while parallel layouts are not planned yet: what the figures cover.
  std::string note;
  // Which of Megatron's activation formulas applies (tensor parallelism only).
  bool tensorParallel = false, sequenceParallel = false;
  bool sgd = false; // SGD's momentum buffer in the moments' column
  // Megatron-LM's theoretical_memory_usage.py for the same configuration
  // (docs/memory.md compares it with the plan).
  int64_t megatronWeightsAndOptimizer = 0;
  int64_t megatronActivations = 0;
  // Expert parallelism (ep x etp > 1): the bytes of rows one rank sends in
  // its token exchanges (mt.moe_dispatch / mt.moe_combine) over one
  // iteration, forward, recomputation and backward, on the busiest stage;
  // the worst case of the static row counts (every row to another rank).
  int64_t expertParallel = 1;
  int64_t expertTensorParallel = 1;
  std::string dispatcher;
  int64_t allToAllBytes = 0;
  // The rows a rank receives in one MoE layer's exchange (the largest over
  // stages) and, with moe_dispatch_buffer_factor (receiveFactor > 0), the
  // worst case they are bounded below (0 when the bound is not below it).
  int64_t receiveRows = 0, worstCaseReceiveRows = 0;
  double receiveFactor = 0;
};

// Megatron-LM's formulas (megatron/training/theoretical_memory_usage.py):
// parameters on the most loaded shard times 18 bytes (6 + 12 / dp with the
// distributed optimizer), and activations from Table 2 of Korthikanti et
// al. 2022 (sequence parallelism and selective recompute assumed), in bytes.
struct MegatronEstimate {
  int64_t weightsAndOptimizer = 0;
  int64_t activations = 0;
};
MegatronEstimate megatronTheoreticalMemory(const spec::Spec &spec);

// Reads the figures mt-plan-memory left on the module.
MemoryPlan memoryPlanOf(mlir::ModuleOp module, const spec::Spec &spec);

// Fills plan.suggestions by re-planning variants of `spec` with `replan`
// (returns the heaviest rank's total bytes, or nullopt if the variant fails).
void suggestFixes(MemoryPlan &plan, const spec::Spec &spec,
                  const std::function<std::optional<int64_t>(const spec::Spec &)> &replan);

void printMemoryPlanText(llvm::raw_ostream &os, const MemoryPlan &plan);
llvm::json::Object memoryPlanJson(const MemoryPlan &plan);

} // namespace mt

#endif // MT_COMPILER_MEMORYREPORT_H
