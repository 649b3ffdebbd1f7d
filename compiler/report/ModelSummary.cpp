// Model summary from the IR (see ModelSummary.h).
#include "compiler/report/ModelSummary.h"

#include "dialects/mt/MtOps.h"
#include "passes/StageModules.h"
#include "runtime/base/batch_rampup.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

#include <cstdio>

using namespace mlir;

namespace mt {
namespace {

// Component of a parameter, from its Megatron-LM name.
const char *componentOf(StringRef name) {
  if (name.starts_with("embedding.word_embeddings"))
    return "word embeddings";
  if (name.starts_with("embedding.position_embeddings"))
    return "position embeddings";
  if (name.contains(".self_attention."))
    return "attention";
  if (name.contains(".mlp.router."))
    return "router";
  if (name.contains(".mlp.experts."))
    return "experts";
  if (name.contains(".mlp.shared_experts."))
    return "shared experts";
  if (name.contains(".mlp."))
    return "mlp";
  if (name.starts_with("decoder.layers."))
    return "layer norms";
  if (name.starts_with("decoder.final_layernorm"))
    return "final norm";
  if (name.starts_with("output_layer"))
    return "output layer";
  return "other";
}

std::string withCommas(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0)
      out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

// 46.70B, 12.88B, 125.03M: parameters as model names give them.
std::string billions(int64_t v) {
  char buf[32];
  if (v >= 1000000000)
    std::snprintf(buf, sizeof(buf), "%.2fB", double(v) / 1e9);
  else
    std::snprintf(buf, sizeof(buf), "%.2fM", double(v) / 1e6);
  return buf;
}

// Shortest faithful form of a small float: 1e-05, 0.1, 0.02.
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

std::string typeName(Type t) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << t;
  return s;
}

std::string dims(const std::vector<int64_t> &d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i)
    s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// The parameter read by `v`, if `v` is an mt.param_ref.
StringRef paramName(Value v) {
  if (auto ref = v.getDefiningOp<ParamRefOp>())
    return ref.getName();
  return "";
}

} // namespace

ModelSummary summarizeModel(ModuleOp module, const spec::Spec &spec) {
  ModelSummary s;
  static const char *order[] = {"word embeddings", "position embeddings",
                                "attention",       "mlp",
                                "router",          "experts",
                                "shared experts",  "layer norms",
                                "final norm",      "output layer",
                                "other"};
  for (const char *c : order)
    s.components.push_back({c, 0});
  // The model's parameters, whole: a tensor-parallel shard counts as the
  // parameter it is part of.
  for (auto param : module.getOps<ParamOp>()) {
    const char *c = componentOf(param.getSymName());
    int64_t count = 1;
    for (int64_t d : param.getLogicalShape())
      count *= d;
    for (auto &comp : s.components)
      if (comp.name == c)
        comp.params += count;
    s.totalParams += count;
    ++s.numParamTensors;
  }
  const spec::ParamCount analytic = spec::countParameters(spec.model, spec.paddedVocabSize());
  s.analyticParams = analytic.total(spec.model.num_layers);
  s.analyticActiveParams = analytic.active(spec.model.num_layers);
  // Each MoE layer's experts are num_experts equal MLPs, of which a token
  // uses moe_router_topk.
  s.activeParams = s.totalParams;
  for (const auto &comp : s.components)
    if (comp.name == "experts" && spec.model.num_experts > 0)
      s.activeParams -= comp.params - comp.params / spec.model.num_experts *
                                          spec.model.moe_router_topk;

  auto addShape = [&](const char *name, Value v) {
    auto t = cast<RankedTensorType>(v.getType());
    s.shapes.push_back({name, std::vector<int64_t>(t.getShape().begin(), t.getShape().end()),
                        typeName(t.getElementType())});
  };
  // The forward graph: @forward before mt-autodiff, @eval_step after it; in
  // every pipeline stage when mt-partition-pp has split the model. A stage's
  // programs are unrolled over micro-batches: its operations of micro-batch 0
  // are one micro-batch's, as an unpipelined program's are.
  const StringAttr microBatchName = StringAttr::get(module.getContext(), "mt.micro_batch");
  auto firstMicroBatch = [&](Operation *op) {
    auto mb = op->getAttrOfType<IntegerAttr>(microBatchName);
    return !mb || mb.getInt() == 0;
  };
  auto countOps = [&](func::FuncOp f) {
    // Top-level operations: a fused kernel counts once.
    return int64_t(llvm::count_if(f.getBody().front().without_terminator(),
                                  [&](Operation &op) { return firstMicroBatch(&op); }));
  };
  SmallVector<func::FuncOp> forwards;
  SmallVector<ModuleOp> stages = stageModules(module);
  s.numStages = int64_t(stages.size());
  for (ModuleOp stage : stages) {
    auto func = stage.lookupSymbol<func::FuncOp>("forward");
    if (!func)
      func = stage.lookupSymbol<func::FuncOp>("eval_step");
    if (!func)
      continue;
    forwards.push_back(func);
    s.numOps += countOps(func);
    if (auto train = stage.lookupSymbol<func::FuncOp>("train_step"))
      s.numTrainOps += countOps(train);
  }
  if (forwards.empty())
    return s;
  addShape("tokens", forwards.front().getArgument(0));
  bool haveHidden = false, haveQKV = false, haveFFN = false, haveExpertRows = false,
       haveExpertFFN = false;
  for (func::FuncOp func : forwards)
    func.walk([&](Operation *op) {
      if (!firstMicroBatch(op))
        return;
      // The residual stream, as the first norm reads it (a sequence shard
      // under sequence parallelism).
      if (isa<LayerNormOp, RMSNormOp>(op) && !haveHidden) {
        addShape("hidden", op->getOperand(0));
        haveHidden = true;
      } else if (auto q = dyn_cast<SplitQKVOp>(op); q && !haveQKV) {
        addShape("qkv", q.getInput());
        addShape("query", q.getQuery());
        addShape("key/value", q.getKey());
        haveQKV = true;
      } else if (auto mm = dyn_cast<MatmulOp>(op)) {
        StringRef w = paramName(mm.getWeight());
        if (!haveFFN && w.contains("linear_fc1")) {
          addShape("mlp intermediate", mm.getResult());
          haveFFN = true;
        }
      } else if (auto perm = dyn_cast<MoePermuteOp>(op); perm && !haveExpertRows) {
        // The tokens gathered expert by expert: T * topk rows, or the
        // capacity's.
        addShape("expert rows", perm.getResult());
        haveExpertRows = true;
      } else if (auto gm = dyn_cast<MoeGroupedMatmulOp>(op)) {
        if (!haveExpertFFN && paramName(gm.getWeight()).contains("experts.linear_fc1")) {
          addShape("expert ffn", gm.getResult());
          haveExpertFFN = true;
        }
      } else if (auto ce = dyn_cast<CrossEntropyOp>(op)) {
        addShape("logits", ce.getLogits());
      }
    });
  return s;
}

void printSummaryText(llvm::raw_ostream &os, const ModelSummary &s,
                      const spec::Spec &spec) {
  const auto &m = spec.model;
  const auto &p = spec.parallel;
  const auto &t = spec.training;
  bool rope = m.position_embedding_type == spec::PositionEmbedding::Rope;
  os << "mtc: " << spec.source << "\n\n";
  os << "model\n";
  os << llvm::formatv("  layers {0}, hidden {1}, FFN {2} ({3}), heads {4}, "
                      "query groups {5}, head dim {6}\n",
                      m.num_layers, m.hidden_size, m.ffn_hidden_size,
                      m.swiglu ? "SwiGLU" : "GeLU", m.num_attention_heads,
                      m.num_query_groups, m.kv_channels);
  std::string scaling =
      m.use_rope_scaling ? ", Llama 3.1 scaling factor " + num(m.rope_scaling_factor) : "";
  os << "  positions "
     << (rope ? "rope (base " + std::to_string(m.rotary_base) + scaling + ")"
              : "learned_absolute (" + std::to_string(m.max_position_embeddings) + ")")
     << ", " << spec::toString(m.normalization) << " (eps " << num(m.norm_epsilon)
     << (m.apply_layernorm_1p ? ", weights applied as 1 + w" : "") << "), "
     << (m.untie_embeddings_and_output_weights ? "untied" : "tied")
     << " embeddings, " << (m.add_bias_linear ? "with" : "no") << " linear biases\n";
  if (m.num_experts > 0) {
    // The MoE layers, as Megatron's flags describe them.
    const int64_t moeLayers = m.numMoeLayers();
    os << "  mixture of experts in " << moeLayers << " of " << m.num_layers << " layers: "
       << m.num_experts << " experts of FFN " << m.moe_ffn_hidden_size << ", top-"
       << m.moe_router_topk << " " << spec::toString(m.moe_router_score_function)
       << (m.moe_router_pre_softmax ? " (pre-softmax)" : "");
    if (m.moe_router_topk_scaling_factor > 0)
      os << " scaled by " << num(m.moe_router_topk_scaling_factor);
    if (m.moe_shared_expert_intermediate_size > 0)
      os << ", shared expert FFN " << m.moe_shared_expert_intermediate_size;
    os << "\n    load balancing " << spec::toString(m.moe_router_load_balancing_type);
    if (m.moe_router_load_balancing_type != spec::MoeLoadBalancing::None)
      os << " (coeff " << num(m.moe_aux_loss_coeff) << ")";
    if (m.moe_z_loss_coeff > 0)
      os << ", z-loss (coeff " << num(m.moe_z_loss_coeff) << ")";
    if (m.moe_expert_capacity_factor > 0)
      os << ", capacity factor " << num(m.moe_expert_capacity_factor) << " (drop by "
         << spec::toString(m.moe_token_drop_policy)
         << (m.moe_pad_expert_input_to_capacity ? ", padded to capacity" : "") << ")";
    else
      os << ", no token dropped";
    if (m.moe_router_dtype != spec::MoeRouterDtype::None)
      os << ", routing in " << spec::toString(m.moe_router_dtype);
    os << "\n";
  }
  os << "  dropout hidden " << num(m.hidden_dropout) << ", attention "
     << num(m.attention_dropout) << "; init std " << num(m.init_method_std) << "\n";
  int64_t padded = spec.paddedVocabSize();
  os << "  vocabulary " << m.vocab_size;
  if (padded != m.vocab_size)
    os << " padded to " << padded << " (multiple of "
       << m.make_vocab_size_divisible_by << " x tp " << p.tensor_model_parallel_size
       << ")";
  os << "\n";
  // The tokenizer the vocabulary and mock data's end of document come from.
  const spec::DataConfig &d = spec.data;
  if (!d.tokenizer.empty())
    os << "  tokenizer " << d.tokenizer << "\n";
  else if (!d.tokenizer_unread.empty() && d.mock_data)
    os << "  mock data ends documents with " << d.eod_id
       << " (vocab_size - 1): mtc did not read the tokenizer (" << d.tokenizer_unread
       << ")\n";
  os << "\n";

  os << "run\n";
  os << llvm::formatv("  sequence {0}, micro-batch {1}, global batch {2} "
                      "({3} micro-batches x dp {4}), {5} iterations\n",
                      m.seq_length, t.micro_batch_size, t.global_batch_size,
                      spec.numMicroBatches(), p.data_parallel_size, t.train_iters);
  if (t.sampleBased()) {
    // Sample-based training: the iterations are derived, as Megatron's
    // update_train_iters derives them; the ramp-up's batches and where it ends.
    os << "  sample-based: " << withCommas(t.train_samples) << " samples";
    if (t.rampup_batch_size.size() == 3) {
      rt::BatchRampup r{t.rampup_batch_size[0], t.rampup_batch_size[1], t.rampup_batch_size[2],
                        t.global_batch_size};
      std::vector<rt::BatchChange> changes;
      rt::rampup_train_iters(r, t.train_samples, &changes);
      os << "; batch ramp-up " << r.start << " -> " << r.global << " by " << r.increment
         << " over " << withCommas(r.samples) << " samples";
      if (!changes.empty() && changes.back().batch == r.global)
        os << ", the full batch from iteration " << withCommas(changes.back().iteration + 1);
      else if (!changes.empty())
        os << ", ending at a batch of " << changes.back().batch;
    }
    os << "\n  learning rate in samples: warmup " << withCommas(t.lr_warmup_samples)
       << ", decay " << withCommas(t.lr_decay_samples);
    if (t.lr_decay_style == spec::LrDecayStyle::WSD)
      os << ", anneal " << withCommas(t.lr_wsd_decay_samples);
    os << "\n";
  }
  os << llvm::formatv("  tp {0} x pp {1} x dp {2} = {3} GPU{4} ({5} node{6} x {7} "
                      "GPU{8}, {9})",
                      p.tensor_model_parallel_size, p.pipeline_model_parallel_size,
                      p.data_parallel_size, spec.worldSize(),
                      spec.worldSize() == 1 ? "" : "s", spec.cluster.nodes,
                      spec.cluster.nodes == 1 ? "" : "s", spec.cluster.gpus_per_node,
                      spec.cluster.gpus_per_node == 1 ? "" : "s", spec.cluster.device);
  if (p.virtual_pipeline_model_parallel_size > 1)
    os << ", interleaved x" << p.virtual_pipeline_model_parallel_size;
  if (p.sequence_parallel)
    os << ", sequence parallel";
  if (p.use_distributed_optimizer)
    os << ", distributed optimizer";
  os << "\n  precision " << spec::toString(t.precision);
  if (t.grad_reduce_in_bf16)
    os << " with bf16 gradients (accumulated and reduced in bf16)";
  os << ", recompute "
     << spec::toString(p.recompute_granularity);
  if (t.optimizer == spec::Optimizer::SGD)
    os << ", SGD with momentum " << num(t.sgd_momentum);
  if (t.decoupled_lr > 0)
    os << ", decoupled lr " << num(t.decoupled_lr) << " (min " << num(t.decoupled_min_lr)
       << ") for the word embeddings and output layer";
  os << "\n";
  if (t.calculate_per_token_loss)
    os << "  loss per token of the global batch ("
       << withCommas(t.global_batch_size * m.seq_length)
       << " tokens an iteration, every label counted: equal to the per-micro-batch mean)\n";
  // The training log's extras, where they change what mtrun prints.
  std::vector<std::string> logs;
  if (t.log_throughput)
    logs.push_back(llvm::formatv("throughput ({0:E3} FLOPs per iteration)",
                                 spec.flopsPerIteration()));
  if (t.log_params_norm)
    logs.push_back("params norm");
  if (t.log_num_zeros_in_grad)
    logs.push_back("num zeros");
  if (t.timing_log_level > 0)
    logs.push_back("timers level " + std::to_string(t.timing_log_level) + " (" +
                   t.timing_log_option + ")");
  if (t.log_memory_to_tensorboard)
    logs.push_back("memory to TensorBoard");
  if (!t.power_log.empty())
    logs.push_back("power to " + t.power_log + " every " +
                   std::to_string(t.power_log_interval_ms) + " ms");
  if (!logs.empty())
    os << "  logs " << llvm::join(logs, ", ") << "\n";
  // (fp16 has it off by Megatron's rule: its loss scaling skips those steps.)
  if (!t.check_for_nan_in_loss_and_grad && t.precision != spec::Precision::FP16)
    os << "  NaN/Inf check off: a NaN or Inf loss or gradient does not stop the run\n";
  os << "\n";

  os << llvm::formatv("{0,-24}{1,16}{2,9}\n", "parameters", "count", "share");
  for (const auto &c : s.components) {
    if (c.params == 0 && c.name != "output layer")
      continue;
    std::string label = c.name;
    if (c.name == "attention" || c.name == "layer norms")
      label += " (x" + std::to_string(m.num_layers) + ")";
    else if (c.name == "mlp")
      label += " (x" + std::to_string(m.num_layers - m.numMoeLayers()) + ")";
    else if (c.name == "router" || c.name == "experts" || c.name == "shared experts")
      label += " (x" + std::to_string(m.numMoeLayers()) + ")";
    if (c.name == "output layer" && c.params == 0)
      label += " (tied)";
    double share = s.totalParams ? 100.0 * c.params / s.totalParams : 0.0;
    os << llvm::formatv("  {0,-22}{1,16}{2,8:F1}%\n", label, withCommas(c.params), share);
  }
  os << llvm::formatv("  {0,-22}{1,16}", "total", withCommas(s.totalParams));
  if (m.num_experts > 0)
    os << "  (" << billions(s.totalParams) << ")";
  os << "\n";
  if (m.num_experts > 0)
    os << llvm::formatv("  {0,-22}{1,16}  ({2}: {3} of {4} experts per MoE layer)\n",
                        "active per token", withCommas(s.activeParams),
                        billions(s.activeParams), m.moe_router_topk, m.num_experts);
  const bool matches = s.analyticParams == s.totalParams &&
                       s.analyticActiveParams == s.activeParams;
  os << llvm::formatv("  {0,-22}{1,16}  {2}\n", "analytic formula",
                      withCommas(s.analyticParams),
                      matches ? "(matches the IR)" : "(DIFFERS from the IR)");
  os << "\n";

  os << (spec.parallel.tensor_model_parallel_size > 1
             ? "activations (per micro-batch, on each tensor-parallel rank)\n"
             : "activations (per micro-batch)\n");
  for (const auto &sh : s.shapes)
    os << llvm::formatv("  {0,-18}{1} {2}\n", sh.name, dims(sh.dims), sh.dtype);
  os << "\nIR: " << s.numParamTensors << " parameter tensors, " << s.numOps
     << " forward operations, " << s.numTrainOps << " in the training step";
  if (s.numStages > 1)
    os << " (one micro-batch's, summed over " << s.numStages
       << " pipeline stages with their sends and receives)";
  os << "\n";
}

void printSummaryJson(llvm::raw_ostream &os, const ModelSummary &s,
                      const spec::Spec &spec) {
  llvm::json::Object components;
  for (const auto &c : s.components)
    components[c.name] = c.params;
  llvm::json::Array shapes;
  for (const auto &sh : s.shapes)
    shapes.push_back(llvm::json::Object{
        {"name", sh.name}, {"shape", llvm::json::Array(sh.dims)}, {"dtype", sh.dtype}});
  llvm::json::Object root{
      {"spec", spec.source},
      {"parameters", llvm::json::Object{{"total", s.totalParams},
                                        {"active", s.activeParams},
                                        {"analytic", s.analyticParams},
                                        {"analytic_active", s.analyticActiveParams},
                                        {"tensors", s.numParamTensors},
                                        {"components", std::move(components)}}},
      {"vocab_size", spec.model.vocab_size},
      {"padded_vocab_size", spec.paddedVocabSize()},
      {"world_size", spec.worldSize()},
      {"micro_batches", spec.numMicroBatches()},
      {"activations", std::move(shapes)},
      {"forward_ops", s.numOps},
      {"train_step_ops", s.numTrainOps},
      {"pipeline_stages", s.numStages},
  };
  os << llvm::formatv("{0:2}", llvm::json::Value(std::move(root))) << "\n";
}

} // namespace mt
