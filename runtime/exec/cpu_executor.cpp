// The CPU reference executor (see cpu_executor.h): its buffers, the program loop and the
// public methods; cpu_executor_impl.h says which file holds the rest.
#include "runtime/exec/cpu_executor.h"
#include "runtime/exec/log_stats.h"
#include "runtime/exec/cpu_executor_impl.h"

#include "runtime/base/activity.h"
#include "runtime/exec/cpu_blas.h"

#include "runtime/exec/cpu_kernels.h"
#include "runtime/plan/grad_buckets.h"
#include "runtime/plan/plan_reader.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace mt::rt {

using namespace cpu_exec_detail; // the CPU executor's own pieces (cpu_executor_impl.h)

uint64_t CpuExecutor::Impl::scale_for_arena(const pl::Plan &plan, const pl::Rank &rank) {
  auto any_half = [](const Values *vals) {
    for (size_t i = 0; i < vsize(vals); ++i) {
      const pl::Value &v = *vals->Get(uint32_t(i));
      if (v.region() == pl::Region::ARENA && is_half(v.dtype()))
        return true;
    }
    return false;
  };
  // A compact train_step's expansion copies its values' dtypes: the
  // plan's programs answer for the programs that run.
  for (size_t p = 0; p < vsize(rank.programs()); ++p)
    if (any_half(rank.programs()->Get(uint32_t(p))->values()))
      return 2;
  for (size_t k = 0; k < vsize(plan.kernels()); ++k)
    if (any_half(plan.kernels()->Get(uint32_t(k))->cpu_values()))
      return 2;
  return 1;
}

uint64_t CpuExecutor::Impl::scale_for_state(const pl::Rank &rank) {
  for (size_t p = 0; p < vsize(rank.params()); ++p)
    if (is_half(rank.params()->Get(uint32_t(p))->dtype()))
      return 2;
  return 1;
}

uint64_t CpuExecutor::Impl::max_scratch(const pl::Plan &plan) {
  uint64_t m = 0;
  for (size_t k = 0; k < vsize(plan.kernels()); ++k)
    m = std::max<uint64_t>(m, plan.kernels()->Get(uint32_t(k))->cpu_scratch_bytes());
  return m;
}

CpuExecutor::Impl::Impl(const pl::Plan &p, const pl::Rank &r)
    : plan(p), rank(r), rank_name("rank " + std::to_string(r.rank())),
      arena_scale(scale_for_arena(p, r)), state_scale(scale_for_state(r)),
      arena(r.arena_bytes() * arena_scale, "activation arena"),
      state(r.state_bytes() * state_scale, "parameter state"),
      scratch(max_scratch(p) * arena_scale, "kernel scratch") {
  // The plan field each buffer's size comes from, for the error.
  const char *widened = " x2 (the CPU holds 16-bit floats as f32)";
  const std::string fields[] = {
      "arena_bytes of rank " + std::to_string(r.rank()) + (arena_scale > 1 ? widened : ""),
      "state_bytes of rank " + std::to_string(r.rank()) + (state_scale > 1 ? widened : ""),
      "largest kernel cpu_scratch_bytes" + std::string(arena_scale > 1 ? widened : "")};
  const Buffer *buffers[] = {&arena, &state, &scratch};
  for (int i = 0; i < 3; ++i)
    if (buffers[i]->failed()) {
      bool limited = false;
      const std::string limits = host_memory_limits(&limited);
      load_error = rank_name + ": cannot allocate the " + buffers[i]->what() + " (" +
                   std::to_string(buffers[i]->size()) + " bytes, from the plan's " + fields[i] +
                   ") on the CPU: " +
                   (limited ? limits + "; raise the limit (ulimit -v), or compile"
                            : "the machine does not have that much memory" +
                                  (limits.empty() ? "" : " (" + limits + ")") + "; compile") +
                   " a smaller model, micro-batch or sequence, or run on more ranks";
      return;
    }
  load_error = rank_programs.load(r);
  programs.reserve(rank_programs.all().size() + 1);
  for (const pl::Program *prog : rank_programs.all())
    add_program(prog);
  plan_buckets();
}

void CpuExecutor::Impl::add_program(const pl::Program *prog) {
  ProgramState &ps = programs.emplace_back();
  ps.program = prog;
  ps.name = prog->name() ? prog->name()->str() : "";
  ps.frame.values = prog->values();
  ps.frame.ptr.resize(vsize(prog->values()));
  for (uint32_t v = 0; v < ps.frame.ptr.size(); ++v)
    ps.frame.ptr[v] = address(ps.frame.value(v), arena.data());
  plan_lifetimes(ps);
  program_index[prog] = programs.size() - 1;
}

// CPU address of a value whose ARENA offsets are relative to `base`.
uint8_t *CpuExecutor::Impl::address(const pl::Value &v, uint8_t *base) const {
  switch (v.region()) {
  case pl::Region::ARENA:
    return base + v.offset() * arena_scale;
  case pl::Region::WEIGHT:
    return reinterpret_cast<uint8_t *>(state_floats(param(uint32_t(v.offset())).weight_offset()));
  case pl::Region::GRAD:
    return reinterpret_cast<uint8_t *>(state_floats(param(uint32_t(v.offset())).grad_offset()));
  }
  return nullptr;
}

// The communicator of group number `g` (plan.fbs), or null with *error set
// when the run has none for a group of several ranks.
Communicator *CpuExecutor::Impl::group(int64_t g, std::string *error) const {
  Group which = Group(g);
  Communicator *c = groups ? groups->get(which) : nullptr;
  int size = groups ? groups->size(which) : 1;
  if (!c && size > 1)
    *error = std::string("needs the ") + group_name(which) + " group of " +
             std::to_string(size) + " ranks, but no communicator was given; run the plan "
             "with all its ranks (srun -n N, or mtrun --nproc N)";
  return c;
}

// Sums doubles over a group whose collectives carry floats: each value
// travels as a float and the float of its remainder, so the sum keeps
// about 48 bits.
std::string CpuExecutor::Impl::all_reduce_doubles(Communicator *c, std::vector<double> &v) {
  std::vector<float> parts(2 * v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    parts[2 * i] = float(v[i]);
    parts[2 * i + 1] = float(v[i] - double(parts[2 * i]));
  }
  if (std::string e = c->all_reduce(parts.data(), parts.size(), ReduceOp::Sum); !e.empty())
    return e;
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = double(parts[2 * i]) + double(parts[2 * i + 1]);
  return "";
}

std::string CpuExecutor::Impl::run(const ProgramState &ps, uint64_t rng_offset) {
  const pl::Program &prog = *ps.program;
  const size_t ni = vsize(prog.instructions());
  if (check) {
    poison_all_but_inputs(ps);
    owners.clear();
    for (uint32_t r : ps.input_roots) {
      auto [b, e] = range(ps.frame, r);
      owners.assign(b, e, {0, r, r, -1});
    }
  }
  for (size_t i = 0; i < ni; ++i) {
    const pl::Instruction &ins = *prog.instructions()->Get(uint32_t(i));
    if (check) {
      for (uint32_t r : ps.dead[i])
        poison(range(ps.frame, r).first, range(ps.frame, r).second);
      if (std::string e = check_before(ps, ins, i); !e.empty())
        return e;
    }
    // An unrolled pipeline step's instructions use their micro-batch's offset.
    const int32_t mb = ins.micro_batch();
    const uint64_t offset =
        mb >= 0 && size_t(mb) < micro_rng_offsets.size() ? micro_rng_offsets[size_t(mb)]
                                                         : rng_offset;
    std::string e = execute(ins, ps.frame, offset);
    if (!e.empty())
      return rank_name + ": " + ps.name + " " + instruction_label(ins, i) + ": " + e;
    if (check)
      record_after(ps, ins, i);
  }
  return "";
}

// Runs a FUSED instruction's kernel over the outer frame's operands.
std::string CpuExecutor::Impl::run_kernel(const pl::Instruction &ins, const Frame &outer,
                                          uint64_t rng_offset) {
  const uint32_t index = uint32_t(ins.ints()->Get(0));
  const pl::Kernel &kern = *plan.kernels()->Get(index);
  const size_t nin = vsize(ins.in()), nout = vsize(ins.out());
  Frame f;
  f.values = kern.cpu_values();
  f.ptr.resize(vsize(f.values));
  for (size_t k = 0; k < nin; ++k)
    f.ptr[k] = outer.ptr[ins.in()->Get(uint32_t(k))];
  for (size_t k = 0; k < nout; ++k)
    f.ptr[nin + k] = outer.ptr[ins.out()->Get(uint32_t(k))];
  for (size_t v = nin + nout; v < f.ptr.size(); ++v)
    f.ptr[v] = address(f.value(uint32_t(v)), scratch.data());
  if (check)
    std::memset(scratch.data(), 0xff, kern.cpu_scratch_bytes() * arena_scale);
  for (size_t i = 0; i < vsize(kern.cpu_instructions()); ++i) {
    const pl::Instruction &sub = *kern.cpu_instructions()->Get(uint32_t(i));
    if (std::string e = execute(sub, f, rng_offset); !e.empty())
      return "kernel " + std::to_string(index) + " (" +
             (kern.name() ? kern.name()->str() : std::string()) + ") " +
             instruction_label(sub, i) + ": " + e;
  }
  return "";
}

CpuExecutor::CpuExecutor(const pl::Plan &plan, int rank) {
  const pl::Rank *r = find_rank(plan, rank);
  if (!r) {
    std::fprintf(stderr, "mtrun: error: the plan has no rank %d; run with a rank below its "
                         "world size\n", rank);
    std::abort();
  }
  // OpenBLAS's buffers before the plan's, so that a limit too small for
  // both fails on the plan's with their own error (cpu_blas.h).
  const std::string blas = prepare_blas("rank " + std::to_string(rank) + ": ");
  impl_ = std::make_unique<Impl>(plan, *r);
  if (!blas.empty()) // the first to fail
    impl_->load_error = blas;
}

CpuExecutor::~CpuExecutor() = default;

void initial_weights(const pl::Param &p, int64_t tp_size, int64_t tp_rank, uint64_t seed,
                     float *w) {
  initial_weights(p, tp_size, tp_rank, 1, 0, seed, w);
}

void initial_weights(const pl::Param &p, int64_t tp_size, int64_t tp_rank, int64_t ep_size,
                     int64_t ep_rank, uint64_t seed, float *w) {
  const int64_t count = element_count(p.shape());
  const int64_t tp_dim = tp_size > 1 ? p.tp_dim() : -1, ep_dim = ep_size > 1 ? p.ep_dim() : -1;
  switch (p.init()) {
  case pl::Init::ZEROS: std::fill(w, w + count, 0.0f); break;
  case pl::Init::ONES: std::fill(w, w + count, 1.0f); break;
  case pl::Init::NORMAL:
    if (tp_dim < 0 && ep_dim < 0) {
      cpu::init_normal(w, count, p.init_std(), seed, p.init_stream());
      break;
    }
    // A tensor- or expert-parallel shard holds exactly its part of the
    // whole parameter's initial values, so every layout starts from the
    // single-device weights. Dimension tp_dim of the whole is [blocks,
    // tp_size, piece] and the shard takes [:, tp_rank, :]; dimension ep_dim
    // is [ep_size, n] and the shard takes [ep_rank].
    {
      const int64_t rank = int64_t(vsize(p.shape()));
      std::vector<int64_t> shape(static_cast<size_t>(rank)), whole_stride(static_cast<size_t>(rank));
      for (int64_t k = 0; k < rank; ++k)
        shape[size_t(k)] = p.shape()->Get(uint32_t(k));
      int64_t whole_count = 1;
      for (int64_t k = rank - 1; k >= 0; --k) {
        whole_stride[size_t(k)] = whole_count;
        whole_count *= shape[size_t(k)] * (k == tp_dim ? tp_size : k == ep_dim ? ep_size : 1);
      }
      std::vector<float> whole(static_cast<size_t>(whole_count));
      cpu::init_normal(whole.data(), whole_count, p.init_std(), seed, p.init_stream());
      // The dimensions after the last split one are contiguous in both.
      const int64_t last = std::max(tp_dim, ep_dim);
      int64_t inner = 1;
      for (int64_t k = last + 1; k < rank; ++k)
        inner *= shape[size_t(k)];
      const int64_t piece = tp_dim >= 0 ? shape[size_t(tp_dim)] / std::max(1, p.tp_blocks()) : 1;
      auto whole_index = [&](int64_t k, int64_t i) {
        if (k == tp_dim)
          return (i / piece * tp_size + tp_rank) * piece + i % piece;
        if (k == ep_dim)
          return ep_rank * shape[size_t(k)] + i;
        return i;
      };
      std::vector<int64_t> at(static_cast<size_t>(last + 1), 0); // the shard's index over [0, last]
      for (float *out = w; out < w + count; out += inner) {
        int64_t src = 0;
        for (int64_t k = 0; k <= last; ++k)
          src += whole_index(k, at[size_t(k)]) * whole_stride[size_t(k)];
        std::copy(whole.data() + src, whole.data() + src + inner, out);
        for (int64_t k = last; k >= 0; --k) {
          if (++at[size_t(k)] < shape[size_t(k)])
            break;
          at[size_t(k)] = 0;
        }
      }
    }
    break;
  }
  if (p.dtype() == pl::DType::BF16)
    cpu::round_to_bf16(w, count);
  else if (p.dtype() == pl::DType::F16)
    cpu::round_to_fp16(w, count);
}

void initial_weights(const pl::Plan &plan, const pl::Rank &rank, const pl::Param &p,
                     uint64_t seed, float *w) {
  const ExpertCoords c = expert_coords(plan, rank);
  if (p.expert())
    initial_weights(p, std::max(1, plan.expert_tensor_parallel()), c.etp_rank,
                    std::max(1, plan.expert_model_parallel()), c.ep_rank, seed, w);
  else
    initial_weights(p, std::max(1, plan.tensor_parallel()), rank.tp_rank(), 1, 0, seed, w);
}

std::string CpuExecutor::init_params(uint64_t seed) {
  Impl &s = *impl_;
  for (uint32_t i = 0; i < vsize(s.rank.params()); ++i)
    if (float *w = s.state_floats(s.param(i).weight_offset()))
      initial_weights(s.plan, s.rank, s.param(i), seed, w);
  return reset_optimizer_state();
}

std::string CpuExecutor::reset_optimizer_state() {
  Impl &s = *impl_;
  for (uint32_t i = 0; i < vsize(s.rank.params()); ++i) {
    const pl::Param &p = s.param(i);
    const int64_t count = element_count(p.shape());
    if (float *w = s.state_floats(p.weight_offset()))
      if (float *m = s.state_floats(p.master_offset()))
        std::copy(w, w + count, m);
    for (float *b : {s.state_floats(p.grad_offset()), s.state_floats(p.exp_avg_offset()),
                     s.state_floats(p.exp_avg_sq_offset())})
      if (b)
        std::fill(b, b + count, 0.0f);
  }
  // The distributed optimizer: moments zero, masters of the owned shards
  // copied from the weights (padding zero).
  const int64_t n = shard_elements();
  for (float *b : {shard_master(), shard_exp_avg(), shard_exp_avg_sq()})
    if (b)
      std::fill(b, b + n, 0.0f);
  if (float *m = shard_master())
    for (const Impl::BucketState &b : s.buckets)
      for (const FlatSegment &g : b.own) {
        const float *w = s.state_floats(s.param(g.param).weight_offset()) + g.param_begin;
        std::copy(w, w + g.count, m + s.shard_index(b, g.flat_begin));
      }
  return "";
}

float *CpuExecutor::shard_master() { return impl_->shard_floats(impl_->rank.shard_master_offset()); }
float *CpuExecutor::shard_exp_avg() { return impl_->shard_floats(impl_->rank.shard_exp_avg_offset()); }
float *CpuExecutor::shard_exp_avg_sq() {
  return impl_->shard_floats(impl_->rank.shard_exp_avg_sq_offset());
}
int64_t CpuExecutor::shard_elements() const {
  return impl_->rank.distributed_optimizer() ? impl_->rank.shard_elements() : 0;
}

float *CpuExecutor::weight(int param) { return impl_->state_floats(impl_->param(uint32_t(param)).weight_offset()); }
void CpuExecutor::set_groups(const ParallelGroups *groups) { impl_->groups = groups; }
float *CpuExecutor::grad(int param) { return impl_->state_floats(impl_->param(uint32_t(param)).grad_offset()); }
float *CpuExecutor::master(int param) { return impl_->state_floats(impl_->param(uint32_t(param)).master_offset()); }
float *CpuExecutor::exp_avg(int param) { return impl_->state_floats(impl_->param(uint32_t(param)).exp_avg_offset()); }
float *CpuExecutor::exp_avg_sq(int param) {
  return impl_->state_floats(impl_->param(uint32_t(param)).exp_avg_sq_offset());
}
int64_t CpuExecutor::param_elements(int param) const {
  return element_count(impl_->param(uint32_t(param)).shape());
}

void *CpuExecutor::value_data(const pl::Program &program, uint32_t value) {
  auto it = impl_->program_index.find(&program);
  if (it == impl_->program_index.end())
    return nullptr;
  const Frame &f = impl_->programs[it->second].frame;
  return value < f.ptr.size() ? f.ptr[value] : nullptr;
}

std::string CpuExecutor::load_error() const { return impl_->load_error; }

const pl::Program *CpuExecutor::program_for_micro_batches(const std::string &name,
                                                          int64_t micro_batches,
                                                          std::string *error) {
  Impl &im = *impl_;
  const pl::Program *before = im.resized;
  const pl::Program *prog = im.rank_programs.for_micro_batches(name, micro_batches, error);
  if (!prog || prog == im.rank_programs.find(name))
    return prog;
  if (before && im.resized_micro_batches == micro_batches && im.resized_name == name)
    return prog; // the expansion already made (RankPrograms keeps it)
  // A new expansion replaces the previous one, whose bytes are gone.
  if (before) {
    im.programs.pop_back();
    im.program_index.erase(before);
  }
  im.add_program(prog);
  im.resized = prog;
  im.resized_micro_batches = micro_batches;
  im.resized_name = name;
  return prog;
}

const pl::Program *CpuExecutor::program(const std::string &name) const {
  for (const auto &ps : impl_->programs)
    if (ps.name == name)
      return ps.program;
  return nullptr;
}

std::string CpuExecutor::run(const pl::Program &program, uint64_t rng_offset) {
  auto it = impl_->program_index.find(&program);
  if (it == impl_->program_index.end())
    return impl_->rank_name + ": internal error: run() was given a program that is not one of "
                              "this rank's";
  impl_->loss_scale = loss_scale;
  return impl_->run(impl_->programs[it->second], rng_offset);
}

void CpuExecutor::set_seed(uint64_t seed) { impl_->seed = seed; }

void CpuExecutor::set_micro_batch_rng_offsets(std::vector<uint64_t> offsets) {
  impl_->micro_rng_offsets = std::move(offsets);
}

void CpuExecutor::zero_grads() {
  for (uint32_t i = 0; i < vsize(impl_->rank.params()); ++i)
    if (float *g = grad(int(i)))
      std::fill(g, g + param_elements(int(i)), 0.0f);
}

void CpuExecutor::set_check_memory_plan(bool on) { impl_->check = on; }

std::string CpuExecutor::params_sum_squares(double *out) {
  const bool masters = norm_reads_masters(impl_->plan);
  double sum = 0;
  for (const CountedRun &r : counted_runs(impl_->plan, impl_->rank)) {
    const float *x = !masters          ? weight(int(r.param)) + r.begin
                     : r.shard_at >= 0 ? shard_master() + r.shard_at
                                       : master(int(r.param)) + r.begin;
    sum += sum_of_squares(x, r.count);
  }
  *out = sum;
  return "";
}

std::string CpuExecutor::grad_stats(float unscale, float clip, GradStats *out) {
  *out = GradStats{};
  for (const CountedRun &r : counted_runs(impl_->plan, impl_->rank))
    add_grad_stats(grad(int(r.param)) + r.begin, r.count, unscale, clip, out);
  return "";
}

Executor::MemoryStats CpuExecutor::memory_stats() const {
  MemoryStats m;
  m.allocated = impl_->state.size();
  m.max_allocated = m.reserved = m.max_reserved = impl_->state.size() + impl_->arena.size();
  m.allocations = 2;
  return m;
}

uint64_t CpuExecutor::cpu_arena_bytes() const { return impl_->arena.size(); }
uint64_t CpuExecutor::cpu_state_bytes() const { return impl_->state.size(); }

} // namespace mt::rt
