// The CPU executor's instructions (see cpu_executor.h): one switch over opcodes, shapes taken
// from the values, arithmetic in runtime/exec/cpu_kernels.
#include "runtime/exec/cpu_executor_impl.h"

#include "runtime/exec/cpu_kernels.h"
#include "runtime/exec/cpu_kernels_moe.h"
#include "runtime/plan/plan_reader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace mt::rt {

using namespace cpu_exec_detail; // the CPU executor's own pieces (cpu_executor_impl.h)

namespace {

// Index of the first id outside [0, limit), or -1.
int64_t first_out_of_range(const int32_t *ids, int64_t n, int64_t limit) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= limit)
      return i;
  return -1;
}

// The router's attributes (plan.fbs MOE_ROUTER), for logits [T, E]; with
// router_dtype 0 the scores and weights are rounded to a bf16 or fp16
// logits' type as Megatron's type_as does.
cpu::MoeRouterConfig moe_router_config(const pl::Instruction &ins, const pl::Value &logits) {
  auto ival = [&](uint32_t k) { return ins.ints()->Get(k); };
  cpu::MoeRouterConfig c;
  c.tokens = logits.shape()->Get(0);
  c.experts = logits.shape()->Get(1);
  c.topk = ival(0);
  c.sigmoid = ival(1) == 1;
  c.pre_softmax = ival(2) == 1;
  c.load_balancing = int(ival(3));
  c.capacity = ival(4);
  c.drop_by_position = ival(5) == 1;
  c.pad_to_capacity = ival(6) == 1;
  c.seq_length = ival(7);
  c.fp64 = ival(8) == 2;
  if (ival(8) == 0 && logits.dtype() == pl::DType::BF16)
    c.rounding = cpu::RouterRounding::BF16;
  else if (ival(8) == 0 && logits.dtype() == pl::DType::F16)
    c.rounding = cpu::RouterRounding::F16;
  c.scaling_factor = ins.floats()->Get(0);
  c.aux_loss_coeff = ins.floats()->Get(1);
  c.z_loss_coeff = ins.floats()->Get(2);
  return c;
}

} // namespace

// Vocab-parallel cross-entropy (Megatron's _VocabParallelCrossEntropy):
// logits are [n, v] columns [r v, (r + 1) v) of the whole vocabulary; the
// row maxima, the sums of exponentials and the label's logit are reduced
// over the tensor-parallel group. Fills max[n], sum[n] and (when target is
// not null) target[n].
std::string CpuExecutor::Impl::vocab_parallel_stats(const float *logits, const int32_t *labels,
                                                    int64_t n, int64_t v, std::vector<float> &max,
                                                    std::vector<double> &sum,
                                                    std::vector<double> *target) {
  std::string err;
  Communicator *tp = group(int64_t(Group::TP), &err);
  if (!tp)
    return err.empty() ? "is vocab parallel, but its tensor-parallel group has one rank" : err;
  const int64_t first = tp_rank() * v;
  max.assign(size_t(n), -INFINITY);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < v; ++j)
      max[size_t(i)] = std::max(max[size_t(i)], logits[i * v + j]);
  if (std::string e = tp->all_reduce(max.data(), max.size(), ReduceOp::Max); !e.empty())
    return e;
  sum.assign(size_t(n), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < v; ++j)
      sum[size_t(i)] += std::exp(double(logits[i * v + j]) - double(max[size_t(i)]));
  if (std::string e = all_reduce_doubles(tp, sum); !e.empty())
    return e;
  if (target) {
    target->assign(size_t(n), 0.0);
    for (int64_t i = 0; i < n; ++i)
      if (labels[i] >= first && labels[i] < first + v)
        (*target)[size_t(i)] = double(logits[i * v + (labels[i] - first)]);
    if (std::string e = all_reduce_doubles(tp, *target); !e.empty())
      return e;
  }
  return "";
}

// [b, s, rest] <-> per-rank blocks of [b, s / t, rest]: block r holds
// positions [r s / t, (r + 1) s / t) of every sequence. `to_blocks` copies
// from the sequence layout into blocks, else back.
void CpuExecutor::Impl::sequence_blocks(const float *src, float *dst, int64_t b, int64_t s_local,
                                        int64_t rest, int64_t t, bool to_blocks) {
  const int64_t row = s_local * rest, block = b * row;
  for (int64_t r = 0; r < t; ++r)
    for (int64_t i = 0; i < b; ++i) {
      const int64_t seq_at = (i * t + r) * row, block_at = r * block + i * row;
      if (to_blocks)
        std::memcpy(dst + block_at, src + seq_at, size_t(row) * sizeof(float));
      else
        std::memcpy(dst + seq_at, src + block_at, size_t(row) * sizeof(float));
    }
}

// Executes one verified instruction; "" or what went wrong (the caller
// names the instruction).
std::string CpuExecutor::Impl::execute(const pl::Instruction &ins, const Frame &f,
                                       uint64_t rng_offset) {
  auto vin = [&](size_t k) -> const pl::Value & { return f.value(ins.in()->Get(uint32_t(k))); };
  auto vout = [&](size_t k) -> const pl::Value & { return f.value(ins.out()->Get(uint32_t(k))); };
  auto fin = [&](size_t k) { return reinterpret_cast<const float *>(f.ptr[ins.in()->Get(uint32_t(k))]); };
  auto fout = [&](size_t k) { return reinterpret_cast<float *>(f.ptr[ins.out()->Get(uint32_t(k))]); };
  auto iin = [&](size_t k) { return reinterpret_cast<const int32_t *>(f.ptr[ins.in()->Get(uint32_t(k))]); };
  auto iout = [&](size_t k) { return reinterpret_cast<int32_t *>(f.ptr[ins.out()->Get(uint32_t(k))]); };
  auto lin = [&](size_t k) { return reinterpret_cast<const int64_t *>(f.ptr[ins.in()->Get(uint32_t(k))]); };
  // f64 values (the router's logits and their gradient with fp64).
  auto din = [&](size_t k) { return reinterpret_cast<const double *>(f.ptr[ins.in()->Get(uint32_t(k))]); };
  auto dout = [&](size_t k) { return reinterpret_cast<double *>(f.ptr[ins.out()->Get(uint32_t(k))]); };
  auto widened = [](const float *p, int64_t count) { return std::vector<double>(p, p + count); };
  auto pid = [&](size_t k) { return ins.params()->Get(uint32_t(k)); };
  auto pgrad = [&](size_t k) { return state_floats(param(pid(k)).grad_offset()); };
  auto ival = [&](size_t k) { return ins.ints()->Get(uint32_t(k)); };
  auto fval = [&](size_t k) { return ins.floats()->Get(uint32_t(k)); };
  auto n = [](const pl::Value &v) { return element_count(v); };
  auto dim = [](const pl::Value &v, int64_t i) {
    int64_t r = int64_t(vsize(v.shape()));
    return v.shape()->Get(uint32_t(i < 0 ? i + r : i));
  };
  auto key = [&](int64_t stream) { return cpu::RngKey{seed, uint64_t(stream), rng_offset}; };
  auto bad_id = [&](size_t k, int64_t at, int64_t limit, const char *what) {
    return std::string(what) + " " + std::to_string(iin(k)[at]) + " at position " +
           std::to_string(at) + " of " + value_label(&vin(k), ins.in()->Get(uint32_t(k))) +
           " is outside [0, " + std::to_string(limit) +
           "); check that the data was tokenized for this model's vocabulary";
  };
  // A vocab-parallel table holds rows [tp_rank * vocab, (tp_rank + 1) *
  // vocab) of the whole vocabulary: local_row[i] is token i's row here, or
  // -1 when another rank holds it. Ids outside the whole vocabulary are an
  // error.
  auto vocab_rows = [&](int64_t vocab, int64_t rows) -> std::string {
    const int64_t first = tp_rank() * vocab, whole = vocab * tp_size();
    if (int64_t at = first_out_of_range(iin(1), rows, whole); at >= 0)
      return bad_id(1, at, whole, "token id");
    local_row.resize(size_t(rows));
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t local = iin(1)[i] - first;
      local_row[size_t(i)] = local >= 0 && local < vocab ? local : -1;
    }
    return "";
  };
  auto attention_shape = [&](const pl::Value &q, const pl::Value &k) {
    cpu::AttentionShape s{dim(q, 0), dim(q, 1), dim(q, 2), dim(k, 2), dim(q, 3),
                          ival(0) != 0, fval(0), fval(1)};
    if (ival(2) == 2) { // this rank's share of the heads
      s.head_offset = tp_rank() * s.heads;
      s.total_heads = tp_size() * s.heads;
    }
    return s;
  };

  switch (ins.op()) {
  case pl::Opcode::POSITION_IDS: {
    int64_t seq = dim(vout(0), -1);
    cpu::position_ids(n(vout(0)) / seq, seq, reinterpret_cast<int32_t *>(fout(0)));
    break;
  }
  case pl::Opcode::EMBEDDING: {
    int64_t vocab = dim(vin(0), 0), h = dim(vin(0), 1), rows = n(vin(1));
    if (ival(0)) {
      // Vocab parallel: this rank's rows; other ranks' ids give zeros.
      if (std::string e = vocab_rows(vocab, rows); !e.empty())
        return e;
      float *y = fout(0);
      for (int64_t i = 0; i < rows; ++i) {
        if (local_row[size_t(i)] >= 0)
          std::memcpy(y + i * h, fin(0) + local_row[size_t(i)] * h, size_t(h) * sizeof(float));
        else
          std::fill(y + i * h, y + (i + 1) * h, 0.0f);
      }
      break;
    }
    if (!cpu::embedding_fwd(fin(0), vocab, h, iin(1), rows, fout(0)))
      return bad_id(1, std::max<int64_t>(first_out_of_range(iin(1), rows, vocab), 0), vocab,
                    "token id");
    break;
  }
  case pl::Opcode::LAYER_NORM: {
    int64_t h = dim(vin(0), -1);
    cpu::layer_norm_fwd(fin(0), fin(1), fin(2), n(vin(0)) / h, h, fval(0), fout(0), fval(1));
    break;
  }
  case pl::Opcode::RMS_NORM: {
    int64_t h = dim(vin(0), -1);
    cpu::rms_norm_fwd(fin(0), fin(1), n(vin(0)) / h, h, fval(0), fout(0), fval(1));
    break;
  }
  case pl::Opcode::MATMUL: {
    int64_t out = dim(vin(1), 0), in = dim(vin(1), 1);
    if (vout(0).dtype() == pl::DType::F64) { // the router's logits with moe_router_dtype fp64
      const std::vector<double> x = widened(fin(0), n(vin(0))), w = widened(fin(1), n(vin(1)));
      cpu::matmul_fwd(x.data(), w.data(), n(vin(0)) / in, in, out, dout(0));
      break;
    }
    cpu::matmul_fwd(fin(0), fin(1), n(vin(0)) / in, in, out, fout(0));
    break;
  }
  case pl::Opcode::BIAS_ADD: {
    int64_t h = dim(vin(0), -1);
    cpu::bias_add_fwd(fin(0), fin(1), n(vin(0)) / h, h, fout(0));
    break;
  }
  case pl::Opcode::ADD:
    cpu::add(fin(0), fin(1), n(vout(0)), fout(0));
    break;
  case pl::Opcode::GELU:
    cpu::gelu_fwd(fin(0), n(vin(0)), ival(0) != 0, fout(0));
    break;
  case pl::Opcode::SWIGLU: {
    int64_t ff = dim(vout(0), -1);
    cpu::swiglu_fwd(fin(0), n(vout(0)) / ff, ff, fout(0));
    break;
  }
  case pl::Opcode::DROPOUT: {
    const int64_t d = ival(1);
    if (d < 0) {
      cpu::dropout_fwd(fin(0), n(vin(0)), fval(0), key(ival(0)), fout(0));
      break;
    }
    // A tensor-parallel shard along d: each outer index holds one
    // contiguous run of the whole tensor's elements.
    int64_t outer = 1, len = 1;
    for (int64_t k = 0; k < int64_t(vsize(vin(0).shape())); ++k)
      (k < d ? outer : len) *= dim(vin(0), k);
    cpu::dropout_segments(fin(0), outer, len, uint64_t(len * tp_size()),
                          uint64_t(len * tp_rank()), fval(0), key(ival(0)), fout(0));
    break;
  }
  case pl::Opcode::RESHAPE: {
    const uint8_t *src = f.ptr[ins.in()->Get(0)];
    uint8_t *dst = f.ptr[ins.out()->Get(0)];
    if (src != dst)
      std::memmove(dst, src, size_t(n(vin(0))) * cpu_element_bytes(vin(0).dtype()));
    break;
  }
  case pl::Opcode::SPLIT_QKV: {
    int64_t heads = dim(vout(0), -2), d = dim(vout(0), -1), groups = dim(vout(1), -2);
    cpu::split_qkv_fwd(fin(0), n(vout(0)) / (heads * d), heads, groups, d, fout(0), fout(1),
                       fout(2));
    break;
  }
  case pl::Opcode::SPLIT_QKV_ROPE:
    cpu::split_qkv_rope_fwd(fin(0), dim(vout(0), 0), dim(vout(0), 1), dim(vout(0), 2),
                            dim(vout(1), 2), dim(vout(0), 3), fval(0), fout(0), fout(1),
                            fout(2), fval(1));
    break;
  case pl::Opcode::ROPE:
    cpu::rope_fwd(fin(0), dim(vin(0), 0), dim(vin(0), 1), dim(vin(0), 2), dim(vin(0), 3),
                  fval(0), fout(0), fval(1));
    break;
  case pl::Opcode::ATTENTION:
    cpu::attention_fwd(fin(0), fin(1), fin(2), attention_shape(vin(0), vin(1)), key(ival(1)),
                       fout(0), fout(1));
    break;
  case pl::Opcode::CROSS_ENTROPY: {
    int64_t vocab = dim(vin(0), -1), rows = n(vin(1));
    double loss = 0;
    if (ival(0)) {
      if (int64_t at = first_out_of_range(iin(1), rows, vocab * tp_size()); at >= 0)
        return bad_id(1, at, vocab * tp_size(), "label");
      std::vector<float> max;
      std::vector<double> sum, target;
      if (std::string e = vocab_parallel_stats(fin(0), iin(1), rows, vocab, max, sum, &target);
          !e.empty())
        return e;
      for (int64_t i = 0; i < rows; ++i)
        loss += double(max[size_t(i)]) + std::log(sum[size_t(i)]) - target[size_t(i)];
      *fout(0) = float(rows ? loss / double(rows) : 0.0);
      break;
    }
    if (!cpu::cross_entropy_fwd(fin(0), iin(1), nullptr, rows, vocab, &loss))
      return bad_id(1, std::max<int64_t>(first_out_of_range(iin(1), rows, vocab), 0), vocab,
                    "label");
    *fout(0) = float(loss);
    break;
  }
  case pl::Opcode::GRAD_SEED:
    *fout(0) = float(fval(0) * double(loss_scale));
    break;
  case pl::Opcode::EMBEDDING_GRAD: {
    const pl::Param &t = param(pid(0));
    int64_t vocab = t.shape()->Get(0), h = t.shape()->Get(1), rows = n(vin(1));
    if (ival(0)) {
      if (std::string e = vocab_rows(vocab, rows); !e.empty())
        return e;
      float *g = pgrad(0);
      for (int64_t i = 0; i < rows; ++i)
        if (const int64_t local = local_row[size_t(i)]; local >= 0)
          for (int64_t j = 0; j < h; ++j)
            g[local * h + j] += fin(0)[i * h + j];
      break;
    }
    // The backward kernel trusts its ids; a bad one would write outside the table.
    if (int64_t at = first_out_of_range(iin(1), rows, vocab); at >= 0)
      return bad_id(1, at, vocab, "token id");
    cpu::embedding_bwd(fin(0), iin(1), rows, h, pgrad(0));
    break;
  }
  case pl::Opcode::MATMUL_INPUT_GRAD: {
    int64_t out = dim(vin(1), 0), in = dim(vin(1), 1);
    if (vin(0).dtype() == pl::DType::F64) { // in double, rounded once to dx's type
      const std::vector<double> w = widened(fin(1), n(vin(1)));
      std::vector<double> dx(size_t(n(vout(0))));
      cpu::matmul_bwd_input(din(0), w.data(), n(vin(0)) / out, in, out, dx.data(), false);
      std::copy(dx.begin(), dx.end(), fout(0));
      break;
    }
    cpu::matmul_bwd_input(fin(0), fin(1), n(vin(0)) / out, in, out, fout(0), false);
    break;
  }
  case pl::Opcode::MATMUL_WEIGHT_GRAD: {
    const pl::Param &w = param(pid(0));
    int64_t out = w.shape()->Get(0), in = w.shape()->Get(1);
    if (vin(0).dtype() == pl::DType::F64) { // in double, then added to the gradient
      const std::vector<double> x = widened(fin(1), n(vin(1)));
      std::vector<double> dw(size_t(out * in), 0.0);
      cpu::matmul_bwd_weight(din(0), x.data(), n(vin(0)) / out, in, out, dw.data());
      float *g = pgrad(0);
      for (size_t i = 0; i < dw.size(); ++i)
        g[i] += float(dw[i]);
      break;
    }
    cpu::matmul_bwd_weight(fin(0), fin(1), n(vin(0)) / out, in, out, pgrad(0));
    break;
  }
  case pl::Opcode::BIAS_GRAD: {
    int64_t h = dim(vin(0), -1);
    cpu::bias_grad(fin(0), n(vin(0)) / h, h, pgrad(0));
    break;
  }
  case pl::Opcode::LAYER_NORM_GRAD: {
    int64_t h = dim(vin(1), -1);
    cpu::layer_norm_bwd(fin(0), fin(1), fin(2), n(vin(1)) / h, h, fval(0), fout(0), pgrad(0),
                        pgrad(1), fval(1));
    break;
  }
  case pl::Opcode::RMS_NORM_GRAD: {
    int64_t h = dim(vin(1), -1);
    cpu::rms_norm_bwd(fin(0), fin(1), fin(2), n(vin(1)) / h, h, fval(0), fout(0), pgrad(0),
                      fval(1));
    break;
  }
  case pl::Opcode::GELU_GRAD:
    cpu::gelu_bwd(fin(0), fin(1), n(vin(1)), ival(0) != 0, fout(0));
    break;
  case pl::Opcode::SWIGLU_GRAD: {
    int64_t ff = dim(vin(0), -1);
    cpu::swiglu_bwd(fin(0), fin(1), n(vin(0)) / ff, ff, fout(0));
    break;
  }
  case pl::Opcode::SPLIT_QKV_GRAD: {
    int64_t heads = dim(vin(0), -2), d = dim(vin(0), -1), groups = dim(vin(1), -2);
    cpu::split_qkv_bwd(fin(0), fin(1), fin(2), n(vin(0)) / (heads * d), heads, groups, d,
                       fout(0));
    break;
  }
  case pl::Opcode::SPLIT_QKV_ROPE_GRAD:
    cpu::split_qkv_rope_bwd(fin(0), fin(1), fin(2), dim(vin(0), 0), dim(vin(0), 1),
                            dim(vin(0), 2), dim(vin(1), 2), dim(vin(0), 3), fval(0), fout(0),
                            fval(1));
    break;
  case pl::Opcode::ROPE_GRAD:
    cpu::rope_bwd(fin(0), dim(vin(0), 0), dim(vin(0), 1), dim(vin(0), 2), dim(vin(0), 3),
                  fval(0), fout(0), fval(1));
    break;
  case pl::Opcode::ATTENTION_GRAD:
    cpu::attention_bwd(fin(0), fin(1), fin(2), fin(3), fin(4), fin(5),
                       attention_shape(vin(1), vin(2)), key(ival(1)), fout(0), fout(1), fout(2));
    break;
  case pl::Opcode::CROSS_ENTROPY_GRAD: {
    int64_t vocab = dim(vin(0), -1), rows = n(vin(1));
    if (ival(0)) {
      if (int64_t at = first_out_of_range(iin(1), rows, vocab * tp_size()); at >= 0)
        return bad_id(1, at, vocab * tp_size(), "label");
      std::vector<float> max;
      std::vector<double> sum;
      if (std::string e = vocab_parallel_stats(fin(0), iin(1), rows, vocab, max, sum, nullptr);
          !e.empty())
        return e;
      // dlogits = c (softmax - onehot), over this rank's columns; written
      // in place over the logits when the plan says so.
      const double c = rows ? double(*fin(2)) / double(rows) : 0.0;
      const int64_t first = tp_rank() * vocab;
      const float *x = fin(0);
      float *dx = fout(0);
      for (int64_t i = 0; i < rows; ++i) {
        const double f = c / sum[size_t(i)], m = max[size_t(i)];
        for (int64_t j = 0; j < vocab; ++j)
          dx[i * vocab + j] = float(std::exp(double(x[i * vocab + j]) - m) * f);
        const int64_t local = iin(1)[i] - first;
        if (local >= 0 && local < vocab)
          dx[i * vocab + local] = float(double(dx[i * vocab + local]) - c);
      }
      break;
    }
    if (int64_t at = first_out_of_range(iin(1), rows, vocab); at >= 0)
      return bad_id(1, at, vocab, "label");
    cpu::cross_entropy_bwd(fin(0), iin(1), nullptr, rows, vocab, double(*fin(2)), fout(0));
    break;
  }
  case pl::Opcode::GRAD_NORM:
    return grad_norm(fout(0));
  case pl::Opcode::LR_SCHEDULE: {
    int64_t steps = *lin(0);
    if (steps < 0)
      return "the iteration input is " + std::to_string(steps) +
             "; it counts optimizer steps taken and cannot be negative";
    *fout(0) = float(megatron_lr(lr_schedule_of(ins), steps));
    break;
  }
  case pl::Opcode::CLIP_COEFF: {
    // Unscaling times Megatron's clipping factor on the unscaled norm.
    double max_norm = fval(0), coeff = 1.0;
    if (max_norm > 0) {
      double c = max_norm / (double(*fin(0)) + 1e-6);
      if (c < 1.0)
        coeff = c;
    }
    *fout(0) = float(double(*fin(1)) * coeff);
    break;
  }
  case pl::Opcode::ADAMW:
    return adamw(ins, *fin(0), *fin(1), *lin(2));
  case pl::Opcode::FUSED:
    if (std::string e = run_kernel(ins, f, rng_offset); !e.empty())
      return e;
    break;
  case pl::Opcode::REDUCE_GRADS:
    return reduce_grads(ins);
  case pl::Opcode::SHARDED_GRAD_NORM:
    return sharded_grad_norm(ins, fout(0));
  case pl::Opcode::SHARDED_ADAMW:
    return sharded_adamw(ins, *fin(0), *fin(1), *lin(2), *fin(3));
  case pl::Opcode::SGD:
    return sgd(ins, *fin(0), *fin(1));
  case pl::Opcode::SHARDED_SGD:
    return sharded_sgd(ins, *fin(0), *fin(1), *fin(2));
  case pl::Opcode::ALL_GATHER_PARAMS:
    return all_gather_params(ins);
  case pl::Opcode::ALL_REDUCE_GRADS: {
    std::string err;
    Communicator *dp = group(ival(0), &err);
    if (!dp)
      return err;
    const float scale = float(fval(0));
    const uint32_t count = vsize(ins.params()) ? vsize(ins.params()) : vsize(rank.params());
    for (uint32_t k = 0; k < count; ++k) {
      const uint32_t p = vsize(ins.params()) ? pid(k) : k;
      float *g = state_floats(param(p).grad_offset());
      const int64_t count = element_count(param(p).shape());
      if (param(p).grad_dtype() == pl::DType::BF16) {
        if (std::string e = sum_in_bf16(dp, g, count, scale); !e.empty())
          return e;
        continue;
      }
      if (std::string e = dp->all_reduce(g, size_t(count), ReduceOp::Sum); !e.empty())
        return e;
      cpu::scale(g, count, scale);
    }
    break;
  }
  case pl::Opcode::ALL_REDUCE:
  case pl::Opcode::SEQ_ALL_GATHER:
  case pl::Opcode::SEQ_REDUCE_SCATTER:
  case pl::Opcode::SEQ_SPLIT: {
    std::string err;
    Communicator *c = group(ival(0), &err);
    if (!c)
      return err.empty() ? "exchanges activations within a group of one rank" : err;
    const int64_t t = c->size(), r = c->rank();
    if (ins.op() == pl::Opcode::ALL_REDUCE) {
      if (fout(0) != fin(0))
        std::memmove(fout(0), fin(0), size_t(n(vin(0))) * sizeof(float));
      if (std::string e = c->all_reduce(fout(0), size_t(n(vout(0))), ReduceOp::Sum); !e.empty())
        return e;
      break;
    }
    const bool gather = ins.op() == pl::Opcode::SEQ_ALL_GATHER;
    const pl::Value &shard = gather ? vin(0) : vout(0);
    const int64_t b = dim(shard, 0), s_local = dim(shard, 1), rest = n(shard) / (b * s_local);
    const size_t count = size_t(n(shard));
    if (ins.op() == pl::Opcode::SEQ_SPLIT) {
      for (int64_t i = 0; i < b; ++i)
        std::memcpy(fout(0) + i * s_local * rest, fin(0) + (i * t + r) * s_local * rest,
                    size_t(s_local * rest) * sizeof(float));
      break;
    }
    exchange.resize(count * size_t(t));
    if (gather) {
      if (std::string e = c->all_gather(fin(0), count, exchange.data()); !e.empty())
        return e;
      sequence_blocks(exchange.data(), fout(0), b, s_local, rest, t, false);
    } else {
      sequence_blocks(fin(0), exchange.data(), b, s_local, rest, t, true);
      if (std::string e = c->reduce_scatter(exchange.data(), count, fout(0)); !e.empty())
        return e;
    }
    break;
  }
  case pl::Opcode::SEND:
  case pl::Opcode::RECV: {
    std::string err;
    Communicator *pp = group(int64_t(Group::PP), &err);
    if (!pp)
      return err.empty() ? "needs a pipeline group" : err;
    const bool send = ins.op() == pl::Opcode::SEND;
    const pl::Value &v = send ? vin(0) : vout(0);
    const size_t bytes = size_t(n(v)) * sizeof(float); // the CPU holds floats
    if (send)
      return pp->send(fin(0), bytes, int(ival(0)), int(ival(1)));
    if (std::string e = pp->recv(fout(0), bytes, int(ival(0)), int(ival(1))); !e.empty())
      return e;
    break;
  }
  case pl::Opcode::ALL_REDUCE_TIED_GRAD: {
    // Both copies end up with mine + theirs; float addition commutes, so
    // the two stages hold the same bits.
    std::string err;
    Communicator *pp = group(int64_t(Group::PP), &err);
    if (!pp)
      return err.empty() ? "needs a pipeline group" : err;
    float *g = pgrad(0);
    const int64_t count = element_count(param(pid(0)).shape());
    peer_grad.resize(size_t(count));
    const int peer = int(ival(0)), tag = int(ival(1));
    if (std::string e = pp->send(g, size_t(count) * sizeof(float), peer, tag); !e.empty())
      return e;
    if (std::string e = pp->recv(peer_grad.data(), size_t(count) * sizeof(float), peer, tag);
        !e.empty())
      return e;
    for (int64_t i = 0; i < count; ++i)
      g[i] += peer_grad[size_t(i)];
    break;
  }
  case pl::Opcode::GROUP_GRAD_NORM:
    return grad_norm(fout(0));
  case pl::Opcode::MOE_DISPATCH:
    if (std::string e = moe_dispatch(ins, f); !e.empty())
      return e;
    break;
  case pl::Opcode::MOE_COMBINE:
    if (std::string e = moe_combine(ins, f); !e.empty())
      return e;
    break;
  case pl::Opcode::MOE_ROUTER: {
    cpu::MoeRouterConfig c = moe_router_config(ins, vin(0));
    const bool f64 = vin(0).dtype() == pl::DType::F64;
    std::vector<double> global;
    if (std::string e = f64 ? router_group_counts(ins, din(0), c, global)
                            : router_group_counts(ins, fin(0), c, global);
        !e.empty())
      return e;
    double aux = 0, z = 0;
    if (f64) { // fp64: routed in double; the routing weights are f32
      std::vector<double> probs(size_t(n(vout(0))));
      cpu::moe_router_fwd(din(0), c, probs.data(), iout(1), &aux, &z);
      std::copy(probs.begin(), probs.end(), fout(0));
    } else {
      cpu::moe_router_fwd(fin(0), c, fout(0), iout(1), &aux, &z);
    }
    fout(2)[0] = float(aux);
    fout(3)[0] = float(z);
    break;
  }
  case pl::Opcode::MOE_ROUTER_GRAD: {
    cpu::MoeRouterConfig c = moe_router_config(ins, vin(1));
    const bool f64 = vin(1).dtype() == pl::DType::F64;
    std::vector<double> global;
    if (std::string e = f64 ? router_group_counts(ins, din(1), c, global)
                            : router_group_counts(ins, fin(1), c, global);
        !e.empty())
      return e;
    if (f64) {
      const std::vector<double> dprobs = widened(fin(0), n(vin(0)));
      cpu::moe_router_bwd(dprobs.data(), din(1), iin(3), c, double(*fin(4)), dout(0));
    } else {
      cpu::moe_router_bwd(fin(0), fin(1), iin(3), c, double(*fin(4)), fout(0));
    }
    break;
  }
  case pl::Opcode::MOE_PERMUTE:
    return cpu::moe_permute_fwd(fin(0), iin(1), dim(vin(0), 0), dim(vin(1), 1), dim(vin(0), 1),
                                dim(vout(0), 0), ival(0), ival(1) != 0, fout(0), iout(1),
                                iout(2));
  case pl::Opcode::MOE_PERMUTE_GRAD:
    return cpu::moe_permute_bwd(fin(0), iin(1), dim(vin(0), 0), dim(vout(0), 0), dim(vin(0), 1),
                                fout(0));
  case pl::Opcode::GROUPED_MATMUL: // x[N, K], w[E, M, K]
    return cpu::grouped_matmul_fwd(fin(0), fin(1), iin(2), dim(vin(1), 0), dim(vin(0), 0),
                                   dim(vin(1), 2), dim(vin(1), 1), fout(0));
  case pl::Opcode::GROUPED_MATMUL_INPUT_GRAD: // dy[N, M], w[E, M, K]
    return cpu::grouped_matmul_bwd_input(fin(0), fin(1), iin(2), dim(vin(1), 0), dim(vin(0), 0),
                                         dim(vin(1), 2), dim(vin(1), 1), fout(0));
  case pl::Opcode::GROUPED_MATMUL_WEIGHT_GRAD: { // dy[N, M], x[N, K] into w[E, M, K]
    const auto *w = param(pid(0)).shape();
    if (std::string e = cpu::grouped_matmul_bwd_weight(fin(0), fin(1), iin(2), w->Get(0),
                                                       dim(vin(0), 0), w->Get(2), w->Get(1),
                                                       pgrad(0));
        !e.empty())
      return e;
    break;
  }
  case pl::Opcode::MOE_UNPERMUTE: // y[N, H], probs[T, E]
    if (std::string e = cpu::moe_unpermute_fwd(fin(0), fin(1), iin(2), iin(3), dim(vin(1), 0),
                                               dim(vin(1), 1), dim(vin(0), 0), dim(vin(0), 1),
                                               fout(0));
        !e.empty())
      return e;
    break;
  case pl::Opcode::MOE_UNPERMUTE_GRAD: // dout[T, H], y[N, H], probs[T, E]
    if (std::string e = cpu::moe_unpermute_bwd(fin(0), fin(1), fin(2), iin(3), iin(4),
                                               dim(vin(2), 0), dim(vin(2), 1), dim(vin(1), 0),
                                               dim(vin(1), 1), fout(0), fout(1));
        !e.empty())
      return e;
    break;
  }
  // bf16 gradients (--grad-reduce-in-bf16): an instruction adds its
  // contribution, computed in f32, and the sum is rounded to bf16 once, as
  // a GEMM accumulating into a bf16 buffer rounds (Megatron's gradient-
  // accumulation fusion). Untouched elements are bf16 already.
  switch (ins.op()) {
  case pl::Opcode::EMBEDDING_GRAD:
  case pl::Opcode::MATMUL_WEIGHT_GRAD:
  case pl::Opcode::GROUPED_MATMUL_WEIGHT_GRAD:
  case pl::Opcode::BIAS_GRAD:
  case pl::Opcode::LAYER_NORM_GRAD:
  case pl::Opcode::RMS_NORM_GRAD:
  case pl::Opcode::ALL_REDUCE_TIED_GRAD:
    for (size_t k = 0; k < vsize(ins.params()); ++k)
      if (param(pid(k)).grad_dtype() == pl::DType::BF16)
        cpu::round_to_bf16(pgrad(k), element_count(param(pid(k)).shape()));
    break;
  default:
    break;
  }
  // Reduced-precision results: computed in f32, then rounded to their type.
  for (size_t k = 0; k < vsize(ins.out()); ++k) {
    const pl::Value &v = vout(k);
    if (v.dtype() == pl::DType::BF16)
      cpu::round_to_bf16(fout(k), n(v));
    else if (v.dtype() == pl::DType::F16)
      cpu::round_to_fp16(fout(k), n(v));
  }
  return "";
}

} // namespace mt::rt
