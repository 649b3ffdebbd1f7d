// IR after mt-plan-memory -> plan.bin's FlatBuffer: parameter table, one
// program per function, the memory plan and the training settings.
#include "compiler/plan/PlanWriter.h"

#include "compiler/cuda/CudaKernelGen.h"
#include "compiler/cuda/GpuSteps.h"
#include "compiler/report/MemoryReport.h"
#include "dialects/mt/MtOps.h"
#include "passes/StageModules.h"
#include "plan_generated.h"
#include "runtime/comm/parallel_groups.h"
#include "runtime/plan/plan_reader.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/TypeSwitch.h"

#include <map>
#include <type_traits>
#include <unordered_map>

using namespace mlir;
namespace fb = flatbuffers;
namespace pl = mt::plan;

namespace mt {
namespace {

// LR_SCHEDULE carries the dialect's enum codes.
static_assert(int(LrStyle::WSD) == int(pl::LrStyle::WSD) &&
              int(LrStyle::InverseSquareRoot) == int(pl::LrStyle::INVERSE_SQUARE_ROOT));
static_assert(int(WsdStyle::MinusSqrt) == int(pl::WsdStyle::MINUS_SQRT) &&
              int(WsdStyle::Cosine) == int(pl::WsdStyle::COSINE));

constexpr const char *kProducer = "mtc 0.1.0";

pl::DType dtypeOf(Type t) {
  if (t.isF32()) return pl::DType::F32;
  if (t.isBF16()) return pl::DType::BF16;
  if (t.isF16()) return pl::DType::F16;
  if (t.isF64()) return pl::DType::F64;
  if (t.isInteger(64)) return pl::DType::I64;
  return pl::DType::I32;
}

// A tensor-parallel shard dimension attribute as plan.fbs's int (-1: none).
int64_t shardDim(std::optional<uint64_t> d) { return d ? int64_t(*d) : -1; }

// The number a collective instruction names its group by (plan.fbs): the
// runtime's own enumeration.
int64_t groupNumber(StringRef name) {
  rt::Group g = name == "tp"         ? rt::Group::TP
                : name == "pp"       ? rt::Group::PP
                : name == "mp"       ? rt::Group::MP
                : name == "ep"       ? rt::Group::EP
                : name == "expt_tp"  ? rt::Group::EXPT_TP
                : name == "expt_dp"  ? rt::Group::EXPT_DP
                : name == "tp_ep"    ? rt::Group::TP_EP
                : name == "tp_ep_pp" ? rt::Group::TP_EP_PP
                                     : rt::Group::DP;
  return int64_t(g);
}
const int64_t kGroupTp = int64_t(rt::Group::TP);
// The token exchange's group: the expert-parallel ranks, or with expert
// tensor parallelism the etp x ep ranks of the tensor-and-expert-parallel
// group (tp_ep, which is the ep group at etp 1).
int64_t exchangeGroup(int64_t etp) {
  return int64_t(etp > 1 ? rt::Group::TP_EP : rt::Group::EP);
}

// 64-bit FNV-1a: parameter init streams and the model fingerprint.
uint64_t fnv1a(StringRef s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s)
    h = (h ^ c) * 1099511628211ull;
  return h;
}

// "decoder.layers.3" from "decoder.layers.3.mlp.linear_fc1.weight".
std::string layerOf(StringRef param) {
  SmallVector<StringRef> parts;
  param.split(parts, '.');
  if (parts.size() >= 3 && parts[0] == "decoder" && parts[1] == "layers")
    return (parts[0] + "." + parts[1] + "." + parts[2]).str();
  return parts.empty() ? std::string() : parts[0].str();
}

class Writer {
public:
  Writer(ModuleOp module, const spec::Spec &spec, const GpuKernelOptions &kernels)
      : module(module), spec(spec), kernelOptions(kernels) {}

  // One stage's part of the plan: what every rank of that stage shares.
  struct StageEntry {
    fb::Offset<fb::Vector<fb::Offset<pl::Param>>> params;
    fb::Offset<fb::Vector<fb::Offset<pl::Program>>> programs;
    fb::Offset<pl::Memory> memory;
    int64_t stateBytes = 0, arenaBytes = 0;
    // Data-parallel buckets and the distributed optimizer's shard state.
    fb::Offset<fb::Vector<fb::Offset<pl::Bucket>>> buckets;
    int64_t flatElements = 0;
    bool sharded = false;
    int64_t shardElements = 0, shardMaster = -1, shardExpAvg = -1, shardExpAvgSq = -1;
    uint64_t kernelWorkspace = 0; // the largest WORKSPACE of any GPU step
  };

  FailureOr<std::string> run() {
    // Pipeline stages are nested modules (mt-partition-pp); without them
    // the top module is the one stage.
    SmallVector<ModuleOp> stages = stageModules(module);
    std::vector<StageEntry> entries;
    for (ModuleOp stage : stages) {
      FailureOr<StageEntry> e = stageEntry(stage);
      if (failed(e))
        return failure();
      entries.push_back(*e);
    }
    // Megatron's rank order: rank = tp_rank + tp * (dp_rank + dp * pp_rank)
    // (runtime/comm/parallel_groups.h). The data-parallel ranks of a stage run
    // the same programs on their share of the batch, and its tensor-parallel
    // ranks the same programs on their shard of every parameter
    // (instructions find their shard from the rank's place in its
    // tensor-parallel group): their entries point at one parameter table
    // and program list.
    const int64_t pp = int64_t(stages.size());
    const int64_t dp = spec.parallel.data_parallel_size;
    auto dpOf = [&](ModuleOp m) -> int64_t {
      auto a = m->getAttrOfType<IntegerAttr>("mt.data_parallel");
      return a ? a.getInt() : 1;
    };
    if (dpOf(stages.front()) != 1 && dpOf(stages.front()) != dp) {
      module.emitError("plan writer: mt.data_parallel differs from the spec's data_parallel_size");
      return failure();
    }
    const int64_t dpRanks = dpOf(stages.front());
    const int64_t tp = spec.parallel.tensor_model_parallel_size;
    std::vector<fb::Offset<pl::Rank>> ranks;
    for (int64_t p = 0; p < pp; ++p)
      for (int64_t d = 0; d < dpRanks; ++d)
        for (int64_t t = 0; t < tp; ++t) {
          const StageEntry &e = entries[size_t(p)];
          ranks.push_back(pl::CreateRank(
              fbb, int32_t(t + tp * (d + dpRanks * p)), int32_t(t), int32_t(p), int32_t(d),
              e.params, e.stateBytes, e.arenaBytes, e.programs, e.memory, e.buckets,
              e.flatElements, e.sharded, e.shardElements, e.shardMaster, e.shardExpAvg,
              e.shardExpAvgSq, e.kernelWorkspace));
        }
    return finish(ranks);
  }

  FailureOr<StageEntry> stageEntry(ModuleOp stage) {
    ModuleOp module = stage;
    paramIndex.clear();
    paramInfo.clear();
    lowerings.clear();
    fusedKernels.clear();
    kernelWorkspace = 0;
    microBatchSlots = 0;
    int index = 0;
    for (ParamOp p : module.getOps<ParamOp>())
      paramIndex[p.getSymName()] = index++;

    std::vector<fb::Offset<pl::Param>> params;
    for (ParamOp p : module.getOps<ParamOp>()) {
      auto shape = p.getTensorType().getShape();
      bool decays = p.getTensorType().getRank() > 1 && !p.getSymName().ends_with(".bias");
      // mt-data-parallel records what the optimizer decided when it shards it.
      if (auto d = p->getAttrOfType<BoolAttr>("mt.weight_decay"))
        decays = d.getValue();
      auto attr = [&](StringRef n) {
        auto a = p->getAttrOfType<IntegerAttr>(n);
        return a ? a.getInt() : int64_t(-1);
      };
      if (attr("mt.weight_offset") < 0) {
        p.emitError("plan writer: parameter has no memory plan; run mt-plan-memory first");
        return failure();
      }
      // What the generated optimizer and norm kernels know of it. The norm
      // counts a tensor-parallel replica once (cpu_executor.cpp): on tp rank
      // 0, which its kernel reads at run time (the program is shared).
      GpuParamInfo info;
      info.shape.assign(shape.begin(), shape.end());
      info.dtype = dtypeOf(p.getTensorType().getElementType());
      info.weightDecay = decays;
      info.decoupledLr = p->hasAttr("mt.decoupled_lr");
      info.countsInNorm = !p->hasAttr("mt.tied_copy");
      info.replicated = !p.getTpDim().has_value();
      info.expert = p->hasAttr("mt.expert"); // the norm sums experts over tp_ep_pp
      info.weightOffset = attr("mt.weight_offset");
      info.gradOffset = attr("mt.grad_offset");
      // mt-plan-memory's gradient type (bf16 with grad_reduce_in_bf16).
      if (auto g = p->getAttrOfType<TypeAttr>("mt.grad_dtype"))
        info.gradDtype = dtypeOf(g.getValue());
      info.masterOffset = attr("mt.master_offset");
      info.expAvgOffset = attr("mt.exp_avg_offset");
      info.expAvgSqOffset = attr("mt.exp_avg_sq_offset");
      paramInfo.push_back(info);
      pl::Init init = p.getInit() == InitKind::Zeros  ? pl::Init::ZEROS
                      : p.getInit() == InitKind::Ones ? pl::Init::ONES
                                                      : pl::Init::NORMAL;
      params.push_back(pl::CreateParam(
          fbb, fbb.CreateString(p.getSymName().str()),
          fbb.CreateVector(std::vector<int64_t>(shape.begin(), shape.end())),
          dtypeOf(p.getTensorType().getElementType()), init,
          p.getStd() ? p.getStd()->convertToDouble() : 0.0, decays,
          attr("mt.weight_offset"), attr("mt.grad_offset"), attr("mt.master_offset"),
          attr("mt.exp_avg_offset"), attr("mt.exp_avg_sq_offset"),
          fnv1a(p.getSymName()), int32_t(p.getTpDim() ? *p.getTpDim() : -1),
          int32_t(p.getTpBlocks().value_or(1)), attr("mt.flat_offset"),
          int32_t(attr("mt.tied_peer")), !p->hasAttr("mt.tied_copy"),
          p->hasAttr("mt.decoupled_lr"), info.gradDtype,
          int32_t(p.getEpDim() ? int64_t(*p.getEpDim()) : -1), p.isExpert()));
    }

    // The distributed optimizer's layout, for its GPU kernels: dense
    // buckets sharded over dp (tables by dp rank), expert buckets over
    // expt_dp (tables by expt_dp rank), each at its shard_offset.
    // The data-parallel groups' sizes and the buckets, for REDUCE_GRADS
    // over a group of one rank (GpuSteps.h GpuReduceLayout).
    reduceLayout = GpuReduceLayout();
    reduceLayout.dataParallel = spec.parallel.data_parallel_size;
    if (auto edp = module->getAttrOfType<IntegerAttr>("mt.expert_data_parallel"))
      reduceLayout.expertDataParallel = edp.getInt();
    else if (spec.model.num_experts > 0) // edp = tp dp / (etp ep)
      reduceLayout.expertDataParallel =
          spec.parallel.tensor_model_parallel_size * spec.parallel.data_parallel_size /
          std::max<int64_t>(int64_t(spec.parallel.expert_tensor_parallel_size) *
                                spec.parallel.expert_model_parallel_size,
                            1);
    for (ParamOp p : module.getOps<ParamOp>()) {
      auto a = p->getAttrOfType<IntegerAttr>("mt.flat_offset");
      reduceLayout.flatOffset.push_back(a ? a.getInt() : -1);
    }
    if (auto bs = module->getAttrOfType<ArrayAttr>("mt.grad_buckets"))
      for (Attribute a : bs) {
        auto d = cast<DictionaryAttr>(a);
        auto begin = d.getAs<IntegerAttr>("begin"), end = d.getAs<IntegerAttr>("end");
        reduceLayout.buckets.push_back({begin ? begin.getInt() : 0, end ? end.getInt() : 0});
      }

    shardLayout.reset();
    if (auto shard = module->getAttrOfType<DictionaryAttr>("mt.shard_state")) {
      GpuShardLayout g;
      g.dataParallel = spec.parallel.data_parallel_size;
      auto field = [&](StringRef n) {
        auto v = shard.getAs<IntegerAttr>(n);
        return v ? v.getInt() : int64_t(-1);
      };
      g.master = field("master_offset");
      g.expAvg = field("exp_avg_offset");
      g.expAvgSq = field("exp_avg_sq_offset");
      for (ParamOp p : module.getOps<ParamOp>()) {
        auto a = p->getAttrOfType<IntegerAttr>("mt.flat_offset");
        g.flatOffset.push_back(a ? a.getInt() : -1);
      }
      if (auto bs = module->getAttrOfType<ArrayAttr>("mt.grad_buckets"))
        for (Attribute a : bs) {
          auto d = cast<DictionaryAttr>(a);
          GpuShardLayout::Bucket b;
          auto begin = d.getAs<IntegerAttr>("begin"), end = d.getAs<IntegerAttr>("end");
          b.begin = begin ? begin.getInt() : 0;
          b.end = end ? end.getInt() : 0;
          // Expert buckets (mt-data-parallel's group "expt_dp") are sharded
          // over expt_dp, their state at shard_offset (mt-plan-memory).
          auto group = d.getAs<StringAttr>("group");
          b.expert = group && group.getValue() == "expt_dp";
          if (auto at = d.getAs<IntegerAttr>("shard_offset"))
            b.shardOffset = at.getInt();
          g.buckets.push_back(b);
        }
      g.tensorParallel = spec.parallel.tensor_model_parallel_size;
      g.expertParallel = spec.parallel.expert_model_parallel_size *
                         (spec.model.num_experts > 0 ? spec.parallel.expert_tensor_parallel_size : 1);
      if (auto edp = module->getAttrOfType<IntegerAttr>("mt.expert_data_parallel"))
        g.expertDataParallel = edp.getInt();
      shardLayout = std::move(g);
    }

    std::vector<fb::Offset<pl::Program>> programs;
    for (auto f : module.getOps<func::FuncOp>()) {
      auto prog = program(f);
      if (failed(prog))
        return failure();
      programs.push_back(*prog);
    }

    auto i64 = [&](StringRef n) {
      auto a = module->getAttrOfType<IntegerAttr>(n);
      return a ? a.getInt() : int64_t(0);
    };
    auto memAttr = module->getAttrOfType<DictionaryAttr>("mt.memory");
    auto mem = [&](StringRef n) -> uint64_t {
      if (!memAttr)
        return 0;
      auto a = memAttr.getAs<IntegerAttr>(n);
      return a ? a.getInt() : 0;
    };
    StageEntry e;
    // As mtc prints it (MemoryReport.h): the workspace is cuBLASLt's stated
    // one and what the GPU executor allocates after the arena (the kernel
    // workspace and the device scalars); the reserve is the stated CUDA
    // context and libraries.
    e.memory = pl::CreateMemory(
        fbb, mem("weights"), mem("grads"), mem("master_weights"), mem("optimizer_moments"),
        mem("activations"),
        uint64_t(kCublasWorkspaceBytes) +
            rt::gpu_executor_workspace_bytes(kernelWorkspace, microBatchSlots),
        uint64_t(kCudaContextReserveBytes), spec.cluster.device_memory_bytes);
    e.params = fbb.CreateVector(params);
    e.programs = fbb.CreateVector(programs);
    e.stateBytes = i64("mt.state_bytes");
    e.kernelWorkspace = kernelWorkspace;
    e.arenaBytes = i64("mt.arena_bytes");
    std::vector<fb::Offset<pl::Bucket>> buckets;
    if (auto bs = module->getAttrOfType<ArrayAttr>("mt.grad_buckets")) {
      for (Attribute a : bs) {
        auto d = cast<DictionaryAttr>(a);
        std::vector<uint32_t> members;
        for (Attribute n : d.getAs<ArrayAttr>("params"))
          members.push_back(param(cast<FlatSymbolRefAttr>(n)));
        auto get = [&](StringRef n) {
          auto v = d.getAs<IntegerAttr>(n);
          return v ? v.getInt() : int64_t(-1);
        };
        if (get("begin") < 0) {
          module.emitError("plan writer: mt.grad_buckets has no memory plan; run "
                           "mt-plan-memory first");
          return failure();
        }
        // Its group (0 dp, 6 expt_dp for expert parameters) and, with the
        // distributed optimizer, where its shard sits in the shard state.
        auto group = d.getAs<StringAttr>("group");
        buckets.push_back(pl::CreateBucket(fbb, fbb.CreateVector(members), get("begin"),
                                           get("end"),
                                           int32_t(groupNumber(group ? group.getValue() : "dp")),
                                           get("shard_offset")));
      }
    }
    e.buckets = fbb.CreateVector(buckets);
    e.flatElements = i64("mt.flat_elements");
    if (auto shard = module->getAttrOfType<DictionaryAttr>("mt.shard_state")) {
      auto shardAttr = [&](StringRef n) {
        auto v = shard.getAs<IntegerAttr>(n);
        return v ? v.getInt() : int64_t(-1);
      };
      e.sharded = true;
      e.shardElements = shardAttr("elements");
      e.shardMaster = shardAttr("master_offset");
      e.shardExpAvg = shardAttr("exp_avg_offset");
      e.shardExpAvgSq = shardAttr("exp_avg_sq_offset");
    }
    return e;
  }

  FailureOr<std::string> finish(const std::vector<fb::Offset<pl::Rank>> &ranks) {

    const spec::TrainingConfig &t = spec.training;
    std::vector<std::string> paths;
    std::vector<double> weights;
    for (const auto &[w, path] : spec.data.data_path) {
      weights.push_back(w);
      paths.push_back(path);
    }
    const char *precision = t.precision == spec::Precision::FP32   ? "fp32"
                            : t.precision == spec::Precision::BF16 ? "bf16"
                                                                   : "fp16";
    auto ramp = [&](size_t i) -> int64_t {
      return t.rampup_batch_size.size() == 3 ? t.rampup_batch_size[i] : 0;
    };
    auto training = pl::CreateTraining(
        fbb, t.train_iters, t.micro_batch_size, t.global_batch_size,
        spec.numMicroBatches(), spec.model.seq_length, spec.model.vocab_size,
        spec.paddedVocabSize(), t.seed, t.log_interval, t.eval_interval, t.eval_iters,
        t.save_interval, fbb.CreateString(t.save), fbb.CreateString(t.load),
        fbb.CreateString(precision), t.initial_loss_scale, t.min_loss_scale,
        t.loss_scale_window, t.hysteresis, fbb.CreateVectorOfStrings(paths),
        fbb.CreateVector(weights), fbb.CreateString(spec.data.split), spec.data.mock_data,
        t.log_throughput, t.log_params_norm, t.log_num_zeros_in_grad,
        int32_t(t.timing_log_level), fbb.CreateString(t.timing_log_option),
        t.log_memory_to_tensorboard, t.check_for_nan_in_loss_and_grad,
        spec.flopsPerIteration(), t.clip_grad, t.train_samples, ramp(0), ramp(1), ramp(2),
        fbb.CreateString(spec::toString(t.optimizer)), fbb.CreateString(t.power_log),
        t.power_log_interval_ms, spec.data.eod_id, t.ckpt_step, t.finetune, t.load_optim,
        t.load_rng, t.save_optim, t.save_rng, spec.model.numMoeLayers(),
        fbb.CreateString(spec.model.numMoeLayers() > 0
                             ? spec::toString(spec.model.moe_router_load_balancing_type)
                             : ""),
        spec.model.numMoeLayers() > 0 ? spec.model.moe_z_loss_coeff : 0.0);

    auto plan = pl::CreatePlan(
        fbb, fbb.CreateString(kProducer), fbb.CreateString(modelFingerprint(module)),
        fbb.CreateString(spec::toToml(spec)), int32_t(spec.worldSize()),
        int32_t(spec.parallel.tensor_model_parallel_size),
        int32_t(spec.parallel.pipeline_model_parallel_size),
        int32_t(spec.parallel.data_parallel_size), training,
        fbb.CreateVector(kernels), fbb.CreateVector(ranks),
        int32_t(spec.parallel.expert_model_parallel_size),
        int32_t(spec.model.num_experts > 0 ? spec.parallel.expert_tensor_parallel_size : 1));
    fbb.Finish(plan, "MTPL");
    return std::string(reinterpret_cast<const char *>(fbb.GetBufferPointer()), fbb.GetSize());
  }

private:
  struct Inst {
    pl::Opcode op;
    std::vector<uint32_t> in, out, params;
    std::vector<int64_t> ints;
    std::vector<double> floats;
  };

  FailureOr<fb::Offset<pl::Program>> program(func::FuncOp f) {
    values.clear();
    valueInfo.clear();
    valueIndex.clear();
    valueNames.clear();
    // Looked up per instruction: resolved once, not by name each time.
    offsetsName = StringAttr::get(f.getContext(), "mt.offsets");
    slotOffsetsName = StringAttr::get(f.getContext(), "mt.slot_offsets");
    firstMarkName = StringAttr::get(f.getContext(), "mt.first_micro_batch");
    lastMarkName = StringAttr::get(f.getContext(), "mt.last_micro_batch");
    pipelined = f->hasAttr("mt.pipeline_schedule");
    if (pipelined)
      if (auto sched = f->getAttrOfType<DictionaryAttr>("mt.pipeline_schedule"))
        if (auto mbs = sched.getAs<IntegerAttr>("micro_batches"))
          microBatchSlots = std::max<uint64_t>(microBatchSlots, uint64_t(mbs.getInt()));
    Block &body = f.getBody().front();
    std::vector<uint32_t> inputs, outputs;
    std::vector<std::string> inputNames, outputNames;
    for (BlockArgument a : body.getArguments()) {
      auto off = f.getArgAttrOfType<IntegerAttr>(a.getArgNumber(), "mt.offset");
      auto name = f.getArgAttrOfType<StringAttr>(a.getArgNumber(), "mt.name");
      if (!off) {
        f.emitError("plan writer: argument has no arena offset; run mt-plan-memory first");
        return failure();
      }
      std::string n = name ? name.str() : "arg" + std::to_string(a.getArgNumber());
      auto slots = f.getArgAttrOfType<DenseI64ArrayAttr>(a.getArgNumber(), "mt.slot_offsets");
      inputs.push_back(addValue(a, pl::Region::ARENA, off.getInt(), n,
                                slots ? slots.asArrayRef() : ArrayRef<int64_t>()));
      inputNames.push_back(n);
    }

    std::vector<fb::Offset<pl::Instruction>> insts;
    for (Operation &op : body) {
      if (auto ret = dyn_cast<func::ReturnOp>(op)) {
        for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
          outputs.push_back(valueIndex.lookup(v));
          if (auto n = f.getResultAttrOfType<StringAttr>(i, "mt.name")) {
            outputNames.push_back(n.str()); // "loss.3" of an unrolled pipeline step
            continue;
          }
          outputNames.push_back(f.getName() == "optimizer_step" ? (i == 0 ? "lr" : "next_lr")
                                : f.getName() == "grad_norm"    ? "grad_norm"
                                                                : "loss");
        }
        continue;
      }
      if (auto ref = dyn_cast<ParamRefOp>(op)) {
        addValue(ref.getResult(), pl::Region::WEIGHT, paramIndex.lookup(ref.getName()),
                 ref.getName().str());
        continue;
      }
      auto offsets = op.getAttrOfType<DenseI64ArrayAttr>(offsetsName);
      if (op.getNumResults() && !offsets) {
        op.emitError("plan writer: op has no arena offsets; run mt-plan-memory first");
        return failure();
      }
      auto slots = op.getAttrOfType<ArrayAttr>(slotOffsetsName);
      for (auto [i, r] : llvm::enumerate(op.getResults())) {
        auto rs = slots && i < slots.size() ? dyn_cast<DenseI64ArrayAttr>(slots[i])
                                            : DenseI64ArrayAttr();
        addValue(r, pl::Region::ARENA, offsets[i], "",
                 rs ? rs.asArrayRef() : ArrayRef<int64_t>());
      }
      if (failed(emit(op, valueIndex, insts)))
        return failure();
    }
    fb::Offset<pl::PipelineSchedule> schedule;
    if (pipelined) {
      FailureOr<fb::Offset<pl::PipelineSchedule>> p = pipelineSchedule(f, insts.size());
      if (failed(p))
        return failure();
      schedule = *p;
    }
    auto valuesVec = fbb.CreateVector(values);
    return pl::CreateProgram(fbb, fbb.CreateString(f.getName().str()), valuesVec,
                             fbb.CreateVector(inputs), fbb.CreateVectorOfStrings(inputNames),
                             fbb.CreateVector(outputs), fbb.CreateVectorOfStrings(outputNames),
                             fbb.CreateVector(insts), 0, schedule);
  }

  // mt-schedule-pp's segments of a pipelined train_step, as instruction
  // ranges (one instruction per op of a segment), and its schedule.
  FailureOr<fb::Offset<pl::PipelineSchedule>> pipelineSchedule(func::FuncOp f,
                                                               size_t instructions) {
    auto sched = f->getAttrOfType<DictionaryAttr>("mt.pipeline_schedule");
    auto segs = f->getAttrOfType<ArrayAttr>("mt.segments");
    auto get = [&](StringRef n) {
      auto a = sched.getAs<IntegerAttr>(n);
      return a ? a.getInt() : int64_t(-1);
    };
    std::vector<pl::Segment> segments;
    uint32_t begin = 0;
    for (Attribute a : segs) {
      auto d = cast<DictionaryAttr>(a);
      const uint32_t n = uint32_t(d.getAs<IntegerAttr>("ops").getInt());
      segments.emplace_back(begin, begin + n, int32_t(d.getAs<IntegerAttr>("chunk").getInt()),
                            d.getAs<BoolAttr>("forward").getValue(),
                            pl::SegmentPart(d.getAs<IntegerAttr>("part").getInt()));
      begin += n;
    }
    if (begin != instructions) {
      f.emitError() << "plan writer: mt.segments count " << begin << " instructions, @"
                    << f.getName() << " has " << instructions << "; run mt-schedule-pp last";
      return failure();
    }
    return pl::CreatePipelineSchedule(fbb, int32_t(get("stages")), int32_t(get("chunks")),
                                      int32_t(get("rank")), int32_t(get("micro_batches")),
                                      get("tag_stride"), fbb.CreateVectorOfStructs(segments));
  }

  fb::Offset<pl::Value> valueEntry(Value v, pl::Region region, int64_t offset,
                                   const std::string &name, ArrayRef<int64_t> slots = {}) {
    auto t = cast<RankedTensorType>(v.getType());
    auto shape = t.getShape();
    fb::Offset<fb::Vector<uint64_t>> slotOffsets;
    if (!slots.empty())
      slotOffsets = fbb.CreateVector(std::vector<uint64_t>(slots.begin(), slots.end()));
    // Unnamed values store no name: readers label them by their index.
    return pl::CreateValue(fbb, name.empty() ? 0 : sharedString(name), region, uint64_t(offset),
                           sharedVector('s', std::vector<int64_t>(shape.begin(), shape.end())),
                           dtypeOf(t.getElementType()), slotOffsets);
  }

  uint32_t addValue(Value v, pl::Region region, int64_t offset, std::string name,
                    ArrayRef<int64_t> slots = {}) {
    values.push_back(valueEntry(v, region, offset, name, slots));
    auto t = cast<RankedTensorType>(v.getType());
    valueInfo.push_back({std::vector<int64_t>(t.getShape().begin(), t.getShape().end()),
                         dtypeOf(t.getElementType()), uint64_t(offset), region});
    uint32_t index = values.size() - 1;
    valueIndex[v] = index;
    return index;
  }

  // Lowers `op` with the given value numbering and appends its instruction.
  LogicalResult emit(Operation &op, const DenseMap<Value, uint32_t> &numbers,
                     std::vector<fb::Offset<pl::Instruction>> &insts) {
    FailureOr<Inst> inst = lower(op, numbers);
    if (failed(inst))
      return failure();
    std::string where = whereOf(op);
    // A pipelined step's overlapped weight gathers and bucket reductions run
    // in the first and the last micro-batch only.
    pl::MicroBatches runsIn = pl::MicroBatches::ALL;
    if (pipelined && &numbers == &valueIndex) {
      if (op.hasAttr(firstMarkName))
        runsIn = pl::MicroBatches::FIRST;
      else if (op.hasAttr(lastMarkName))
        runsIn = pl::MicroBatches::LAST;
    }
    // A kernel's cpu_instructions run only on the CPU: GPU steps belong to
    // the program's own instructions.
    std::vector<fb::Offset<pl::GpuStep>> gpu;
    if (&numbers == &valueIndex)
      gpu = gpuSteps(op, *inst);
    insts.push_back(pl::CreateInstruction(
        fbb, inst->op, fbb.CreateVector(inst->in), fbb.CreateVector(inst->out),
        sharedVector('p', inst->params), sharedVector('l', inst->ints),
        sharedVector('d', inst->floats), sharedString(where), -1, sharedVector('g', gpu),
        runsIn));
    return success();
  }

  // The instruction's GPU steps (compiler/cuda/GpuSteps.h); none when it has no
  // GPU form yet, which the CUDA executor reports at load.
  std::vector<fb::Offset<pl::GpuStep>> gpuSteps(Operation &op, const Inst &inst) {
    GpuInstruction gi{inst.op, inst.in, inst.out, inst.params, inst.ints, inst.floats};
    GpuLowering l;
    std::string key = isa<AdamWOp, SgdOp>(op) ? std::string() : loweringKey(gi);
    auto known = key.empty() ? lowerings.end() : lowerings.find(key);
    if (known != lowerings.end()) {
      l = rebind(known->second, gi);
    } else {
      l = lowerGpu(op, gi);
      // Its new kernels join the kernel table once; later instances of the
      // same lowering launch those entries.
      for (GpuStepSpec &s : l.steps)
        if (s.kind == pl::GpuStepKind::KERNEL && s.kernel < 0)
          s.kernel = addKernel(l.kernels.at(size_t(-s.kernel - 1)));
      l.kernels.clear();
      if (!key.empty())
        lowerings.try_emplace(std::move(key), l, gi);
    }
    kernelWorkspace = std::max(kernelWorkspace, l.workspaceBytes);
    std::vector<fb::Offset<pl::GpuStep>> steps;
    for (const GpuStepSpec &s : l.steps)
      steps.push_back(sharedStep(s));
    return steps;
  }

  GpuLowering lowerGpu(Operation &op, const GpuInstruction &gi) {
    if (auto fused = dyn_cast<FusedOp>(op)) {
      const int64_t k = gi.ints.empty() ? -1 : gi.ints[0];
      if (fused.getKind() == FusionKind::Gemm) {
        auto yield = cast<YieldOp>(fused.getBodyBlock().getTerminator());
        GemmKernelShape shape;
        shape.gelu = isa<GeluOp>(yield.getValues().back().getDefiningOp());
        shape.auxOut = yield.getNumOperands() == 2;
        return lowerGemmKernel(gi, shape, valueInfo);
      }
      if (fused.getKind() == FusionKind::GemmGrad)
        return gemmGradSteps(fused, gi);
      if (k >= 0 && size_t(k) < fusedCuda.size())
        return lowerFusedKernel(gi, k, fusedCuda[size_t(k)]);
      return GpuLowering();
    }
    if (auto adamw = dyn_cast<AdamWOp>(op))
      return adamWSteps(adamw);
    if (auto sgd = dyn_cast<SgdOp>(op))
      return sgdSteps(sgd);
    return lowerInstruction(gi, valueInfo, paramInfo, spec.parallel.tensor_model_parallel_size,
                            shardLayout ? &*shardLayout : nullptr, kernelOptions, &reduceLayout);
  }

  // Lowering an instruction generates its kernels' sources, and a pipeline
  // program repeats each layer's instructions for every micro-batch: equal
  // instructions are lowered once per stage. What lowerInstruction reads of
  // an instruction is its opcode, ints and floats, its values' shapes and
  // types (and, for RESHAPE, whether the bytes move), and its parameters
  // (indices into the stage's table); those, with which of its values are
  // the same value, are the key. An mt.fused's ints name its kernel entry,
  // which equal regions share (kernel()), so the key covers its body too.
  // Instructions that read every parameter or the distributed optimizer's
  // layout occur once per step and are not keyed (empty key).
  std::string loweringKey(const GpuInstruction &gi) const {
    switch (gi.op) {
    case pl::Opcode::GRAD_NORM:
    case pl::Opcode::GROUP_GRAD_NORM:
    case pl::Opcode::SHARDED_GRAD_NORM:
    case pl::Opcode::SHARDED_ADAMW:
    case pl::Opcode::SHARDED_SGD:
    case pl::Opcode::REDUCE_GRADS: // its kernels name the bucket's parameters, not its own
      return "";
    default:
      break;
    }
    std::string key;
    auto put = [&](const auto &x) {
      key.append(reinterpret_cast<const char *>(&x), sizeof x);
    };
    put(gi.op);
    std::vector<uint32_t> operands(gi.in);
    operands.insert(operands.end(), gi.out.begin(), gi.out.end());
    put(gi.in.size());
    put(operands.size());
    for (size_t i = 0; i < operands.size(); ++i) {
      const GpuValueInfo &v = valueInfo.at(operands[i]);
      put(v.dtype);
      put(v.shape.size());
      for (int64_t d : v.shape)
        put(d);
      // The first position holding the same value.
      put(size_t(std::find(operands.begin(), operands.end(), operands[i]) - operands.begin()));
    }
    if (gi.op == pl::Opcode::RESHAPE && !gi.in.empty() && !gi.out.empty())
      put(valueInfo[gi.in[0]].region == valueInfo[gi.out[0]].region &&
          valueInfo[gi.in[0]].offset == valueInfo[gi.out[0]].offset);
    put(gi.params.size());
    for (uint32_t p : gi.params)
      put(p);
    put(gi.ints.size());
    for (int64_t i : gi.ints)
      put(i);
    put(gi.floats.size());
    for (double f : gi.floats)
      put(f);
    return key;
  }

  // A keyed lowering's steps for an equal instruction: its values in place
  // of the first one's (by position; the key made the positions agree).
  static GpuLowering rebind(const std::pair<GpuLowering, GpuInstruction> &first,
                            const GpuInstruction &gi) {
    const GpuInstruction &was = first.second;
    GpuLowering l = first.first;
    for (GpuStepSpec &s : l.steps)
      for (GpuArgSpec &a : s.args) {
        if (a.kind != pl::GpuArgKind::VALUE)
          continue;
        if (auto at = std::find(was.in.begin(), was.in.end(), a.index); at != was.in.end())
          a.index = gi.in[size_t(at - was.in.begin())];
        else
          a.index = gi.out.at(size_t(std::find(was.out.begin(), was.out.end(), a.index) -
                                     was.out.begin()));
      }
    return l;
  }

  // A gemm_grad region's GEMM (mt.fused verified its form): its operands
  // by program value, its parameters by index.
  GpuLowering gemmGradSteps(FusedOp fused, const GpuInstruction &gi) {
    Block &body = fused.getBodyBlock();
    GemmGradKernelShape shape;
    bool ok = true;
    auto in = [&](Value v) -> uint32_t {
      auto arg = dyn_cast<BlockArgument>(v);
      ok &= arg && arg.getOwner() == &body;
      return ok ? gi.in.at(arg.getArgNumber()) : 0;
    };
    for (BiasGradOp b : body.getOps<BiasGradOp>()) {
      shape.biasGrad = true;
      shape.biasParam = param(b.getParamAttr());
      shape.gradDtype = paramInfo.at(shape.biasParam).gradDtype;
    }
    if (auto wg = dyn_cast<MatmulWeightGradOp>(body.front())) {
      shape.weightGrad = true;
      shape.dy = in(wg.getGrad());
      shape.operand = in(wg.getInput());
      shape.weightParam = param(wg.getParamAttr());
      shape.gradDtype = paramInfo.at(shape.weightParam).gradDtype;
    } else {
      auto mig = cast<MatmulInputGradOp>(body.front());
      auto gelu = cast<GeluGradOp>(*std::next(body.begin()));
      shape.dy = in(mig.getGrad());
      shape.operand = in(mig.getWeight());
      shape.pre = in(gelu.getInput());
      shape.out = gi.out.at(0);
    }
    if (!ok) {
      GpuLowering l;
      l.missing = "a gemm_grad kernel whose GEMM reads a value computed inside it";
      return l;
    }
    return lowerGemmGradKernel(shape, valueInfo);
  }

  // Consecutive mt.adamw ops reading the same lr, clipping coefficient and
  // step, with the same hyperparameters, run as one multi-tensor launch:
  // the first of the run carries it, the others have nothing to do.
  GpuLowering adamWSteps(AdamWOp first) {
    GpuLowering l;
    if (auto prev = dyn_cast_or_null<AdamWOp>(first->getPrevNode()); prev && sameAdamW(prev, first)) {
      l.steps.push_back(GpuStepSpec()); // NOTHING: done by the run's first
      return l;
    }
    std::vector<GpuInstruction> group;
    for (Operation *op = first; op; op = op->getNextNode()) {
      auto a = dyn_cast<AdamWOp>(op);
      if (!a || (a != first && !sameAdamW(first, a)))
        break;
      GpuInstruction gi;
      gi.op = pl::Opcode::ADAMW;
      for (Value v : a->getOperands())
        gi.in.push_back(valueIndex.lookup(v));
      gi.params = {param(a.getParamAttr())};
      gi.floats = {a.getBeta1().convertToDouble(), a.getBeta2().convertToDouble(),
                   a.getEpsilon().convertToDouble(), a.getWeightDecay().convertToDouble()};
      group.push_back(std::move(gi));
    }
    return lowerOptimizerGroup(group, valueInfo, paramInfo);
  }
  // mt.sgd as mt.adamw: a run of equal ones is one multi-tensor launch.
  GpuLowering sgdSteps(SgdOp first) {
    GpuLowering l;
    if (auto prev = dyn_cast_or_null<SgdOp>(first->getPrevNode()); prev && sameSgd(prev, first)) {
      l.steps.push_back(GpuStepSpec()); // NOTHING: done by the run's first
      return l;
    }
    std::vector<GpuInstruction> group;
    for (Operation *op = first; op; op = op->getNextNode()) {
      auto s = dyn_cast<SgdOp>(op);
      if (!s || (s != first && !sameSgd(first, s)))
        break;
      GpuInstruction gi;
      gi.op = pl::Opcode::SGD;
      for (Value v : s->getOperands())
        gi.in.push_back(valueIndex.lookup(v));
      gi.params = {param(s.getParamAttr())};
      gi.floats = {s.getMomentum().convertToDouble(), s.getWeightDecay().convertToDouble()};
      group.push_back(std::move(gi));
    }
    return lowerOptimizerGroup(group, valueInfo, paramInfo);
  }
  static bool sameSgd(SgdOp a, SgdOp b) {
    return a->getOperands() == b->getOperands() && a.getMomentum() == b.getMomentum();
  }
  static bool sameAdamW(AdamWOp a, AdamWOp b) {
    return a->getOperands() == b->getOperands() && a.getBeta1() == b.getBeta1() &&
           a.getBeta2() == b.getBeta2() && a.getEpsilon() == b.getEpsilon();
  }

  // A kernel that only the GPU runs (no cpu_instructions): its index.
  int64_t addKernel(const CudaKernel &k) {
    return kernelEntry(k.entry, k, fbb.CreateVector(std::vector<fb::Offset<pl::Value>>()),
                       fbb.CreateVector(std::vector<fb::Offset<pl::Instruction>>()), 0);
  }

  // Appends a Kernel entry (the CUDA form `k`, and the CPU form when the
  // kernel is an mt.fused region); returns its index.
  int64_t kernelEntry(const std::string &name, const CudaKernel &k,
                      fb::Offset<fb::Vector<fb::Offset<pl::Value>>> cpuValues,
                      fb::Offset<fb::Vector<fb::Offset<pl::Instruction>>> cpuInstructions,
                      uint64_t cpuScratch) {
    std::vector<fb::Offset<fb::String>> scalarArgs;
    for (const std::string &a : k.scalarArgs)
      scalarArgs.push_back(sharedString(a));
    kernels.push_back(pl::CreateKernel(
        fbb, fbb.CreateString(name), sharedString(k.source),
        fbb.CreateVector(std::vector<uint32_t>(k.grid, k.grid + 3)),
        fbb.CreateVector(std::vector<uint32_t>(k.block, k.block + 3)), k.sharedBytes, cpuValues,
        cpuInstructions, cpuScratch, sharedString(k.entry), fbb.CreateVector(scalarArgs),
        fbb.CreateVector(k.streams)));
    fusedCuda.push_back(k);
    return int64_t(kernels.size() - 1);
  }

  // "decoder.layers.1 mt.attention_grad": the layer comes from the
  // parameters the op or its neighbours touch.
  std::string whereOf(Operation &op) {
    if (auto fused = dyn_cast<FusedOp>(op))
      return "mt.fused " + fused.getName().str();
    std::string layer;
    auto fromSym = [&](Attribute a) {
      if (auto s = dyn_cast_or_null<FlatSymbolRefAttr>(a))
        if (layer.empty())
          layer = layerOf(s.getValue());
    };
    for (NamedAttribute a : op.getAttrs())
      fromSym(a.getValue());
    for (Value v : op.getOperands())
      if (auto ref = v.getDefiningOp<ParamRefOp>())
        fromSym(ref.getNameAttr());
    // The expert exchange touches no parameter: its layer index names it
    // (its errors, e.g. a routing over moe_dispatch_buffer_factor, say which).
    if (layer.empty() && isa<MoeDispatchOp, MoeCombineOp>(op))
      if (auto i = op.getAttrOfType<IntegerAttr>("mt.layer"))
        layer = "decoder.layers." + std::to_string(i.getInt());
    return (layer.empty() ? "" : layer + " ") + op.getName().getStringRef().str();
  }

  uint32_t param(FlatSymbolRefAttr s) { return paramIndex.lookup(s.getValue()); }

  // RoPE's second float: Llama 3.1's scaling factor, 0 without scaling.
  static double ropeScaling(FloatAttr f) { return f ? f.getValueAsDouble() : 0.0; }

  // One op -> one instruction over the value numbers of the program or
  // kernel it belongs to.
  // MOE_ROUTER's and MOE_ROUTER_GRAD's ints and floats (plan.fbs).
  template <typename RouterOp> static void routerArgs(RouterOp o, Inst &i) {
    i.ints = {o.getTopkAttr().getInt(),
              int64_t(o.getScoreFunction()),
              o.getPreSoftmax() ? 1 : 0,
              int64_t(o.getLoadBalancing()),
              o.getCapacityAttr().getInt(),
              int64_t(o.getDropPolicy()),
              o.getPadToCapacity() ? 1 : 0,
              o.getSeqLengthAttr().getInt(),
              int64_t(o.getRouterDtype()),
              // count_group: 1 (tp) with sequence parallelism, -1 none.
              o.getCountGroupAttr() ? int64_t(1) : int64_t(-1)};
    i.floats = {o.getScalingFactor().convertToDouble(), o.getAuxLossCoeff().convertToDouble(),
                o.getZLossCoeff().convertToDouble()};
  }

  FailureOr<Inst> lower(Operation &op, const DenseMap<Value, uint32_t> &numbers) {
    Inst i;
    for (Value v : op.getOperands())
      i.in.push_back(numbers.lookup(v));
    for (Value r : op.getResults())
      i.out.push_back(numbers.lookup(r));
    auto eps = [&](FloatAttr a) { i.floats.push_back(a.getValueAsDouble()); };
    bool ok = true;
    llvm::TypeSwitch<Operation *>(&op)
        .Case([&](PositionIdsOp) { i.op = pl::Opcode::POSITION_IDS; })
        .Case([&](EmbeddingOp o) {
          i.op = pl::Opcode::EMBEDDING;
          i.ints = {o.getVocabParallel() ? 1 : 0};
        })
        .Case([&](LayerNormOp o) {
          i.op = pl::Opcode::LAYER_NORM;
          i.floats = {o.getEpsilon().convertToDouble(), o.getZeroCenteredGamma() ? 1.0 : 0.0};
        })
        .Case([&](RMSNormOp o) {
          i.op = pl::Opcode::RMS_NORM;
          i.floats = {o.getEpsilon().convertToDouble(), o.getZeroCenteredGamma() ? 1.0 : 0.0};
        })
        .Case([&](MatmulOp) { i.op = pl::Opcode::MATMUL; })
        .Case([&](BiasAddOp) { i.op = pl::Opcode::BIAS_ADD; })
        .Case([&](AddOp) { i.op = pl::Opcode::ADD; })
        .Case([&](GeluOp o) {
          i.op = pl::Opcode::GELU;
          i.ints.push_back(o.getApproximation() == GeluApproximation::Tanh);
        })
        .Case([&](SwiGLUOp) { i.op = pl::Opcode::SWIGLU; })
        .Case([&](DropoutOp o) {
          i.op = pl::Opcode::DROPOUT;
          i.ints = {int64_t(o.getStream()), shardDim(o.getTpShardDim())};
          eps(o.getRateAttr());
        })
        .Case([&](ReshapeOp) { i.op = pl::Opcode::RESHAPE; })
        .Case([&](FusedOp o) {
          FailureOr<int64_t> k = kernel(o);
          ok = succeeded(k);
          i.op = pl::Opcode::FUSED;
          i.ints = {ok ? *k : -1};
        })
        .Case([&](SplitQKVOp o) {
          i.op = pl::Opcode::SPLIT_QKV;
          if (FloatAttr base = o.getRopeBaseAttr()) {
            i.op = pl::Opcode::SPLIT_QKV_ROPE;
            i.floats = {base.getValueAsDouble(), ropeScaling(o.getRopeScalingFactorAttr())};
          }
        })
        .Case([&](RopeOp o) {
          i.op = pl::Opcode::ROPE;
          i.floats = {o.getBase().convertToDouble(), ropeScaling(o.getScalingFactorAttr())};
        })
        .Case([&](AttentionOp o) {
          i.op = pl::Opcode::ATTENTION;
          i.ints = {o.getCausal() ? 1 : 0, int64_t(o.getStream()), shardDim(o.getTpShardDim())};
          i.floats = {o.getScale().convertToDouble(), o.getDropoutRate().convertToDouble()};
        })
        .Case([&](CrossEntropyOp o) {
          i.op = pl::Opcode::CROSS_ENTROPY;
          i.ints = {o.getVocabParallel() ? 1 : 0};
        })
        .Case([&](GradSeedOp o) { i.op = pl::Opcode::GRAD_SEED; eps(o.getScaleAttr()); })
        .Case([&](EmbeddingGradOp o) {
          i.op = pl::Opcode::EMBEDDING_GRAD;
          i.params = {param(o.getParamAttr())};
          i.ints = {o.getVocabParallel() ? 1 : 0};
        })
        .Case([&](MatmulInputGradOp) { i.op = pl::Opcode::MATMUL_INPUT_GRAD; })
        .Case([&](MatmulWeightGradOp o) {
          i.op = pl::Opcode::MATMUL_WEIGHT_GRAD;
          i.params = {param(o.getParamAttr())};
        })
        .Case([&](BiasGradOp o) {
          i.op = pl::Opcode::BIAS_GRAD;
          i.params = {param(o.getParamAttr())};
        })
        .Case([&](LayerNormGradOp o) {
          i.op = pl::Opcode::LAYER_NORM_GRAD;
          i.params = {param(o.getWeightParamAttr()), param(o.getBiasParamAttr())};
          i.floats = {o.getEpsilon().convertToDouble(), o.getZeroCenteredGamma() ? 1.0 : 0.0};
        })
        .Case([&](RMSNormGradOp o) {
          i.op = pl::Opcode::RMS_NORM_GRAD;
          i.params = {param(o.getWeightParamAttr())};
          i.floats = {o.getEpsilon().convertToDouble(), o.getZeroCenteredGamma() ? 1.0 : 0.0};
        })
        .Case([&](GeluGradOp o) {
          i.op = pl::Opcode::GELU_GRAD;
          i.ints.push_back(o.getApproximation() == GeluApproximation::Tanh);
        })
        .Case([&](SwiGLUGradOp) { i.op = pl::Opcode::SWIGLU_GRAD; })
        .Case([&](SplitQKVGradOp o) {
          i.op = pl::Opcode::SPLIT_QKV_GRAD;
          if (FloatAttr base = o.getRopeBaseAttr()) {
            i.op = pl::Opcode::SPLIT_QKV_ROPE_GRAD;
            i.floats = {base.getValueAsDouble(), ropeScaling(o.getRopeScalingFactorAttr())};
          }
        })
        .Case([&](RopeGradOp o) {
          i.op = pl::Opcode::ROPE_GRAD;
          i.floats = {o.getBase().convertToDouble(), ropeScaling(o.getScalingFactorAttr())};
        })
        .Case([&](AttentionGradOp o) {
          i.op = pl::Opcode::ATTENTION_GRAD;
          i.ints = {o.getCausal() ? 1 : 0, int64_t(o.getStream()), shardDim(o.getTpShardDim())};
          i.floats = {o.getScale().convertToDouble(), o.getDropoutRate().convertToDouble()};
        })
        .Case([&](CrossEntropyGradOp o) {
          i.op = pl::Opcode::CROSS_ENTROPY_GRAD;
          i.ints = {o.getVocabParallel() ? 1 : 0};
        })
        // Mixture of experts. The dialect's enums number their cases as
        // plan.fbs numbers the router's ints.
        .Case([&](MoeRouterOp o) {
          i.op = pl::Opcode::MOE_ROUTER;
          routerArgs(o, i);
        })
        .Case([&](MoeRouterGradOp o) {
          i.op = pl::Opcode::MOE_ROUTER_GRAD;
          routerArgs(o, i);
        })
        .Case([&](MoePermuteOp o) {
          i.op = pl::Opcode::MOE_PERMUTE;
          i.ints = {o.getCapacityAttr().getInt(), o.getPadToCapacity() ? 1 : 0};
        })
        .Case([&](MoePermuteGradOp) { i.op = pl::Opcode::MOE_PERMUTE_GRAD; })
        // Expert parallelism: the exchange's group (4 ep, or 7 tp_ep with
        // expert tensor parallelism), the local experts, the dispatcher as
        // the dialect's enum numbers it (0 alltoall, 1 allgather),
        // expert_tensor_parallel.
        .Case([&](MoeDispatchOp o) {
          i.op = pl::Opcode::MOE_DISPATCH;
          const int64_t etp = o.getEtpSizeAttr().getInt();
          i.ints = {exchangeGroup(etp), o.getNumLocalExpertsAttr().getInt(),
                    int64_t(o.getDispatcher()), etp};
        })
        .Case([&](MoeCombineOp o) {
          i.op = pl::Opcode::MOE_COMBINE;
          const int64_t etp = o.getEtpSizeAttr().getInt();
          i.ints = {exchangeGroup(etp), o.getNumLocalExpertsAttr().getInt(),
                    int64_t(o.getDispatcher()), etp};
        })
        .Case([&](MoeGroupedMatmulOp) { i.op = pl::Opcode::GROUPED_MATMUL; })
        .Case([&](MoeGroupedMatmulInputGradOp) { i.op = pl::Opcode::GROUPED_MATMUL_INPUT_GRAD; })
        .Case([&](MoeGroupedMatmulWeightGradOp o) {
          i.op = pl::Opcode::GROUPED_MATMUL_WEIGHT_GRAD;
          i.params = {param(o.getParamAttr())};
        })
        .Case([&](MoeUnpermuteOp) { i.op = pl::Opcode::MOE_UNPERMUTE; })
        .Case([&](MoeUnpermuteGradOp) { i.op = pl::Opcode::MOE_UNPERMUTE_GRAD; })
        .Case([&](TpAllReduceOp) { i.op = pl::Opcode::ALL_REDUCE; i.ints = {kGroupTp}; })
        .Case([&](SpGatherOp) { i.op = pl::Opcode::SEQ_ALL_GATHER; i.ints = {kGroupTp}; })
        .Case([&](SpReduceScatterOp) {
          i.op = pl::Opcode::SEQ_REDUCE_SCATTER;
          i.ints = {kGroupTp};
        })
        .Case([&](SpSplitOp) { i.op = pl::Opcode::SEQ_SPLIT; i.ints = {kGroupTp}; })
        .Case([&](GradNormOp o) {
          if (o.getGroup()) {
            i.op = pl::Opcode::GROUP_GRAD_NORM;
            i.ints = {groupNumber(*o.getGroup())};
          } else {
            i.op = pl::Opcode::GRAD_NORM;
          }
        })
        .Case([&](SendOp o) {
          i.op = pl::Opcode::SEND;
          i.ints = {int64_t(o.getPeer()), int64_t(o.getTag())};
        })
        .Case([&](RecvOp o) {
          i.op = pl::Opcode::RECV;
          i.ints = {int64_t(o.getPeer()), int64_t(o.getTag())};
        })
        .Case([&](AllReduceTiedGradOp o) {
          i.op = pl::Opcode::ALL_REDUCE_TIED_GRAD;
          i.params = {param(o.getParamAttr())};
          i.ints = {int64_t(o.getPeer()), int64_t(o.getTag())};
        })
        .Case([&](LrScheduleOp o) {
          i.op = pl::Opcode::LR_SCHEDULE;
          // The plan's LrStyle and WsdStyle codes are the dialect's.
          i.ints = {int64_t(o.getStyle()),
                    int64_t(o.getWarmupIters()),
                    int64_t(o.getDecayIters()),
                    int64_t(o.getSamplesPerStep().value_or(1)),
                    int64_t(o.getWsdStyle().value_or(WsdStyle::Exponential)),
                    int64_t(o.getWsdDecayIters().value_or(0))};
          i.floats = {o.getLr().convertToDouble(), o.getMinLr().convertToDouble()};
        })
        .Case([&](ClipCoeffOp o) { i.op = pl::Opcode::CLIP_COEFF; eps(o.getMaxNormAttr()); })
        .Case([&](AllReduceGradsOp o) {
          i.op = pl::Opcode::ALL_REDUCE_GRADS;
          i.ints = {groupNumber(o.getGroup())};
          eps(o.getScaleAttr());
          if (auto ps = o.getParams())
            for (Attribute a : *ps)
              i.params.push_back(param(cast<FlatSymbolRefAttr>(a)));
        })
        .Case([&](ReduceGradsOp o) {
          i.op = pl::Opcode::REDUCE_GRADS;
          i.ints = {groupNumber(o.getGroup()), int64_t(o.getBucket()), o.getScatter() ? 1 : 0};
          eps(o.getScaleAttr());
        })
        .Case([&](ShardedGradNormOp o) {
          i.op = pl::Opcode::SHARDED_GRAD_NORM;
          i.ints = {groupNumber(o.getGroup())};
        })
        .Case([&](ShardedAdamWOp o) {
          i.op = pl::Opcode::SHARDED_ADAMW;
          if (!o.getDecoupledLr()) // the decoupled rate is the rate
            i.in.push_back(i.in[0]);
          i.ints = {int64_t(o.getBucket())};
          i.floats = {o.getBeta1().convertToDouble(), o.getBeta2().convertToDouble(),
                      o.getEpsilon().convertToDouble(), o.getWeightDecay().convertToDouble()};
        })
        .Case([&](ShardedSgdOp o) {
          i.op = pl::Opcode::SHARDED_SGD;
          if (!o.getDecoupledLr()) // the decoupled rate is the rate
            i.in.push_back(i.in[0]);
          i.ints = {int64_t(o.getBucket())};
          i.floats = {o.getMomentum().convertToDouble(), o.getWeightDecay().convertToDouble()};
        })
        .Case([&](SgdOp o) {
          i.op = pl::Opcode::SGD;
          i.params = {param(o.getParamAttr())};
          i.floats = {o.getMomentum().convertToDouble(), o.getWeightDecay().convertToDouble()};
        })
        .Case([&](AllGatherParamsOp o) {
          i.op = pl::Opcode::ALL_GATHER_PARAMS;
          i.ints = {groupNumber(o.getGroup()), int64_t(o.getBucket())};
        })
        .Case([&](AdamWOp o) {
          i.op = pl::Opcode::ADAMW;
          i.params = {param(o.getParamAttr())};
          i.floats = {o.getBeta1().convertToDouble(), o.getBeta2().convertToDouble(),
                      o.getEpsilon().convertToDouble(), o.getWeightDecay().convertToDouble()};
        })
        .Default([&](Operation *o) {
          o->emitError("plan writer: no instruction for this op");
          ok = false;
        });
    if (!ok)
      return failure();
    return i;
  }

  // Kernel-local scratch for the values a fused body keeps to itself
  // (`inside`): each lives from the op that defines it to its last use in
  // the body, and is placed best-fit among the values live at that point,
  // 256-byte aligned as in the arena. Returns the scratch size in bytes.
  static int64_t layoutScratch(Block &body, const DenseSet<Value> &inside,
                               DenseMap<Value, int64_t> &offsets) {
    constexpr int64_t kAlign = 256;
    DenseMap<Operation *, int64_t> index;
    int64_t n = 0;
    for (Operation &op : body)
      index[&op] = n++;
    struct Live {
      int64_t last, offset, size;
    };
    std::vector<Live> live; // by offset
    int64_t top = 0;
    for (Operation &op : body) {
      const int64_t i = index.lookup(&op);
      // Operands of op i stay live while its results are placed.
      llvm::erase_if(live, [&](const Live &l) { return l.last < i; });
      for (Value r : op.getResults()) {
        if (!inside.contains(r))
          continue;
        int64_t last = i;
        for (Operation *user : r.getUsers())
          last = std::max(last, index.lookup(body.findAncestorOpInBlock(*user)));
        auto t = cast<RankedTensorType>(r.getType());
        int64_t bytes = t.getNumElements() * ((t.getElementTypeBitWidth() + 7) / 8);
        int64_t size = std::max<int64_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
        int64_t at = 0, best = -1, bestGap = 0;
        for (const Live &l : live) {
          int64_t gap = l.offset - at;
          if (gap >= size && (best < 0 || gap < bestGap)) {
            best = at;
            bestGap = gap;
          }
          at = std::max(at, l.offset + l.size);
        }
        if (best < 0)
          best = at;
        offsets[r] = best;
        live.push_back({last, best, size});
        llvm::sort(live, [](const Live &a, const Live &b) { return a.offset < b.offset; });
        top = std::max(top, best + size);
      }
    }
    return top;
  }

  // One mt.fused -> one entry of the plan's kernel table; returns its index.
  // cpu_values: the body's arguments (bound to the FUSED inputs), the
  // yielded values (bound to its outputs), then the body's other values in
  // kernel-local scratch. cpu_instructions: the body's ops, lowered as
  // unfused ops are. The CUDA form (source, entry, launch geometry, scalar
  // arguments) comes from compiler/cuda/CudaKernelGen.
  FailureOr<int64_t> kernel(FusedOp fused) {
    // Every micro-batch's (and the recomputation's) copy of a layer's
    // kernel is the same entry.
    std::vector<std::pair<FusedOp, int64_t>> &same = fusedKernels[fusedHash(fused)];
    for (auto [other, index] : same)
      if (sameKernel(other, fused))
        return index;
    FailureOr<int64_t> index = newKernel(fused);
    if (succeeded(index))
      same.push_back({fused, *index});
    return index;
  }

  // What the kernel entry of an mt.fused is made of: its kind and name,
  // its operand and result types, and its body.
  static size_t fusedHash(FusedOp fused) {
    llvm::hash_code h = llvm::hash_combine(fused.getKind(), fused.getName());
    for (Type t : fused->getOperandTypes())
      h = llvm::hash_combine(h, t);
    for (Type t : fused->getResultTypes())
      h = llvm::hash_combine(h, t);
    for (Operation &op : fused.getBodyBlock())
      h = llvm::hash_combine(
          h, OperationEquivalence::computeHash(&op, OperationEquivalence::ignoreHashValue,
                                               OperationEquivalence::ignoreHashValue,
                                               OperationEquivalence::IgnoreLocations));
    return size_t(h);
  }
  static bool sameKernel(FusedOp a, FusedOp b) {
    return a.getKind() == b.getKind() && a.getName() == b.getName() &&
           a->getOperandTypes() == b->getOperandTypes() &&
           a->getResultTypes() == b->getResultTypes() &&
           OperationEquivalence::isRegionEquivalentTo(&a.getBody(), &b.getBody(),
                                                      OperationEquivalence::IgnoreLocations);
  }

  FailureOr<int64_t> newKernel(FusedOp fused) {
    Block &body = fused.getBodyBlock();
    auto yield = cast<YieldOp>(body.getTerminator());
    std::vector<fb::Offset<pl::Value>> kvalues;
    DenseMap<Value, uint32_t> numbers;
    auto add = [&](Value v, int64_t offset, const std::string &name) {
      numbers[v] = kvalues.size();
      kvalues.push_back(valueEntry(v, pl::Region::ARENA, offset, name));
    };
    for (BlockArgument a : body.getArguments())
      add(a, 0, "in" + std::to_string(a.getArgNumber()));
    for (auto [i, v] : llvm::enumerate(yield.getValues()))
      add(v, 0, "out" + std::to_string(i));
    DenseSet<Value> inside;
    for (Operation &op : body.without_terminator())
      for (Value r : op.getResults())
        if (!numbers.count(r))
          inside.insert(r);
    DenseMap<Value, int64_t> offsets;
    int64_t scratch = layoutScratch(body, inside, offsets);
    for (Operation &op : body.without_terminator())
      for (Value r : op.getResults())
        if (inside.contains(r))
          add(r, offsets.lookup(r), "%" + std::to_string(kvalues.size()));

    std::vector<fb::Offset<pl::Instruction>> insts;
    for (Operation &op : body.without_terminator()) {
      if (failed(emit(op, numbers, insts)))
        return failure();
    }
    std::string error;
    CudaKernelOptions options;
    options.tensorParallel = spec.parallel.tensor_model_parallel_size;
    // A gemm or gemm_grad kernel has no CUDA source: cuBLASLt runs it (its
    // GPU steps).
    const bool gemm = fused.getKind() == FusionKind::Gemm || fused.getKind() == FusionKind::GemmGrad;
    std::optional<CudaKernel> cuda =
        gemm ? CudaKernel() : generateCudaKernel(fused, options, &error);
    if (!cuda) {
      fused.emitError("plan writer: kernel '") << fused.getName() << "': " << error;
      return failure();
    }
    return kernelEntry(fused.getName().str(), *cuda, fbb.CreateVector(kvalues),
                       fbb.CreateVector(insts), uint64_t(scratch));
  }

  // One copy of each distinct string in the file: every layer's kernel
  // (and every micro-batch's copy of it) has the same source.
  fb::Offset<fb::String> sharedString(const std::string &s) {
    auto [it, inserted] = strings.try_emplace(s);
    if (inserted)
      it->second = fbb.CreateString(s);
    return it->second;
  }

  // One copy of each distinct vector, table or step: a pipeline stage
  // repeats its layers' instructions for every micro-batch, and most of
  // their ints, shapes, GEMM descriptors and steps on weights are equal.
  // FlatBuffers objects may be referenced any number of times; the key is
  // the content's bytes (or the offsets of already shared parts), tagged by
  // kind.
  template <class T> fb::uoffset_t sharedObject(char tag, const void *bytes, size_t n, T make) {
    objectKey.assign(1, tag);
    objectKey.append(static_cast<const char *>(bytes), static_cast<const char *>(bytes) + n);
    auto [it, inserted] = objects.try_emplace(objectKey.str(), 0);
    if (inserted)
      it->second = make();
    return it->second;
  }
  template <class T> fb::Offset<fb::Vector<T>> sharedVector(char tag, const std::vector<T> &v) {
    static_assert(std::is_arithmetic_v<T> || std::is_same_v<T, fb::Offset<pl::GpuStep>>);
    return sharedObject(tag, v.data(), v.size() * sizeof(T),
                        [&] { return fbb.CreateVector(v).o; });
  }
  fb::Offset<pl::Gemm> sharedGemm(const GemmSpec &g) {
    const int64_t f[] = {g.m,         g.n,         g.k,         g.transA,       g.transB,
                         g.lda,       g.ldb,       g.ldd,       int64_t(g.aType), int64_t(g.bType),
                         int64_t(g.dType), g.accumulate, int64_t(g.epilogue), int64_t(g.biasType),
                         g.batch,     g.strideA,   g.strideB,   g.strideD};
    return sharedObject('G', f, sizeof f, [&] {
      return pl::CreateGemm(fbb, g.m, g.n, g.k, g.transA, g.transB, g.lda, g.ldb, g.ldd, g.aType,
                            g.bType, g.dType, g.accumulate, g.epilogue, g.biasType, g.batch,
                            g.strideA, g.strideB, g.strideD)
          .o;
    });
  }
  fb::Offset<pl::GpuStep> sharedStep(const GpuStepSpec &s) {
    const int64_t kernel = s.kernel;
    std::vector<uint64_t> key;
    for (const GpuArgSpec &a : s.args)
      key.insert(key.end(), {uint64_t(a.kind), a.index});
    fb::Offset<fb::Vector<const pl::GpuArg *>> args(
        sharedObject('A', key.data(), key.size() * 8, [&] {
          std::vector<pl::GpuArg> v;
          for (const GpuArgSpec &a : s.args)
            v.emplace_back(a.kind, a.index);
          return fbb.CreateVectorOfStructs(v).o;
        }));
    fb::Offset<pl::Gemm> gemm;
    if (s.kind == pl::GpuStepKind::GEMM)
      gemm = sharedGemm(s.gemm);
    const uint64_t f[] = {uint64_t(s.kind), uint64_t(kernel), args.o,         gemm.o,
                          s.count,          uint64_t(s.element), uint64_t(s.group),
                          uint64_t(s.reduce)};
    return sharedObject('S', f, sizeof f, [&] {
      return pl::CreateGpuStep(fbb, s.kind, int32_t(kernel), args, gemm, s.count, s.element,
                               s.group, s.reduce)
          .o;
    });
  }

  ModuleOp module;
  const spec::Spec &spec;
  GpuKernelOptions kernelOptions;
  fb::FlatBufferBuilder fbb{1 << 16};
  std::map<std::string, fb::Offset<fb::String>> strings;
  llvm::StringMap<fb::uoffset_t> objects; // sharedObject
  llvm::SmallString<256> objectKey;
  llvm::StringMap<uint32_t> paramIndex;
  std::vector<fb::Offset<pl::Value>> values;
  DenseMap<Value, uint32_t> valueIndex;
  std::vector<fb::Offset<pl::Kernel>> kernels; // one per mt.fused, in program order
  std::vector<CudaKernel> fusedCuda;            // the CUDA form of each kernel, by index
  std::vector<GpuValueInfo> valueInfo;          // the program's values, as `values`
  std::vector<GpuParamInfo> paramInfo;          // the stage's parameters
  std::optional<GpuShardLayout> shardLayout;    // the stage's distributed-optimizer layout
  GpuReduceLayout reduceLayout;                 // the stage's buckets and data-parallel groups
  // The stage's lowered instructions (loweringKey) with the instruction
  // first lowered, and its lowered mt.fused kernels (sameKernel).
  std::unordered_map<std::string, std::pair<GpuLowering, GpuInstruction>> lowerings;
  std::unordered_map<size_t, std::vector<std::pair<FusedOp, int64_t>>> fusedKernels;
  uint64_t kernelWorkspace = 0;
  uint64_t microBatchSlots = 0; // the micro-batches the stage's instructions name
  // "mt.offsets", "mt.slot_offsets", the first/last micro-batch marks.
  StringAttr offsetsName, slotOffsetsName, firstMarkName, lastMarkName;
  bool pipelined = false; // the program being written is a pipelined train_step
  std::vector<std::string> valueNames;
};

} // namespace

std::string modelFingerprint(ModuleOp module) {
  std::string s;
  for (ParamOp p : module.getOps<ParamOp>())
    s += p.getSymName().str() + ":" + shapeKey(p.getTensorType()) +
         // --apply-layernorm-1p's weights hold w of 1 + w: another model's
         // checkpoint must not load into them unnoticed.
         (p->hasAttr("mt.applied_as_one_plus") ? "+1" : "") + ";";
  // FNV-1a keeps the fingerprint short; the parameter count makes a
  // mismatch readable at a glance.
  uint64_t h = fnv1a(s);
  int64_t count = 0;
  for (ParamOp p : module.getOps<ParamOp>())
    count += p.getNumElements();
  char buf[64];
  snprintf(buf, sizeof buf, "%lld params, shapes %016llx", (long long)count,
           (unsigned long long)h);
  return buf;
}

FailureOr<std::string> buildPlanPayload(ModuleOp module, const spec::Spec &spec,
                                        const GpuKernelOptions &kernels) {
  return Writer(module, spec, kernels).run();
}

} // namespace mt
