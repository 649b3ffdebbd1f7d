// plan.bin's training table and the programs' named inputs and outputs, as
// the training loop (runtime/train/train_loop.cpp) uses them: every scalar it
// turns into a loop bound, an allocation size or a divisor is range-checked,
// and every input it fills or output it reads is present with the shape and
// dtype it assumes (tokens and labels [micro_batch_size, seq_length] i32, the
// scalars f32 or i64), so that no value read from the file reaches memory
// unchecked. The verifier (plan_verifier.cpp) runs it before its other
// checks of the training table.
#include "runtime/plan/plan_verifier.h"

#include "runtime/plan/plan_reader.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

namespace mt::rt::detail {

namespace pl = mt::plan;

namespace {

// The spec's integer keys stop at 2^31 - 1 and its *_samples keys at 10^15
// (docs/spec.md); a plan mtc writes stays inside these.
constexpr int64_t kMaxInt = 2147483647;
constexpr int64_t kMaxSamples = 1000000000000000;
// Sample counts the loop and the data indices compute (iterations x global
// batch, evaluations x eval_iters x global batch) stay below this.
constexpr int64_t kMaxSampleProduct = int64_t(1) << 62;
// A parallel dimension; far above any cluster, far below overflow of their product.
constexpr int64_t kMaxParallel = 1 << 20;
// A CPU or GPU buffer's size in the plan: 4 PiB. Beyond it no machine has the
// memory, and doubling it (the CPU executor holds 16-bit values as f32) stays exact.
constexpr uint64_t kMaxBufferBytes = uint64_t(1) << 52;

std::string range_error(const std::string &field, int64_t v, int64_t lo, int64_t hi) {
  return field + " is " + std::to_string(v) + "; it must be from " + std::to_string(lo) +
         " to " + grouped(uint64_t(hi));
}

std::string str(const flatbuffers::String *s) { return s ? s->str() : std::string(); }

// Whether s is well-formed UTF-8 (no overlong forms, surrogates or code
// points past U+10FFFF); *at is the offset of the first bad byte.
bool valid_utf8(const std::string &s, size_t *at) {
  const auto *p = reinterpret_cast<const unsigned char *>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = p[i];
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xbf; // the second byte's range
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      lo = c == 0xe0 ? 0xa0 : 0x80;
      hi = c == 0xed ? 0x9f : 0xbf;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      lo = c == 0xf0 ? 0x90 : 0x80;
      hi = c == 0xf4 ? 0x8f : 0xbf;
    } else {
      *at = i;
      return false;
    }
    if (i + len > n || p[i + 1] < lo || p[i + 1] > hi) {
      *at = i;
      return false;
    }
    for (size_t k = 2; k < len; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xbf) {
        *at = i;
        return false;
      }
    i += len;
  }
  return true;
}

// The plan's text that ends up in checkpoints, logs and TensorBoard.
std::string check_text(const pl::Plan &plan) {
  std::vector<std::pair<std::string, const flatbuffers::String *>> texts = {
      {"spec_toml", plan.spec_toml()},
      {"producer", plan.producer()},
      {"model_fingerprint", plan.model_fingerprint()}};
  if (const pl::Training *t = plan.training()) {
    texts.push_back({"training.precision", t->precision()});
    texts.push_back({"training.save", t->save()});
    texts.push_back({"training.load", t->load()});
    texts.push_back({"training.split", t->split()});
    texts.push_back({"training.optimizer", t->optimizer()});
    texts.push_back({"training.power_log", t->power_log()});
    for (size_t i = 0; i < vsize(t->data_paths()); ++i)
      texts.push_back({"training.data_paths[" + std::to_string(i) + "]",
                       t->data_paths()->Get(uint32_t(i))});
  }
  for (size_t r = 0; r < vsize(plan.ranks()); ++r) {
    const pl::Rank &rank = *plan.ranks()->Get(uint32_t(r));
    for (size_t i = 0; i < vsize(rank.params()); ++i)
      texts.push_back({"rank " + std::to_string(rank.rank()) + ": parameter " +
                           std::to_string(i) + "'s name",
                       rank.params()->Get(uint32_t(i))->name()});
  }
  for (const auto &[what, s] : texts) {
    size_t at = 0;
    if (!valid_utf8(str(s), &at))
      return what + " is not valid UTF-8 (byte " + grouped(at) + ")";
  }
  return "";
}

// world_size = tensor x pipeline x data parallel, and each rank's place in them.
std::string check_parallel(const pl::Plan &plan) {
  const std::pair<const char *, int64_t> dims[] = {{"tensor_parallel", plan.tensor_parallel()},
                                                   {"pipeline_parallel", plan.pipeline_parallel()},
                                                   {"data_parallel", plan.data_parallel()},
                                                   {"world_size", plan.world_size()}};
  for (const auto &[name, v] : dims)
    if (v < 1 || v > kMaxParallel)
      return range_error(name, v, 1, kMaxParallel);
  const int64_t tp = plan.tensor_parallel(), pp = plan.pipeline_parallel(),
                dp = plan.data_parallel();
  if (tp * pp * dp != plan.world_size())
    return "world_size " + std::to_string(plan.world_size()) + " is not tensor_parallel " +
           std::to_string(tp) + " x pipeline_parallel " + std::to_string(pp) +
           " x data_parallel " + std::to_string(dp);
  // The expert layout (parallel_groups.h): ep x etp ranks split each
  // stage's tensor x data parallel ones.
  const int64_t ep = plan.expert_model_parallel(), etp = plan.expert_tensor_parallel();
  if (ep < 1 || ep > kMaxParallel)
    return range_error("expert_model_parallel", ep, 1, kMaxParallel);
  if (etp < 1 || etp > kMaxParallel)
    return range_error("expert_tensor_parallel", etp, 1, kMaxParallel);
  if ((tp * dp) % (ep * etp) != 0)
    return "expert_model_parallel " + std::to_string(ep) + " x expert_tensor_parallel " +
           std::to_string(etp) + " does not divide tensor_parallel " + std::to_string(tp) +
           " x data_parallel " + std::to_string(dp);
  for (size_t r = 0; r < vsize(plan.ranks()); ++r) {
    const pl::Rank &rank = *plan.ranks()->Get(uint32_t(r));
    const std::string who = "rank table entry " + std::to_string(r);
    const std::pair<const char *, std::pair<int64_t, int64_t>> places[] = {
        {"rank", {rank.rank(), plan.world_size()}},
        {"tp_rank", {rank.tp_rank(), tp}},
        {"pp_rank", {rank.pp_rank(), pp}},
        {"dp_rank", {rank.dp_rank(), dp}}};
    for (const auto &[name, vr] : places)
      if (vr.first < 0 || vr.first >= vr.second)
        return who + ": " + range_error(name, vr.first, 0, vr.second - 1);
    const std::pair<const char *, uint64_t> sizes[] = {
        {"state_bytes", rank.state_bytes()},
        {"arena_bytes", rank.arena_bytes()},
        {"kernel_workspace_bytes", rank.kernel_workspace_bytes()}};
    for (const auto &[name, v] : sizes)
      if (v > kMaxBufferBytes)
        return "rank " + std::to_string(rank.rank()) + ": " + name + " is " + grouped(v) +
               "; it must be at most " + grouped(kMaxBufferBytes) + " (4 PiB)";
  }
  for (size_t k = 0; k < vsize(plan.kernels()); ++k) {
    const pl::Kernel &kern = *plan.kernels()->Get(uint32_t(k));
    if (kern.cpu_scratch_bytes() > kMaxBufferBytes)
      return "kernel " + std::to_string(k) + " (" + str(kern.name()) + "): cpu_scratch_bytes is " +
             grouped(kern.cpu_scratch_bytes()) + "; it must be at most " +
             grouped(kMaxBufferBytes) + " (4 PiB)";
  }
  return "";
}

// Every scalar of the training table the loop uses, in its range.
std::string check_training_scalars(const pl::Training &t) {
  struct Range {
    const char *name;
    int64_t v, lo, hi;
  };
  const Range ranges[] = {
      {"micro_batch_size", t.micro_batch_size(), 1, kMaxInt},
      {"global_batch_size", t.global_batch_size(), 1, kMaxInt},
      {"num_micro_batches", t.num_micro_batches(), 1, kMaxInt},
      {"seq_length", t.seq_length(), 1, kMaxInt},
      {"vocab_size", t.vocab_size(), 1, kMaxInt},
      {"padded_vocab_size", t.padded_vocab_size(), t.vocab_size(), kMaxInt},
      {"train_iters", t.train_iters(), 0, kMaxSamples},
      {"train_samples", t.train_samples(), 0, kMaxSamples},
      {"log_interval", t.log_interval(), 0, kMaxInt},
      {"eval_interval", t.eval_interval(), 0, kMaxInt},
      {"eval_iters", t.eval_iters(), 0, kMaxInt},
      {"save_interval", t.save_interval(), 0, kMaxInt},
      {"loss_scale_window", t.loss_scale_window(), 0, kMaxInt},
      {"hysteresis", t.hysteresis(), 0, kMaxInt},
      {"timing_log_level", t.timing_log_level(), 0, 2},
      {"rampup_start", t.rampup_start(), 0, kMaxInt},
      {"rampup_increment", t.rampup_increment(), 0, kMaxInt},
      {"rampup_samples", t.rampup_samples(), 0, kMaxSamples},
      {"power_log_interval_ms", t.power_log_interval_ms(), 0, kMaxInt},
      {"ckpt_step", t.ckpt_step(), -1, kMaxSamples},
      // -1: none (mock data then ends documents with vocab_size - 1).
      {"eod_id", t.eod_id(), -1, std::max<int64_t>(t.padded_vocab_size(), 1) - 1},
      {"moe_layers", t.moe_layers(), 0, kMaxInt},
  };
  for (const Range &r : ranges)
    if (r.v < r.lo || r.v > r.hi)
      return range_error(std::string("training.") + r.name, r.v, r.lo, r.hi);
  // What the loop and the data indices multiply (no overflow: each factor < 2^50).
  const __int128 gbs = t.global_batch_size();
  const __int128 evals =
      t.eval_interval() > 0 ? __int128(t.train_iters() / t.eval_interval() + 1) : 1;
  if (__int128(t.train_iters()) * gbs > kMaxSampleProduct ||
      evals * t.eval_iters() * gbs > kMaxSampleProduct)
    return "training: train_iters " + std::to_string(t.train_iters()) + ", eval_iters " +
           std::to_string(t.eval_iters()) + " and global_batch_size " +
           std::to_string(t.global_batch_size()) + " ask for more than 2^62 samples";
  const std::pair<const char *, double> reals[] = {
      {"flops_per_iteration", t.flops_per_iteration()},
      {"clip_grad", t.clip_grad()},
      {"min_loss_scale", t.min_loss_scale()},
      {"initial_loss_scale", t.initial_loss_scale()},
      {"moe_z_loss_coeff", t.moe_z_loss_coeff()}};
  for (const auto &[name, v] : reals)
    if (!std::isfinite(v) || v < 0)
      return std::string("training.") + name + " is " + std::to_string(v) +
             "; it must be finite and >= 0";
  const std::string precision = str(t.precision());
  if (precision != "fp32" && precision != "bf16" && precision != "fp16")
    return "training.precision is '" + precision + "'; it must be fp32, bf16 or fp16";
  if (precision == "fp16" && !(t.initial_loss_scale() > 0 && t.min_loss_scale() > 0))
    return "training: an fp16 plan needs initial_loss_scale and min_loss_scale > 0";
  const std::string optimizer = str(t.optimizer());
  if (!optimizer.empty() && optimizer != "adam" && optimizer != "sgd")
    return "training.optimizer is '" + optimizer + "'; it must be adam or sgd";
  const std::string balancing = str(t.moe_load_balancing_type());
  if (t.moe_layers() > 0 ? balancing != "aux_loss" && balancing != "seq_aux_loss" &&
                               balancing != "none"
                         : !balancing.empty() || t.moe_z_loss_coeff() != 0)
    return "training.moe_load_balancing_type is '" + balancing + "' with moe_layers " +
           std::to_string(t.moe_layers()) +
           (t.moe_layers() > 0 ? "; it must be aux_loss, seq_aux_loss or none"
                               : "; a dense plan has no router losses");
  const std::string option = str(t.timing_log_option());
  if (!option.empty() && option != "max" && option != "minmax" && option != "all")
    return "training.timing_log_option is '" + option + "'; it must be max, minmax or all";
  if (vsize(t.data_weights()) != 0 && vsize(t.data_weights()) != vsize(t.data_paths()))
    return "training: " + std::to_string(vsize(t.data_weights())) + " data_weights for " +
           std::to_string(vsize(t.data_paths())) + " data_paths";
  for (size_t i = 0; i < vsize(t.data_weights()); ++i)
    if (double w = t.data_weights()->Get(uint32_t(i)); !std::isfinite(w) || w < 0)
      return "training.data_weights[" + std::to_string(i) + "] is " + std::to_string(w) +
             "; it must be finite and >= 0";
  return "";
}

// A named input or output the loop fills or reads.
struct Slot {
  const char *name;
  pl::DType dtype;
  bool batch;    // [micro_batch_size, seq_length]; otherwise a scalar []
  bool required; // the loop needs it (on this rank)
};

std::string check_named(const std::string &who, const char *kind,
                        const flatbuffers::Vector<uint32_t> *ids,
                        const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>> *names,
                        const pl::Program &prog, const std::vector<Slot> &slots,
                        int32_t unrolled, bool only_known, const pl::Training &t) {
  // An unrolled pipeline step names micro-batch m's copies "tokens.m".
  std::vector<std::string> suffixes;
  if (unrolled > 0)
    for (int32_t m = 0; m < unrolled; ++m)
      suffixes.push_back("." + std::to_string(m));
  else
    suffixes.push_back("");
  const size_t n = vsize(ids);
  std::set<std::string> seen;
  std::vector<std::string> present(n);
  for (size_t k = 0; k < n; ++k) {
    std::string name = names ? str(names->Get(uint32_t(k))) : "";
    if (!seen.insert(name).second)
      return who + ": two " + kind + "s are named '" + name + "'";
    present[k] = name;
  }
  for (const Slot &s : slots)
    for (const std::string &suffix : suffixes) {
      const std::string want = s.name + suffix;
      size_t k = 0;
      while (k < n && present[k] != want)
        ++k;
      if (k == n) {
        if (s.required)
          return who + " lacks its " + kind + " '" + want + "'";
        continue;
      }
      const uint32_t v = ids->Get(uint32_t(k));
      const pl::Value &val = *prog.values()->Get(v); // in range: the verifier checked
      const std::vector<int64_t> shape =
          s.batch ? std::vector<int64_t>{t.micro_batch_size(), t.seq_length()}
                  : std::vector<int64_t>{};
      std::vector<int64_t> got;
      for (size_t d = 0; d < vsize(val.shape()); ++d)
        got.push_back(val.shape()->Get(uint32_t(d)));
      if (got != shape || val.dtype() != s.dtype) {
        auto text = [](const std::vector<int64_t> &sh) {
          std::string o = "[";
          for (size_t d = 0; d < sh.size(); ++d)
            o += (d ? "," : "") + std::to_string(sh[d]);
          return o + "]";
        };
        return who + ": " + kind + " '" + want + "' is " + text(got) + " " +
               dtype_label(val.dtype()) + ", but the loop " +
               (std::string(kind) == "input" ? "fills " : "reads ") + text(shape) + " " +
               dtype_label(s.dtype) +
               (s.batch ? " (training.micro_batch_size x training.seq_length)" : "");
      }
    }
  if (only_known)
    for (const std::string &name : present) {
      bool known = false;
      for (const Slot &s : slots)
        for (const std::string &suffix : suffixes)
          known = known || name == s.name + suffix;
      if (!known)
        return who + ": " + kind + " '" + name + "' is not one mtrun fills";
    }
  return "";
}

// The named inputs and outputs of the programs the loop runs on `rank`.
std::string check_loop_io(const pl::Plan &plan, const pl::Rank &rank, const pl::Training &t) {
  const std::string rank_name = "rank " + std::to_string(rank.rank());
  const bool first = rank.pp_rank() == 0, last = rank.pp_rank() == plan.pipeline_parallel() - 1;
  for (size_t p = 0; p < vsize(rank.programs()); ++p) {
    const pl::Program &prog = *rank.programs()->Get(uint32_t(p));
    const std::string name = str(prog.name());
    const std::string who = rank_name + ", program " + name;
    std::vector<Slot> in, out;
    if (name == "train_step" || name == "train_step_first" || name == "train_step_last" ||
        name == "eval_step") {
      // A pipeline's first stage reads the tokens, its last the labels.
      in = {{"tokens", pl::DType::I32, true, first}, {"labels", pl::DType::I32, true, last}};
      out = {{"loss", pl::DType::F32, false, last}};
      // The router losses of this stage's MoE layers (summed over them).
      for (const char *router_loss : {"load_balancing_loss", "seq_load_balancing_loss", "z_loss"}) {
        out.push_back({router_loss, pl::DType::F32, false, false});
        if (t.moe_layers() == 0)
          for (size_t k = 0; k < vsize(prog.output_names()); ++k)
            if (const std::string o = str(prog.output_names()->Get(uint32_t(k)));
                o.rfind(router_loss, 0) == 0)
              return who + " outputs '" + o + "', but training.moe_layers is 0 (a dense model)";
      }
    } else if (name == "grad_norm") {
      out = {{"grad_norm", pl::DType::F32, false, true}};
    } else if (name == "optimizer_step") {
      in = {{"steps", pl::DType::I64, false, true},
            {"step", pl::DType::I64, false, true},
            {"grad_norm", pl::DType::F32, false, true},
            {"grad_scale", pl::DType::F32, false, true},
            {"next_steps", pl::DType::I64, false, false}};
      out = {{"lr", pl::DType::F32, false, false}, {"next_lr", pl::DType::F32, false, true}};
    } else if (name != "gather_params") {
      continue; // a program the loop does not run
    }
    const int32_t unrolled = prog.unrolled_micro_batches();
    if (std::string e = check_named(who, "input", prog.inputs(), prog.input_names(), prog, in,
                                    unrolled, true, t);
        !e.empty())
      return e;
    if (std::string e = check_named(who, "output", prog.outputs(), prog.output_names(), prog,
                                    out, unrolled, false, t);
        !e.empty())
      return e;
  }
  return "";
}

} // namespace

std::string verify_training(const pl::Plan &plan) {
  if (std::string e = check_text(plan); !e.empty())
    return e;
  if (std::string e = check_parallel(plan); !e.empty())
    return e;
  if (!plan.training())
    return "";
  return check_training_scalars(*plan.training());
}

std::string verify_loop_io(const pl::Plan &plan) {
  if (!plan.training())
    return "";
  for (size_t r = 0; r < vsize(plan.ranks()); ++r)
    if (std::string e = check_loop_io(plan, *plan.ranks()->Get(uint32_t(r)), *plan.training());
        !e.empty())
      return e;
  return "";
}

} // namespace mt::rt::detail
