// The GPU executor (gpu_executor.h): plan GPU steps on a GpuDevice.
#include "runtime/exec/gpu_executor.h"
#include "runtime/exec/device_watchdog.h"

#include "runtime/comm/comm_order.h"

#include "runtime/exec/cpu_executor.h"
#include "runtime/exec/cpu_kernels.h"
#include "runtime/exec/cpu_kernels_moe.h"
#include "runtime/exec/log_stats.h"
#include "runtime/plan/grad_buckets.h"
#include "runtime/plan/plan_reader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <new>
#include <set>
#include <utility>

namespace mt::rt {

namespace pl = mt::plan;

namespace {

constexpr uint64_t kAlign = 256;
uint64_t align_up(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// 16-bit storage <-> float. Weights on the host are already rounded to
// their type (cpu::round_to_*), so these conversions are exact.
uint16_t to_half_bits(float x, pl::DType t) {
  if (t == pl::DType::BF16) {
    cpu::round_to_bf16(&x, 1);
    return uint16_t(bits_of(x) >> 16);
  }
  cpu::round_to_fp16(&x, 1);
  const uint32_t u = bits_of(x), sign = (u >> 16) & 0x8000u, mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u)
    return uint16_t(sign | 0x7E00u | ((mag >> 13) & 0x3FFu));
  if (mag == 0x7F800000u)
    return uint16_t(sign | 0x7C00u);
  if (mag >= 0x38800000u) // normal half
    return uint16_t(sign | (((mag >> 23) - 112u) << 10) | ((mag >> 13) & 0x3FFu));
  return uint16_t(sign | uint32_t(float_of(mag) * 0x1p24f)); // subnormal: multiples of 2^-24
}
float from_half_bits(uint16_t h, pl::DType t) {
  if (t == pl::DType::BF16)
    return float_of(uint32_t(h) << 16);
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 31)
    return float_of(sign | 0x7F800000u | (m << 13));
  if (e == 0)
    return float_of(bits_of(float(m) * 0x1p-24f) | sign);
  return float_of(sign | ((e + 112u) << 23) | (m << 13));
}

std::string str(const flatbuffers::String *s) { return s ? s->str() : std::string(); }

bool moe_exchange_op(const pl::Instruction &ins) {
  return ins.op() == pl::Opcode::MOE_DISPATCH || ins.op() == pl::Opcode::MOE_COMBINE;
}

CommElement element_of(pl::DType t) {
  return t == pl::DType::BF16 ? CommElement::BF16
         : t == pl::DType::F16 ? CommElement::F16
                               : CommElement::F32;
}

} // namespace

std::string DeviceComm::all_to_all_v(uint64_t send_buf, const std::vector<uint64_t> &send_counts,
                                     const std::vector<uint64_t> &send_displs, uint64_t recv_buf,
                                     const std::vector<uint64_t> &recv_counts,
                                     const std::vector<uint64_t> &recv_displs, CommElement t) {
  const size_t n = size_t(size());
  if (send_counts.size() != n || send_displs.size() != n || recv_counts.size() != n ||
      recv_displs.size() != n)
    return "all_to_all_v: the counts and displacements need one entry per rank of the group";
  const uint64_t bytes = t == CommElement::F64 ? 8 : t == CommElement::F32 ? 4 : 2;
  if (std::string e = group_start(); !e.empty())
    return e;
  for (size_t p = 0; p < n; ++p) {
    if (send_counts[p])
      if (std::string e = send(send_buf + send_displs[p] * bytes, send_counts[p], t, int(p));
          !e.empty())
        return e;
    if (recv_counts[p])
      if (std::string e = recv(recv_buf + recv_displs[p] * bytes, recv_counts[p], t, int(p));
          !e.empty())
        return e;
  }
  return group_end();
}

std::string DeviceComm::reduce_scatter_v(uint64_t in, const std::vector<uint64_t> &counts,
                                         uint64_t out, CommElement t) {
  const size_t n = size_t(size());
  if (counts.size() != n)
    return "reduce_scatter_v: the counts need one entry per rank of the group";
  const uint64_t bytes = t == CommElement::F64 ? 8 : t == CommElement::F32 ? 4 : 2;
  if (std::string e = group_start(); !e.empty())
    return e;
  uint64_t at = in;
  for (size_t r = 0; r < n; ++r) {
    if (counts[r])
      if (std::string e = reduce(at, int(r) == rank() ? out : at, counts[r], t, int(r));
          !e.empty())
        return e;
    at += counts[r] * bytes;
  }
  return group_end();
}

struct GpuExecutor::HostState {
  struct Param {
    std::vector<float> weight, grad, master, exp_avg, exp_avg_sq;
  };
  std::vector<Param> params;
  // The distributed optimizer's shard state (f32 arrays in the state buffer).
  std::vector<float> shard_master, shard_exp_avg, shard_exp_avg_sq;
  std::vector<uint8_t> image; // the state buffer's bytes, as on the device
  // Program inputs and outputs: host bytes, laid out as on the device.
  std::map<std::pair<const pl::Program *, uint32_t>, std::vector<uint8_t>> staging;
};

namespace {
// Every f32 host buffer with its state-buffer offset, laid out alike on host
// and device: each parameter's gradient, master copy and moments, then the
// distributed optimizer's shard arrays. Empty buffers (absent) are skipped.
template <class H, class F> void for_each_f32(H &h, const pl::Rank &r, F f) {
  auto each = [&](std::vector<float> &v, int64_t off) {
    if (!v.empty())
      f(v, off);
  };
  for (uint32_t i = 0; i < h.params.size(); ++i) {
    const pl::Param &p = *r.params()->Get(i);
    if (p.grad_dtype() == pl::DType::F32) // bf16 ones convert beside the weights
      each(h.params[i].grad, p.grad_offset());
    each(h.params[i].master, p.master_offset());
    each(h.params[i].exp_avg, p.exp_avg_offset());
    each(h.params[i].exp_avg_sq, p.exp_avg_sq_offset());
  }
  each(h.shard_master, r.shard_master_offset());
  each(h.shard_exp_avg, r.shard_exp_avg_offset());
  each(h.shard_exp_avg_sq, r.shard_exp_avg_sq_offset());
}
} // namespace

GpuExecutor::GpuExecutor(const pl::Plan &plan, int rank, std::unique_ptr<GpuDevice> device)
    : plan_(plan), rank_(*find_rank(plan, rank)), device_(std::move(device)),
      host_(std::make_unique<HostState>()) {
  load_error_ = programs_.load(rank_);
  // The host copies of the state (checkpoints, initial values): one the
  // machine cannot hold is reported (load_error), not thrown.
  try {
    allocate_host_state();
  } catch (const std::bad_alloc &) {
    host_->params.clear();
    host_->shard_master = host_->shard_exp_avg = host_->shard_exp_avg_sq = {};
    load_error_ = "rank " + std::to_string(rank_.rank()) +
                  ": cannot allocate the host copy of the parameter state (from the plan's "
                  "state_bytes of rank " + std::to_string(rank_.rank()) + ", " +
                  std::to_string(rank_.state_bytes()) +
                  " bytes) in the machine's memory; compile a smaller model or run on more ranks";
  }
}

void GpuExecutor::allocate_host_state() {
  host_->params.resize(rank_.params() ? rank_.params()->size() : 0);
  for (uint32_t i = 0; i < host_->params.size(); ++i) {
    const pl::Param &p = *rank_.params()->Get(i);
    const size_t n = size_t(element_count(p.shape()));
    HostState::Param &h = host_->params[i];
    if (p.weight_offset() >= 0) h.weight.assign(n, 0.0f);
    if (p.grad_offset() >= 0) h.grad.assign(n, 0.0f);
    if (p.master_offset() >= 0) h.master.assign(n, 0.0f);
    if (p.exp_avg_offset() >= 0) h.exp_avg.assign(n, 0.0f);
    if (p.exp_avg_sq_offset() >= 0) h.exp_avg_sq.assign(n, 0.0f);
  }
  if (rank_.distributed_optimizer()) {
    const size_t n = size_t(rank_.shard_elements());
    if (rank_.shard_master_offset() >= 0) host_->shard_master.assign(n, 0.0f);
    if (rank_.shard_exp_avg_offset() >= 0) host_->shard_exp_avg.assign(n, 0.0f);
    if (rank_.shard_exp_avg_sq_offset() >= 0) host_->shard_exp_avg_sq.assign(n, 0.0f);
  }
}

GpuExecutor::~GpuExecutor() { drop_graphs(); }

std::string GpuExecutor::open() {
  const std::string who = "rank " + std::to_string(rank_.rank());
  if (!load_error_.empty())
    return load_error_;
  std::set<uint32_t> kernels;
  for (const pl::Program *prog : programs_.all()) {
    const auto *insts = prog->instructions();
    for (uint32_t i = 0; insts && i < insts->size(); ++i) {
      const pl::Instruction &ins = *insts->Get(i);
      const std::string at =
          who + ", program " + str(prog->name()) + " " + instruction_label(ins, i);
      if (!ins.gpu() || ins.gpu()->size() == 0)
        return at + ": this plan has no GPU form for it; recompile the spec with an mtc that "
                    "generates one, or run with --device cpu";
      for (const pl::GpuStep *s : *ins.gpu())
        if (s->kind() == pl::GpuStepKind::KERNEL)
          kernels.insert(uint32_t(s->kernel()));
    }
  }
  const uint64_t state = align_up(rank_.state_bytes()), arena = align_up(rank_.arena_bytes());
  const uint64_t work = align_up(rank_.kernel_workspace_bytes());
  allocated_ = state + arena + work + gpu_scalar_bytes(rank_);
  if (std::string e = device_->allocate(allocated_, &base_); !e.empty())
    return who + ": " + e + " (the plan's state_bytes " + std::to_string(rank_.state_bytes()) +
           " + arena_bytes " + std::to_string(rank_.arena_bytes()) +
           " + kernel_workspace_bytes " + std::to_string(rank_.kernel_workspace_bytes()) +
           " of rank " + std::to_string(rank_.rank()) + ")";
  workspace_ = base_ + state + arena;
  loss_scale_at_ = workspace_ + work;
  if (rank_.params() && rank_.params()->size()) {
    const pl::DType g = rank_.params()->Get(0)->grad_dtype(); // one a rank (plan_verifier)
    grad_bytes_ = g == pl::DType::F32 ? 4 : 2;
    grad_element_ = element_of(g);
  }
  for (const pl::Param *p : *rank_.params())
    if (p->flat_offset() >= 0) {
      const bool half = p->dtype() == pl::DType::BF16 || p->dtype() == pl::DType::F16;
      weight_bytes_ = half ? 2 : 4;
      weight_element_ = element_of(p->dtype());
      grad_base_ = base_ + uint64_t(p->grad_offset() - p->flat_offset() * int64_t(grad_bytes_));
      weight_base_ = base_ + uint64_t(p->weight_offset() - p->flat_offset() * int64_t(weight_bytes_));
      break;
    }
  seed_at_ = loss_scale_at_ + kGpuScalarSlotBytes;
  micro_slots_ = gpu_micro_batch_slots(rank_);
  for (uint32_t k : kernels)
    if (std::string e = device_->load_kernel(k, *plan_.kernels()->Get(k)); !e.empty())
      return who + ": " + e;
  // The device side of each group, in the same order on every rank.
  if (plan_.world_size() > 1) {
    if (!groups_)
      return who + ": internal error: the executor of a plan of several ranks needs its "
                   "groups (set_groups) before open()";
    // A group whose host communicator is an earlier group's (the expert
    // groups of some layouts) uses that group's connection.
    // The watchdog over the device collectives: the world communicator's
    // record and timeout (Gloo), unless set_watchdog gave others.
    if (!watch_target_.writer && groups_->world)
      groups_->world->record_target(&watch_target_);
    if (watch_target_.writer && watch_target_.timeout.count() > 0 && !watchdog_)
      watchdog_ = std::make_unique<DeviceWatchdog>(*device_, watch_target_, watch_grace_);
    std::map<const Communicator *, DeviceComm *> connected;
    for (int k = 0; k < kNumGroups; ++k)
      if (Communicator *c = groups_->get(Group(k))) {
        if (auto it = connected.find(c); it != connected.end()) {
          comms_[k] = it->second;
          continue;
        }
        std::string err;
        std::unique_ptr<DeviceComm> d = device_->connect(*c, &err);
        if (!d)
          return who + ": connecting the GPUs of the " + group_name(Group(k)) + " group (" +
                 std::to_string(c->size()) + " ranks): " + err;
        if (watchdog_)
          d = watchdog_->watch(std::move(d), group_name(Group(k)),
                               group_members(groups_->layout, Group(k), groups_->rank));
        comms_[k] = connected[c] = d.get();
        owned_comms_.push_back(std::move(d));
      }
  }
  for (Group g : {Group::DP, Group::EXPT_DP})
    if (comms_[int(g)])
      side_comms_.push_back(comms_[int(g)]);
  side_stream_ = !side_comms_.empty() && device_->has_side_stream();
  if (std::string e = check_shards(); !e.empty())
    return who + ": " + e;
  set_loss_scale(1.0f);
  host_->image.assign(size_t(rank_.state_bytes()), 0);
  return pending_error_;
}

// Every shard (tensor, expert tensor or expert model parallel) holds
// exactly its slice of the whole parameter's initial values: the CPU
// executor's initial_weights.
std::string GpuExecutor::init_params(uint64_t seed) {
  for (uint32_t i = 0; i < host_->params.size(); ++i)
    if (HostState::Param &h = host_->params[i]; !h.weight.empty())
      initial_weights(plan_, rank_, *rank_.params()->Get(i), seed, h.weight.data());
  if (std::string e = reset_optimizer_state(); !e.empty())
    return e;
  return state_to_device();
}

std::string GpuExecutor::reset_optimizer_state() {
  for (HostState::Param &h : host_->params) {
    if (!h.weight.empty() && !h.master.empty())
      h.master = h.weight;
    for (std::vector<float> *b : {&h.grad, &h.exp_avg, &h.exp_avg_sq})
      std::fill(b->begin(), b->end(), 0.0f);
  }
  // The distributed optimizer: zero moments, and the masters of the owned
  // shards copied from the weights (padding zero), as the CPU executor.
  for (std::vector<float> *b :
       {&host_->shard_master, &host_->shard_exp_avg, &host_->shard_exp_avg_sq})
    std::fill(b->begin(), b->end(), 0.0f);
  if (!host_->shard_master.empty()) {
    std::vector<FlatParam> flat;
    for (uint32_t p = 0; p < host_->params.size(); ++p)
      if (const pl::Param &q = *rank_.params()->Get(p); q.flat_offset() >= 0)
        flat.push_back({p, q.flat_offset(), element_count(q.shape())});
    const int dp = std::max(1, plan_.data_parallel());
    for (const pl::Bucket *b : *rank_.buckets()) {
      // A bucket is sharded over its group (dp, or expt_dp for experts),
      // its state at shard_offset (plan.fbs Bucket).
      int size = dp, rank = rank_.dp_rank();
      if (b->group() != int32_t(Group::DP)) {
        const DeviceComm *c =
            b->group() >= 0 && b->group() < kNumGroups ? comms_[b->group()] : nullptr;
        size = c ? c->size() : 1;
        rank = c ? c->rank() : 0;
      }
      const FlatRange shard = bucket_shard(b->begin(), b->end(), size, rank);
      const int64_t state_at =
          b->shard_offset() >= 0 ? b->shard_offset() : shard_state_offset(b->begin(), size);
      for (const FlatSegment &g : flat_segments(flat, shard.begin, shard.end)) {
        const float *w = host_->params[g.param].weight.data() + g.param_begin;
        std::copy(w, w + g.count,
                  host_->shard_master.begin() + (state_at + g.flat_begin - shard.begin));
      }
    }
  }
  return "";
}

namespace {
float *view(std::vector<float> &v) { return v.empty() ? nullptr : v.data(); }
} // namespace

float *GpuExecutor::weight(int p) { return view(host_->params[size_t(p)].weight); }
float *GpuExecutor::grad(int p) { return view(host_->params[size_t(p)].grad); }
float *GpuExecutor::master(int p) { return view(host_->params[size_t(p)].master); }
float *GpuExecutor::exp_avg(int p) { return view(host_->params[size_t(p)].exp_avg); }
float *GpuExecutor::exp_avg_sq(int p) { return view(host_->params[size_t(p)].exp_avg_sq); }
float *GpuExecutor::shard_master() { return view(host_->shard_master); }
float *GpuExecutor::shard_exp_avg() { return view(host_->shard_exp_avg); }
float *GpuExecutor::shard_exp_avg_sq() { return view(host_->shard_exp_avg_sq); }
int64_t GpuExecutor::shard_elements() const {
  return rank_.distributed_optimizer() ? rank_.shard_elements() : 0;
}
int64_t GpuExecutor::param_elements(int p) const {
  return element_count(rank_.params()->Get(uint32_t(p))->shape());
}

std::string GpuExecutor::state_to_host() {
  std::vector<uint8_t> &image = host_->image;
  if (std::string e = device_->to_host(image.data(), base_, image.size()); !e.empty())
    return e;
  for (uint32_t i = 0; i < host_->params.size(); ++i) {
    const pl::Param &p = *rank_.params()->Get(i);
    HostState::Param &h = host_->params[i];
    const size_t n = h.weight.size();
    if (n && (p.dtype() == pl::DType::BF16 || p.dtype() == pl::DType::F16)) {
      const uint8_t *src = image.data() + p.weight_offset();
      for (size_t k = 0; k < n; ++k) {
        uint16_t b;
        std::memcpy(&b, src + 2 * k, 2);
        h.weight[k] = from_half_bits(b, p.dtype());
      }
    } else if (n) {
      std::memcpy(h.weight.data(), image.data() + p.weight_offset(), n * 4);
    }
    if (!h.grad.empty() && p.grad_dtype() != pl::DType::F32) {
      const uint8_t *src = image.data() + p.grad_offset();
      for (size_t k = 0; k < h.grad.size(); ++k) {
        uint16_t b;
        std::memcpy(&b, src + 2 * k, 2);
        h.grad[k] = from_half_bits(b, p.grad_dtype());
      }
    }
  }
  for_each_f32(*host_, rank_, [&](std::vector<float> &v, int64_t off) {
    std::memcpy(v.data(), image.data() + off, v.size() * 4);
  });
  return "";
}

std::string GpuExecutor::state_to_device() {
  std::vector<uint8_t> &image = host_->image;
  for (uint32_t i = 0; i < host_->params.size(); ++i) {
    const pl::Param &p = *rank_.params()->Get(i);
    HostState::Param &h = host_->params[i];
    const size_t n = h.weight.size();
    if (n && (p.dtype() == pl::DType::BF16 || p.dtype() == pl::DType::F16)) {
      uint8_t *dst = image.data() + p.weight_offset();
      for (size_t k = 0; k < n; ++k) {
        const uint16_t b = to_half_bits(h.weight[k], p.dtype());
        std::memcpy(dst + 2 * k, &b, 2);
      }
    } else if (n) {
      std::memcpy(image.data() + p.weight_offset(), h.weight.data(), n * 4);
    }
    if (!h.grad.empty() && p.grad_dtype() != pl::DType::F32) {
      uint8_t *dst = image.data() + p.grad_offset();
      for (size_t k = 0; k < h.grad.size(); ++k) {
        const uint16_t b = to_half_bits(h.grad[k], p.grad_dtype());
        std::memcpy(dst + 2 * k, &b, 2);
      }
    }
  }
  for_each_f32(*host_, rank_, [&](std::vector<float> &v, int64_t off) {
    std::memcpy(image.data() + off, v.data(), v.size() * 4);
  });
  return device_->to_device(base_, image.data(), image.size());
}

// The training log's figures: the counted runs (log_stats.h) downloaded
// run by run, as f32 (16-bit weights converted), and summed on the host.
std::string GpuExecutor::download_floats(uint64_t at, pl::DType t, int64_t n,
                                         std::vector<float> *out) {
  out->resize(size_t(n));
  if (t != pl::DType::BF16 && t != pl::DType::F16)
    return device_->to_host(out->data(), at, uint64_t(n) * 4);
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  if (std::string e = device_->to_host(bits.data(), at, uint64_t(n) * 2); !e.empty())
    return e;
  for (int64_t i = 0; i < n; ++i)
    (*out)[size_t(i)] = from_half_bits(bits[size_t(i)], t);
  return "";
}

std::string GpuExecutor::params_sum_squares(double *out) {
  const bool masters = norm_reads_masters(plan_);
  std::vector<float> x;
  double sum = 0;
  for (const CountedRun &r : counted_runs(plan_, rank_)) {
    const pl::Param &p = *rank_.params()->Get(r.param);
    std::string e;
    if (!masters) {
      const uint64_t bytes = p.dtype() == pl::DType::BF16 || p.dtype() == pl::DType::F16 ? 2 : 4;
      e = download_floats(base_ + uint64_t(p.weight_offset()) + uint64_t(r.begin) * bytes,
                          p.dtype(), r.count, &x);
    } else if (r.shard_at >= 0) {
      e = download_floats(base_ + uint64_t(rank_.shard_master_offset()) + uint64_t(r.shard_at) * 4,
                          pl::DType::F32, r.count, &x);
    } else {
      e = download_floats(base_ + uint64_t(p.master_offset()) + uint64_t(r.begin) * 4,
                          pl::DType::F32, r.count, &x);
    }
    if (!e.empty())
      return e;
    sum += sum_of_squares(x.data(), r.count);
  }
  *out = sum;
  return "";
}

std::string GpuExecutor::grad_stats(float unscale, float clip, GradStats *out) {
  std::vector<float> g;
  *out = GradStats{};
  for (const CountedRun &r : counted_runs(plan_, rank_)) {
    const pl::Param &p = *rank_.params()->Get(r.param);
    if (std::string e = download_floats(base_ + uint64_t(p.grad_offset()) +
                                            uint64_t(r.begin) * element_bytes(p.grad_dtype()),
                                        p.grad_dtype(), r.count, &g);
        !e.empty())
      return e;
    add_grad_stats(g.data(), r.count, unscale, clip, out);
  }
  return "";
}

Executor::MemoryStats GpuExecutor::memory_stats() const {
  MemoryStats m;
  m.allocated = rank_.state_bytes();
  m.max_allocated = allocated_;
  m.reserved = m.max_reserved = allocated_ + device_->own_bytes();
  m.allocations = 1 + device_->own_allocations();
  return m;
}

void *GpuExecutor::value_data(const pl::Program &program, uint32_t value) {
  auto is_io = [&](const flatbuffers::Vector<uint32_t> *list) {
    for (uint32_t k = 0; list && k < list->size(); ++k)
      if (list->Get(k) == value)
        return true;
    return false;
  };
  if (!is_io(program.inputs()) && !is_io(program.outputs()))
    return nullptr; // only a program's inputs and outputs cross to the host
  auto &buf = host_->staging[{&program, value}];
  if (buf.empty())
    buf.assign(size_t(plan_bytes(*program.values()->Get(value))), 0);
  return buf.data();
}

const pl::Program *GpuExecutor::program(const std::string &name) const {
  return programs_.find(name);
}

const pl::Program *GpuExecutor::program_for_micro_batches(const std::string &name,
                                                          int64_t micro_batches,
                                                          std::string *error) {
  const pl::Program *prog = programs_.for_micro_batches(name, micro_batches, error);
  if (!prog || prog == programs_.find(name))
    return prog;
  if (resized_ && resized_micro_batches_ == micro_batches && resized_name_ == name)
    return prog; // the expansion already made (RankPrograms keeps it)
  // A new expansion replaces the previous one: its graph and staged values
  // go with its bytes.
  if (resized_)
    forget_program(resized_);
  resized_ = prog;
  resized_micro_batches_ = micro_batches;
  resized_name_ = name;
  return prog;
}

void GpuExecutor::forget_program(const pl::Program *program) {
  if (auto it = graphs_.find(program); it != graphs_.end()) {
    if (it->second.handle)
      device_->destroy_graph(it->second.handle);
    graphs_.erase(it);
  }
  for (auto it = host_->staging.begin(); it != host_->staging.end();)
    it = it->first.first == program ? host_->staging.erase(it) : std::next(it);
}

void GpuExecutor::set_loss_scale(float scale) {
  if (!base_)
    return;
  if (std::string e = device_->to_device(loss_scale_at_, &scale, 4); !e.empty())
    pending_error_ = e;
}

void GpuExecutor::zero_grads() {
  for (const pl::Param *p : *rank_.params())
    if (p->grad_offset() >= 0)
      if (std::string e = device_->fill(base_ + uint64_t(p->grad_offset()), 0,
                                        uint64_t(element_count(p->shape())) *
                                            element_bytes(p->grad_dtype()));
          !e.empty())
        pending_error_ = e;
}

uint64_t GpuExecutor::address(const pl::Program &program, const pl::GpuArg &a) const {
  auto param = [&](uint64_t i) -> const pl::Param & { return *rank_.params()->Get(uint32_t(i)); };
  switch (a.kind()) {
  case pl::GpuArgKind::VALUE: {
    const pl::Value &v = *program.values()->Get(uint32_t(a.index()));
    switch (v.region()) {
    case pl::Region::ARENA: return arena_base() + v.offset();
    case pl::Region::WEIGHT: return base_ + uint64_t(param(v.offset()).weight_offset());
    case pl::Region::GRAD: return base_ + uint64_t(param(v.offset()).grad_offset());
    }
    return 0;
  }
  case pl::GpuArgKind::WEIGHT: return base_ + uint64_t(param(a.index()).weight_offset());
  case pl::GpuArgKind::GRAD: return base_ + uint64_t(param(a.index()).grad_offset());
  case pl::GpuArgKind::MASTER: return base_ + uint64_t(param(a.index()).master_offset());
  case pl::GpuArgKind::EXP_AVG: return base_ + uint64_t(param(a.index()).exp_avg_offset());
  case pl::GpuArgKind::EXP_AVG_SQ: return base_ + uint64_t(param(a.index()).exp_avg_sq_offset());
  case pl::GpuArgKind::WORKSPACE: return workspace_ + a.index();
  case pl::GpuArgKind::STATE: return base_;
  case pl::GpuArgKind::LOSS_SCALE: return loss_scale_at_;
  default: return 0;
  }
}

std::string GpuExecutor::staged(const pl::Program &program, bool upload) {
  const auto *list = upload ? program.inputs() : program.outputs();
  for (uint32_t k = 0; list && k < list->size(); ++k) {
    if (!upload)
      value_data(program, list->Get(k)); // every output comes back
    auto it = host_->staging.find({&program, list->Get(k)});
    if (it == host_->staging.end())
      continue; // an input never written
    const uint64_t at = arena_base() + program.values()->Get(list->Get(k))->offset();
    std::string e = upload ? device_->to_device(at, it->second.data(), it->second.size())
                           : device_->to_host(it->second.data(), at, it->second.size());
    if (!e.empty())
      return e;
  }
  return "";
}

std::string GpuExecutor::step(const pl::Program &program, const pl::Instruction &ins,
                              const pl::GpuStep &s) {
  switch (s.kind()) {
  case pl::GpuStepKind::NOTHING:
    return "";
  case pl::GpuStepKind::KERNEL: {
    const uint32_t k = uint32_t(s.kernel());
    std::vector<uint64_t> values;
    for (const pl::GpuArg *a : *s.args()) {
      switch (a->kind()) {
      // Device scalars (write_scalars), so a captured graph sees each run's.
      case pl::GpuArgKind::SEED: values.push_back(seed_at_); break;
      case pl::GpuArgKind::RNG_OFFSET: values.push_back(rng_offset_at(ins.micro_batch())); break;
      case pl::GpuArgKind::TP_RANK: values.push_back(uint64_t(rank_.tp_rank())); break;
      case pl::GpuArgKind::DP_RANK: values.push_back(uint64_t(rank_.dp_rank())); break;
      case pl::GpuArgKind::CONSTANT: values.push_back(a->index()); break;
      default: values.push_back(address(program, *a)); break;
      }
    }
    // Every argument is 8 bytes: a device pointer or an unsigned long long.
    std::vector<void *> params(values.size());
    for (size_t i = 0; i < values.size(); ++i)
      params[i] = &values[i];
    return device_->launch(k, *plan_.kernels()->Get(k), params.data(), uint32_t(params.size()));
  }
  case pl::GpuStepKind::GEMM: {
    // ptr: A, B, D, bias, aux; the step lists bias and aux only where its
    // epilogue takes them (verified by the plan reader).
    uint64_t ptr[5] = {0, 0, 0, 0, 0};
    const pl::GemmEpilogue e = s.gemm()->epilogue();
    uint32_t next = 0;
    for (uint32_t slot = 0; slot < 5; ++slot) {
      if ((slot == 3 && !gemm_epilogue_has_bias(e)) || (slot == 4 && !gemm_epilogue_has_aux(e)))
        continue;
      ptr[slot] = address(program, *s.args()->Get(next++));
    }
    return device_->gemm(*s.gemm(), ptr);
  }
  case pl::GpuStepKind::ALL_REDUCE: {
    std::string err;
    DeviceComm *c = comm(s.group(), &err);
    if (!c)
      return err; // "" for a group of one rank
    const uint64_t at = address(program, *s.args()->Get(0));
    return c->all_reduce(at, at, s.count(),
                         s.element() == pl::ReduceElement::F64 ? CommElement::F64 : CommElement::F32,
                         s.reduce() == 1 ? ReduceOp::Max : ReduceOp::Sum, 1.0);
  }
  case pl::GpuStepKind::NATIVE:
    return native(program, ins, s);
  }
  return "unknown GPU step";
}

DeviceComm *GpuExecutor::comm(int64_t group, std::string *error) const {
  error->clear();
  if (group < 0 || group >= kNumGroups) {
    *error = "names group " + std::to_string(group) + "; plans number groups 0 to " +
             std::to_string(kNumGroups - 1);
    return nullptr;
  }
  if (!groups_ || !groups_->get(Group(group)))
    return nullptr; // a group of one rank
  if (!comms_[group])
    *error = std::string("the ") + group_name(Group(group)) + " group has no GPU connection";
  return comms_[group];
}

std::string GpuExecutor::point_to_point(const pl::Program &program, const pl::Instruction &ins,
                                        DeviceComm &pp) {
  const bool send = ins.op() == pl::Opcode::SEND;
  const uint32_t v = send ? ins.in()->Get(0) : ins.out()->Get(0);
  const pl::Value &value = *program.values()->Get(v);
  const uint64_t at = address(program, pl::GpuArg(pl::GpuArgKind::VALUE, v));
  const int peer = int(ins.ints()->Get(0));
  const uint64_t n = uint64_t(element_count(value));
  return send ? pp.send(at, n, element_of(value.dtype()), peer)
              : pp.recv(at, n, element_of(value.dtype()), peer);
}

std::string GpuExecutor::native(const pl::Program &program, const pl::Instruction &ins,
                                const pl::GpuStep &s) {
  auto ints = [&](uint32_t k) { return ins.ints()->Get(k); };
  auto value_at = [&](uint32_t v) {
    return address(program, pl::GpuArg(pl::GpuArgKind::VALUE, v));
  };
  auto arg_or = [&](uint32_t k, uint32_t v) {
    return s.args() && s.args()->size() > k ? address(program, *s.args()->Get(k)) : value_at(v);
  };
  auto count = [&](uint32_t v) { return uint64_t(element_count(*program.values()->Get(v))); };
  auto elem = [&](uint32_t v) { return element_of(program.values()->Get(v)->dtype()); };
  std::string err;
  switch (ins.op()) {
  case pl::Opcode::ALL_REDUCE: {
    const uint32_t in = ins.in()->Get(0), out = ins.out()->Get(0);
    DeviceComm *c = comm(ints(0), &err);
    if (!c)
      return err.empty() ? "exchanges activations within a group of one rank" : err;
    return c->all_reduce(value_at(in), value_at(out), count(in), elem(in), ReduceOp::Sum, 1.0);
  }
  case pl::Opcode::SEQ_ALL_GATHER:
  case pl::Opcode::SEQ_REDUCE_SCATTER: {
    const uint32_t in = ins.in()->Get(0), out = ins.out()->Get(0);
    DeviceComm *c = comm(ints(0), &err);
    if (!c)
      return err.empty() ? "exchanges activations within a group of one rank" : err;
    const uint64_t src = arg_or(0, in), dst = arg_or(1, out);
    if (ins.op() == pl::Opcode::SEQ_ALL_GATHER)
      return c->all_gather(src, dst, count(in), elem(in));
    return c->reduce_scatter(src, dst, count(out), elem(out), 1.0);
  }
  case pl::Opcode::ALL_REDUCE_GRADS: {
    DeviceComm *c = comm(ints(0), &err);
    if (!c)
      return err;
    const double scale = ins.floats()->Get(0);
    const uint32_t n = ins.params() && ins.params()->size() ? ins.params()->size()
                                                            : rank_.params()->size();
    if (std::string e = c->group_start(); !e.empty())
      return e;
    for (uint32_t k = 0; k < n; ++k) {
      const uint32_t p = ins.params() && ins.params()->size() ? ins.params()->Get(k) : k;
      const pl::Param &param = *rank_.params()->Get(p);
      if (param.grad_offset() < 0)
        continue;
      const uint64_t at = base_ + uint64_t(param.grad_offset());
      if (std::string e = c->all_reduce(at, at, uint64_t(element_count(param.shape())),
                                        element_of(param.grad_dtype()), ReduceOp::Sum, scale);
          !e.empty())
        return e;
    }
    return c->group_end();
  }
  case pl::Opcode::REDUCE_GRADS:
  case pl::Opcode::ALL_GATHER_PARAMS: {
    DeviceComm *c = comm(ints(0), &err);
    // One data-parallel rank: the bucket is already whole. A scale below 1
    // (an expert bucket at expert_data_parallel 1 with dp > 1) comes as
    // the plan's kernel steps (compiler/cuda/GpuSteps.cpp), never here.
    if (!c && err.empty() && ins.op() == pl::Opcode::REDUCE_GRADS && ins.floats()->Get(0) != 1.0)
      return "reduces gradient bucket " + std::to_string(ints(1)) + " over group " +
             std::to_string(ints(0)) + " of one rank with scale " +
             std::to_string(ins.floats()->Get(0)) +
             " and no kernel to apply it (expert_data_parallel 1 with data_parallel_size > 1 "
             "under expert_model_parallel_size); recompile the spec with this mtc";
    if (!c)
      return err;
    const pl::Bucket &b = *rank_.buckets()->Get(uint32_t(ints(1)));
    const uint64_t n = uint64_t(b.end() - b.begin()), shard = n / uint64_t(c->size());
    const uint64_t mine = uint64_t(b.begin()) + uint64_t(c->rank()) * shard;
    if (ins.op() == pl::Opcode::ALL_GATHER_PARAMS)
      return c->all_gather(weight_base_ + mine * weight_bytes_,
                           weight_base_ + uint64_t(b.begin()) * weight_bytes_, shard,
                           weight_element_);
    const uint64_t at = grad_base_ + uint64_t(b.begin()) * grad_bytes_;
    const double scale = ins.floats()->Get(0);
    if (ints(2) == 0)
      return c->all_reduce(at, at, n, grad_element_, ReduceOp::Sum, scale);
    return c->reduce_scatter(at, grad_base_ + mine * grad_bytes_, shard, grad_element_, scale);
  }
  case pl::Opcode::ALL_REDUCE_TIED_GRAD: {
    // Mine to the peer, the peer's into the workspace; the next step adds it.
    DeviceComm *pp = comm(int64_t(Group::PP), &err);
    if (!pp)
      return err.empty() ? "needs a pipeline group" : err;
    const pl::Param &param = *rank_.params()->Get(ins.params()->Get(0));
    const uint64_t n = uint64_t(element_count(param.shape()));
    if (!s.args() || s.args()->size() != 2)
      return "the plan's tied-gradient exchange lacks its gradient and workspace arguments";
    const int peer = int(ints(0));
    if (std::string e = pp->group_start(); !e.empty())
      return e;
    const CommElement t = element_of(param.grad_dtype());
    if (std::string e = pp->send(address(program, *s.args()->Get(0)), n, t, peer); !e.empty())
      return e;
    if (std::string e = pp->recv(address(program, *s.args()->Get(1)), n, t, peer);
        !e.empty())
      return e;
    return pp->group_end();
  }
  case pl::Opcode::MOE_DISPATCH:
  case pl::Opcode::MOE_COMBINE:
    return moe_exchange(program, ins, s);
  default: // SEND and RECV run in groups (run_steps)
    return "the plan asks the executor to run this opcode's communication itself, which it "
           "has none of; recompile the spec with this mtc";
  }
}

// MOE_DISPATCH and MOE_COMBINE (plan.fbs) over the group of the stage's
// experts (ints[0]: ep, or tp_ep at expert_tensor_parallel ints[3] > 1,
// whose alltoall combine also sums over expt_tp). The step's arguments: the
// workspace of the gathered token counts, then that of the rows
// (run_moe_exchange).
std::string GpuExecutor::moe_exchange(const pl::Program &program, const pl::Instruction &ins,
                                      const pl::GpuStep &s) {
  const bool dispatch = ins.op() == pl::Opcode::MOE_DISPATCH;
  const int64_t group = ins.ints()->Get(0), L = ins.ints()->Get(1);
  const bool allgather = ins.ints()->Get(2) == 1;
  auto value = [&](uint32_t v) -> const pl::Value & { return *program.values()->Get(v); };
  auto at = [&](uint32_t v) { return address(program, pl::GpuArg(pl::GpuArgKind::VALUE, v)); };
  // dispatch: in y[N, H], tokens_per_expert[E]; out rows[R, H], local_counts[L], layout[S, L]
  // combine:  in rows[R, H], layout[S, L], tokens_per_expert[E]; out y[N, H]
  const uint32_t y = dispatch ? ins.in()->Get(0) : ins.out()->Get(0);
  const uint32_t rows = dispatch ? ins.out()->Get(0) : ins.in()->Get(0);
  const uint32_t tpe = dispatch ? ins.in()->Get(1) : ins.in()->Get(2);
  const pl::Value &yv = value(y), &rv = value(rows);
  const int64_t E = value(tpe).shape()->Get(0);
  const int64_t N = yv.shape()->Get(0), R = rv.shape()->Get(0);
  const uint64_t H = uint64_t(element_count(yv) / std::max<int64_t>(N, 1));
  const CommElement t = element_of(yv.dtype());
  if (!s.args() || s.args()->size() != 2)
    return "the plan's expert exchange lacks its two workspace arguments; recompile the spec "
           "with this mtc";
  MoeExchange x;
  x.dispatch = dispatch;
  x.allgather = allgather;
  x.y = at(y);
  x.rows = at(rows);
  x.tokens_per_expert = at(tpe);
  x.local_counts = dispatch ? at(ins.out()->Get(1)) : 0;
  x.layout = dispatch ? at(ins.out()->Get(2)) : at(ins.in()->Get(1));
  x.counts_workspace = address(program, *s.args()->Get(0));
  x.rows_workspace = address(program, *s.args()->Get(1));
  x.n = N;
  x.r = R;
  x.experts = E;
  x.local_experts = L;
  x.hidden = H;
  x.element = t;
  x.element_bytes = element_bytes(yv.dtype());
  x.etp = ins.ints()->Get(3);
  std::string err;
  DeviceComm *c = comm(group, &err);
  if (!err.empty())
    return err;
  DeviceComm *expt_tp = nullptr; // the combine's sum over the etp ranks (alltoall)
  if (x.etp > 1) {
    expt_tp = comm(int64_t(Group::EXPT_TP), &err);
    if (!err.empty())
      return err;
  }
  return run_moe_exchange(*device_, c, x, expt_tp);
}

// gpu_executor.h has the algorithm.
std::string run_moe_exchange(GpuDevice &device, DeviceComm *c, const MoeExchange &x,
                             DeviceComm *expt_tp) {
  const bool dispatch = x.dispatch, allgather = x.allgather;
  const int64_t E = x.experts, L = x.local_experts, N = x.n, R = x.r, etp = x.etp;
  const uint64_t H = x.hidden, row_bytes = H * x.element_bytes;
  const CommElement t = x.element;
  const uint64_t counts_at = x.counts_workspace, buffer = x.rows_workspace;
  // S sources (the group's ranks), this rank g of them and its ep rank q.
  const int S = c ? c->size() : 1, g = c ? c->rank() : 0;
  if (L < 1 || etp < 1 || S % etp != 0 || E != int64_t(S) / etp * L)
    return "the plan's expert exchange has " + std::to_string(E) + " experts, " +
           std::to_string(L) + " a rank, over a group of " + std::to_string(S) +
           " ranks at expert_tensor_parallel " + std::to_string(etp) +
           "; recompile the spec with this mtc";
  const int64_t q = g / etp;
  const int mine_etp = int(g % etp);
  // Every rank's tokens_per_expert, [S][E] (i32 values moved as 4-byte
  // elements: a gather copies bytes).
  // The host waits by synchronize(), which watches the collectives for a
  // peer that failed (a plain stream wait would hang on it).
  auto gather_counts = [&](std::vector<int32_t> *all) -> std::string {
    all->assign(size_t(S * E), 0);
    if (c) {
      if (std::string e = c->all_gather(x.tokens_per_expert, counts_at, uint64_t(E), CommElement::F32);
          !e.empty())
        return e;
      if (std::string e = device.synchronize(); !e.empty())
        return e;
      return device.to_host(all->data(), counts_at, uint64_t(S * E) * 4);
    }
    return device.to_host(all->data(), x.tokens_per_expert, uint64_t(E) * 4);
  };
  // prefix(s, e): the rows of rank s's y before its expert e.
  std::vector<int32_t> counts; // [S][E], when gathered
  auto prefix = [&](int src, int64_t e) {
    int64_t n = 0;
    for (int64_t k = 0; k < e; ++k)
      n += counts[size_t(src * E + k)];
    return uint64_t(n);
  };
  // layout[s][j]: rows rank s sends this rank for local expert j; their
  // place in `rows`: local expert major, then source rank.
  std::vector<int32_t> layout(size_t(S * L)), local(size_t(L), 0);
  std::vector<int32_t> mine(static_cast<size_t>(E), 0); // this rank's tokens_per_expert
  if (dispatch || allgather) {
    if (std::string e = gather_counts(&counts); !e.empty())
      return e;
    // Every rank's receive rows against the plan's, on every rank, before
    // any row moves: a bound below the worst case (moe_dispatch_buffer_factor)
    // stops all of them with the same error (cpu_kernels_moe.h).
    if (dispatch)
      if (std::string e = cpu::moe_receive_overflow(counts.data(), S, E, L, R); !e.empty())
        return e;
    for (int src = 0; src < S; ++src)
      for (int64_t j = 0; j < L; ++j)
        layout[size_t(src * L + j)] = counts[size_t(src * E + q * L + j)];
    std::copy(counts.begin() + g * E, counts.begin() + (g + 1) * E, mine.begin());
  } else {
    if (std::string e = device.synchronize(); !e.empty())
      return e;
    if (std::string e = device.to_host(layout.data(), x.layout,
                                         uint64_t(S * L) * 4);
        !e.empty())
      return e;
    if (std::string e = device.to_host(mine.data(), x.tokens_per_expert, uint64_t(E) * 4); !e.empty())
      return e;
  }
  std::vector<uint64_t> dest(size_t(S * L)); // row of (j, s) in `rows`
  uint64_t total = 0, sent = 0;
  for (int64_t j = 0; j < L; ++j)
    for (int src = 0; src < S; ++src) {
      const int32_t n = layout[size_t(src * L + j)];
      if (n < 0)
        return "an expert-parallel peer counted " + std::to_string(n) + " rows";
      dest[size_t(src * L + j)] = total;
      total += uint64_t(n);
      local[size_t(j)] += n;
    }
  std::vector<uint64_t> mine_before(size_t(E + 1), 0); // rows of this rank's y before expert e
  for (int64_t e = 0; e < E; ++e)
    mine_before[size_t(e + 1)] = mine_before[size_t(e)] + uint64_t(std::max(mine[size_t(e)], 0));
  sent = mine_before[size_t(E)];
  if (total > uint64_t(R) || sent > uint64_t(N))
    return "the expert exchange has " + std::to_string(total) + " rows for " +
           std::to_string(R) + " receive rows and " + std::to_string(sent) + " for " +
           std::to_string(N) + " permuted rows: the plan's sizes do not hold these counts";
  auto copy_rows = [&](uint64_t dst, uint64_t src, uint64_t n) -> std::string {
    return n ? device.copy(dst, src, n * row_bytes) : "";
  };
  const uint64_t rows_at = x.rows, y_at = x.y;
  if (dispatch) {
    if (allgather) {
      // Every rank's y, then this rank's experts' rows picked out of them.
      if (c) {
        if (std::string e = c->all_gather(y_at, buffer, uint64_t(N) * H, t); !e.empty())
          return e;
      }
      const uint64_t from = c ? buffer : y_at;
      for (int src = 0; src < S; ++src)
        for (int64_t j = 0; j < L; ++j)
          if (std::string e = copy_rows(rows_at + dest[size_t(src * L + j)] * row_bytes,
                                        from + (uint64_t(src) * uint64_t(N) +
                                                prefix(src, q * L + j)) * row_bytes,
                                        uint64_t(layout[size_t(src * L + j)]));
              !e.empty())
            return e;
    } else {
      // Group rank p gets this rank's rows of its ep rank's experts
      // [(p / etp) L, (p / etp) L + L), which are consecutive in y (the etp
      // ranks of one ep rank the same rows); the rows from s arrive s-major
      // in the staging buffer and are then placed local expert major.
      const size_t peers = static_cast<size_t>(S);
      std::vector<uint64_t> sc(peers), sd(peers), rc(peers), rd(peers);
      uint64_t staged_rows = 0;
      for (int p = 0; p < S; ++p) {
        const int64_t b = p / etp * L;
        sd[size_t(p)] = mine_before[size_t(b)] * H;
        sc[size_t(p)] = (mine_before[size_t(b + L)] - mine_before[size_t(b)]) * H;
        uint64_t n = 0;
        for (int64_t j = 0; j < L; ++j)
          n += uint64_t(layout[size_t(p * L + j)]);
        rd[size_t(p)] = staged_rows * H;
        rc[size_t(p)] = n * H;
        staged_rows += n;
      }
      if (c) {
        if (std::string e = c->all_to_all_v(y_at, sc, sd, buffer, rc, rd, t); !e.empty())
          return e;
      } else if (std::string e = copy_rows(buffer, y_at, staged_rows); !e.empty()) {
        return e;
      }
      for (int src = 0; src < S; ++src) {
        uint64_t off = rd[size_t(src)] / std::max<uint64_t>(H, 1);
        for (int64_t j = 0; j < L; ++j) {
          const uint64_t n = uint64_t(layout[size_t(src * L + j)]);
          if (std::string e = copy_rows(rows_at + dest[size_t(src * L + j)] * row_bytes,
                                        buffer + off * row_bytes, n);
              !e.empty())
            return e;
          off += n;
        }
      }
    }
    if (total < uint64_t(R))
      if (std::string e = device.fill(rows_at + total * row_bytes, 0,
                                        (uint64_t(R) - total) * row_bytes);
          !e.empty())
        return e;
    if (std::string e = device.to_device(x.local_counts, local.data(), uint64_t(L) * 4);
        !e.empty())
      return e;
    return device.to_device(x.layout, layout.data(), uint64_t(S * L) * 4);
  }
  // Combine: every row back to its source rank, at its place in that
  // rank's y, as the sum of the etp ranks' rows for it.
  if (allgather) {
    // Each rank writes its rows into a zeroed [S, N] image of every rank's
    // y; summing the images over the group and keeping block g (a
    // reduce-scatter) gives each rank its rows summed over the etp ranks
    // (plus zeros: exact at etp 1).
    const uint64_t image = c ? buffer : y_at;
    if (std::string e = device.fill(image, 0, uint64_t(S) * uint64_t(N) * row_bytes);
        !e.empty())
      return e;
    for (int src = 0; src < S; ++src)
      for (int64_t j = 0; j < L; ++j)
        if (std::string e = copy_rows(image + (uint64_t(src) * uint64_t(N) +
                                               prefix(src, q * L + j)) * row_bytes,
                                      rows_at + dest[size_t(src * L + j)] * row_bytes,
                                      uint64_t(layout[size_t(src * L + j)]));
            !e.empty())
          return e;
    if (c)
      return c->reduce_scatter(buffer, y_at, uint64_t(N) * H, t, 1.0);
    return "";
  }
  // Alltoall: the rows for rank p (those received from it) gathered p-major
  // in the staging buffer, local expert order within; at etp > 1 the ranks
  // p of etp rank 0 first, then those of etp rank 1, and so on. The etp
  // ranks of this ep rank stage the same rows in the same order: a
  // reduce-scatter over expt_tp of those blocks (in place) leaves etp rank
  // k the sums of the rows of its own sources (as Megatron reduce-scatters
  // over tp), and p gets its rows from the rank of its own etp rank only.
  // Rank p sends back this rank's rows of its ep rank's experts, which land
  // consecutive in y.
  const size_t peers = static_cast<size_t>(S);
  std::vector<uint64_t> sc(peers), sd(peers), rc(peers), rd(peers);
  std::vector<uint64_t> blocks(size_t(etp), 0); // staged elements by the source's etp rank
  uint64_t staged_rows = 0;
  for (int64_t k = 0; k < etp; ++k)
    for (int p = int(k); p < S; p += int(etp)) {
      sd[size_t(p)] = staged_rows * H;
      for (int64_t j = 0; j < L; ++j) {
        const uint64_t n = uint64_t(layout[size_t(p * L + j)]);
        if (std::string e = copy_rows(buffer + staged_rows * row_bytes,
                                      rows_at + dest[size_t(p * L + j)] * row_bytes, n);
            !e.empty())
          return e;
        staged_rows += n;
      }
      blocks[size_t(k)] += staged_rows * H - sd[size_t(p)];
      sc[size_t(p)] = p % etp == mine_etp ? staged_rows * H - sd[size_t(p)] : 0;
      const int64_t b = p / etp * L;
      rd[size_t(p)] = mine_before[size_t(b)] * H;
      rc[size_t(p)] =
          p % etp == mine_etp ? (mine_before[size_t(b + L)] - mine_before[size_t(b)]) * H : 0;
    }
  if (etp > 1) {
    if (!expt_tp || expt_tp->size() != etp || expt_tp->rank() != mine_etp)
      return "the expert exchange sums its rows over " + std::to_string(etp) +
             " expert tensor-parallel ranks, but the expt_tp group has " +
             std::to_string(expt_tp ? expt_tp->size() : 1) +
             (expt_tp ? " with this rank at " + std::to_string(expt_tp->rank()) : std::string());
    uint64_t before = 0; // staged elements of the etp ranks before this one
    for (int k = 0; k < mine_etp; ++k)
      before += blocks[size_t(k)];
    if (staged_rows)
      if (std::string e = expt_tp->reduce_scatter_v(buffer, blocks,
                                                    buffer + before * x.element_bytes, t);
          !e.empty())
        return e;
  }
  if (c) {
    if (std::string e = c->all_to_all_v(buffer, sc, sd, y_at, rc, rd, t); !e.empty())
      return e;
  } else if (std::string e = copy_rows(y_at, buffer, staged_rows); !e.empty()) {
    return e;
  }
  if (sent < uint64_t(N))
    return device.fill(y_at + sent * row_bytes, 0, (uint64_t(N) - sent) * row_bytes);
  return "";
}


// The data-parallel groups' collectives over the flat buffers (dense
// buckets over dp, expert buckets over expt_dp) run on the side stream: a
// bucket's reduction (or its gather) then overlaps the kernels after it
// until something touches its bytes.
bool GpuExecutor::on_side(const pl::Instruction &ins) const {
  const pl::Opcode op = ins.op();
  const int g = native_collective_group(ins);
  // A bucket's scale over a group of one rank is kernels (no collective):
  // the compute stream's.
  for (const pl::GpuStep *s : *ins.gpu())
    if (s->kind() != pl::GpuStepKind::NATIVE)
      return false;
  return (op == pl::Opcode::REDUCE_GRADS || op == pl::Opcode::ALL_GATHER_PARAMS ||
          op == pl::Opcode::ALL_REDUCE_GRADS) &&
         (g == int(Group::DP) || g == int(Group::EXPT_DP));
}


// Whether an instruction left on the compute stream communicates over a
// communicator the side stream uses (dp or expt_dp, or a group sharing
// theirs): the side stream's collectives on it come first, so its order
// is the program's. The expert exchange reads counts on the host, which
// waits for the compute stream only: it joins the side stream first too.
bool GpuExecutor::uses_side_comm(const pl::Instruction &ins) const {
  auto on_side_comm = [&](int64_t g) {
    if (g < 0 || g >= kNumGroups || !comms_[g])
      return false;
    return std::find(side_comms_.begin(), side_comms_.end(), comms_[g]) != side_comms_.end();
  };
  if (moe_exchange_op(ins))
    return true;
  for (const pl::GpuStep *s : *ins.gpu())
    if (s->kind() == pl::GpuStepKind::ALL_REDUCE && on_side_comm(s->group()))
      return true;
  return on_side_comm(native_collective_group(ins));
}

// The distributed optimizer's generated kernels (SHARDED_ADAMW, _SGD,
// _GRAD_NORM: compiler/cuda/GpuSteps.cpp) index a dense bucket's segment
// tables by the dp rank and an expert bucket's (Bucket.group 6) by the
// expt_dp rank they compute as (tp_rank + tp dp_rank) / (ep etp), the
// plan's GpuShardLayout giving ep x etp. A bucket whose group's size or
// this rank's place in it is not what the kernels compute is refused here.
std::string GpuExecutor::check_shards() const {
  if (!rank_.distributed_optimizer() || !rank_.buckets())
    return "";
  const int dp = std::max(1, plan_.data_parallel()), tp = std::max(1, plan_.tensor_parallel());
  const int ep = std::max(1, plan_.expert_model_parallel());
  const int etp = std::max(1, plan_.expert_tensor_parallel());
  for (uint32_t i = 0; i < rank_.buckets()->size(); ++i) {
    const pl::Bucket &b = *rank_.buckets()->Get(i);
    const int g = b.group();
    if (g != int(Group::DP) && g != int(Group::EXPT_DP))
      return "bucket " + std::to_string(i) + " names group " + std::to_string(g) +
             "; buckets reduce over dp (0) or expt_dp (6)";
    const DeviceComm *c = comms_[g];
    const int size = c ? c->size() : 1, rank = c ? c->rank() : 0;
    const bool expert = g == int(Group::EXPT_DP);
    const int want_size = expert ? tp * dp / (ep * etp) : dp;
    const int want_rank = expert ? (rank_.tp_rank() + tp * rank_.dp_rank()) / (ep * etp)
                                 : (dp > 1 ? rank_.dp_rank() : 0);
    if (size == want_size && rank == want_rank)
      continue;
    return "the distributed optimizer shards bucket " + std::to_string(i) + " over the " +
           group_name(Group(g)) + " group (" + std::to_string(size) + " ranks, this one " +
           std::to_string(rank) + "), where the GPU optimizer kernels read rank " +
           std::to_string(want_rank) + " of " + std::to_string(want_size) +
           " (expert_model_parallel_size " + std::to_string(ep) +
           ", expert_tensor_parallel_size " + std::to_string(etp) +
           "); turn use_distributed_optimizer off or run with --device cpu";
  }
  return "";
}

bool GpuExecutor::host_synchronizing(const pl::Program &program) const {
  const auto *insts = program.instructions();
  for (uint32_t i = 0; insts && i < insts->size(); ++i)
    if (moe_exchange_op(*insts->Get(i)))
      return true;
  return false;
}

// The device bytes an instruction's steps may read or write, as spans;
// where the plan does not bound them (a workspace pointer), to the end of
// their region.
void GpuExecutor::spans_of(const pl::Program &program, const pl::Instruction &ins,
                           std::vector<Span> *out) const {
  out->clear();
  const uint64_t state_end = base_ + rank_.state_bytes();
  auto param = [&](uint64_t i) -> const pl::Param & { return *rank_.params()->Get(uint32_t(i)); };
  auto f32_bytes = [&](const pl::Param &p) { return uint64_t(element_count(p.shape())) * 4; };
  auto weight_span = [&](const pl::Param &p) {
    const bool half = p.dtype() == pl::DType::BF16 || p.dtype() == pl::DType::F16;
    const uint64_t at = base_ + uint64_t(p.weight_offset());
    out->push_back({at, at + uint64_t(element_count(p.shape())) * (half ? 2 : 4)});
  };
  auto grad_span = [&](const pl::Param &p) {
    if (p.grad_offset() >= 0)
      out->push_back({base_ + uint64_t(p.grad_offset()),
                      base_ + uint64_t(p.grad_offset()) +
                          uint64_t(element_count(p.shape())) * element_bytes(p.grad_dtype())});
  };
  auto value_span = [&](uint32_t v) {
    const pl::Value &value = *program.values()->Get(v);
    switch (value.region()) {
    case pl::Region::ARENA: {
      const uint64_t at = arena_base() + value.offset();
      out->push_back({at, at + plan_bytes(value)});
      return;
    }
    case pl::Region::WEIGHT: weight_span(param(value.offset())); return;
    case pl::Region::GRAD: grad_span(param(value.offset())); return;
    }
    out->push_back({base_, state_end}); // no such region: all of the state
  };
  auto arg_span = [&](const pl::GpuArg &a) {
    switch (a.kind()) {
    case pl::GpuArgKind::VALUE: value_span(uint32_t(a.index())); return;
    case pl::GpuArgKind::WEIGHT: weight_span(param(a.index())); return;
    case pl::GpuArgKind::GRAD: grad_span(param(a.index())); return;
    case pl::GpuArgKind::MASTER:
    case pl::GpuArgKind::EXP_AVG:
    case pl::GpuArgKind::EXP_AVG_SQ: {
      const uint64_t at = address(program, a);
      out->push_back({at, at + f32_bytes(param(a.index()))});
      return;
    }
    case pl::GpuArgKind::WORKSPACE: out->push_back({workspace_ + a.index(), loss_scale_at_}); return;
    case pl::GpuArgKind::STATE: out->push_back({base_, state_end}); return;
    default: return; // the device scalars and by-value arguments: never the side stream's
    }
  };
  auto bucket_range = [&](uint64_t base, uint64_t bytes) {
    const pl::Bucket &b = *rank_.buckets()->Get(uint32_t(ins.ints()->Get(1)));
    out->push_back({base + uint64_t(b.begin()) * bytes, base + uint64_t(b.end()) * bytes});
  };
  switch (ins.op()) {
  case pl::Opcode::REDUCE_GRADS: bucket_range(grad_base_, grad_bytes_); return;
  case pl::Opcode::ALL_GATHER_PARAMS: bucket_range(weight_base_, weight_bytes_); return;
  case pl::Opcode::ALL_REDUCE_GRADS:
    if (ins.params() && ins.params()->size())
      for (uint32_t p : *ins.params())
        grad_span(param(p));
    else
      out->push_back({base_, state_end});
    return;
  case pl::Opcode::SEND:
  case pl::Opcode::RECV:
  case pl::Opcode::ALL_REDUCE:
  case pl::Opcode::SEQ_ALL_GATHER:
  case pl::Opcode::SEQ_REDUCE_SCATTER:
    for (const auto *list : {ins.in(), ins.out()})
      for (uint32_t k = 0; list && k < list->size(); ++k)
        value_span(list->Get(k));
    break; // and the steps' arguments below
  default:
    break;
  }
  for (const pl::GpuStep *s : *ins.gpu()) {
    if (s->kind() == pl::GpuStepKind::NATIVE && ins.op() == pl::Opcode::ALL_REDUCE_TIED_GRAD &&
        ins.params() && ins.params()->size())
      grad_span(param(ins.params()->Get(0)));
    for (uint32_t k = 0; s->args() && k < s->args()->size(); ++k)
      arg_span(*s->args()->Get(k));
  }
}

// The u64 slots after the loss scale's: the seed (slot 0), the program's
// RNG offset (slot 1), then micro-batch m's (slot 2 + m).
uint64_t GpuExecutor::rng_offset_at(int32_t micro_batch) const {
  return seed_at_ + kGpuScalarSlotBytes * (1 + uint64_t(micro_batch + 1));
}

// This run's seed and RNG offsets into their slots: a micro-batch without
// an offset of its own uses the program's, as the CPU executor does.
std::string GpuExecutor::write_scalars(uint64_t rng_offset) {
  std::vector<uint64_t> slots = {seed_, rng_offset};
  for (uint64_t m = 0; m < micro_slots_; ++m)
    slots.push_back(m < micro_offsets_.size() ? micro_offsets_[m] : rng_offset);
  return device_->to_device(seed_at_, slots.data(), slots.size() * kGpuScalarSlotBytes);
}

std::string GpuExecutor::run_steps(const pl::Program &program) {
  const auto *insts = program.instructions();
  auto at = [&](uint32_t i, const std::string &e) {
    return "rank " + std::to_string(rank_.rank()) + ": " + str(program.name()) + " " +
           instruction_label(*insts->Get(i), i) + ": " + e;
  };
  // comm_order.h checks at compile time that these groups cannot deadlock.
  auto is_p2p = [&](uint32_t i) { return issued_as_p2p(*insts->Get(i)); };
  // The side stream's collectives not yet joined, oldest first, each with
  // the bytes it uses: an instruction on the compute stream that touches
  // one waits for it and the older ones; one that talks over the
  // data-parallel group waits for all of them.
  std::vector<std::vector<Span>> pending;
  std::vector<Span> spans;
  auto join = [&](uint32_t i, size_t batches) -> std::string {
    if (pending.empty())
      return "";
    batches = std::min(batches, pending.size());
    pending.erase(pending.begin(), pending.begin() + long(batches));
    if (std::string e = device_->join_side(batches); !e.empty())
      return at(i, "waiting for the data-parallel collectives: " + e);
    return "";
  };
  auto wait_if_needed = [&](uint32_t i) -> std::string {
    if (pending.empty())
      return "";
    const pl::Instruction &ins = *insts->Get(i);
    if (uses_side_comm(ins))
      return join(i, pending.size());
    spans_of(program, ins, &spans);
    auto meets = [&](const std::vector<Span> &batch) {
      for (const Span &s : spans)
        for (const Span &p : batch)
          if (s.first < p.second && p.first < s.second)
            return true;
      return false;
    };
    for (size_t k = pending.size(); k-- > 0;)
      if (meets(pending[k]))
        return join(i, k + 1);
    return "";
  };
  for (uint32_t i = 0; insts && i < insts->size(); ++i) {
    if (side_stream_ && on_side(*insts->Get(i))) {
      const pl::Instruction &ins = *insts->Get(i);
      if (std::string e = device_->begin_side(); !e.empty())
        return at(i, "starting the data-parallel stream: " + e);
      for (const pl::GpuStep *s : *ins.gpu())
        if (std::string e = step(program, ins, *s); !e.empty()) {
          device_->end_side();
          return at(i, e);
        }
      if (std::string e = device_->end_side(); !e.empty())
        return at(i, "closing the data-parallel stream's work: " + e);
      spans_of(program, ins, &spans);
      pending.push_back(spans);
      continue;
    }
    if (is_p2p(i)) {
      // A run of sends and receives progresses as one group.
      std::string err;
      DeviceComm *pp = comm(int64_t(Group::PP), &err);
      if (!pp)
        return at(i, err.empty() ? "needs a pipeline group" : err);
      uint32_t end = i;
      while (end < insts->size() && is_p2p(end))
        ++end;
      for (uint32_t k = i; k < end; ++k)
        if (std::string e = wait_if_needed(k); !e.empty())
          return e;
      if (std::string e = pp->group_start(); !e.empty())
        return at(i, e);
      for (uint32_t k = i; k < end; ++k)
        if (std::string e = point_to_point(program, *insts->Get(k), *pp); !e.empty())
          return at(k, e);
      if (std::string e = pp->group_end(); !e.empty())
        return at(end - 1, e);
      i = end - 1;
      continue;
    }
    if (std::string e = wait_if_needed(i); !e.empty())
      return e;
    const pl::Instruction &ins = *insts->Get(i);
    for (const pl::GpuStep *s : *ins.gpu())
      if (std::string e = step(program, ins, *s); !e.empty())
        return at(i, e);
  }
  // Everything joins the compute stream before the program ends (a capture
  // must end joined; the host reads after the compute stream's wait).
  return insts && insts->size() ? join(insts->size() - 1, pending.size()) : "";
}

void GpuExecutor::drop_graphs() {
  for (auto &[program, g] : graphs_)
    if (g.handle)
      device_->destroy_graph(g.handle);
  graphs_.clear();
}

void GpuExecutor::set_cuda_graphs(bool on) {
  if (!on)
    drop_graphs();
  use_graphs_ = on;
}

void GpuExecutor::set_watchdog(const RecordTarget &target, std::chrono::milliseconds grace) {
  watch_target_ = target;
  watch_grace_ = grace;
}

std::string GpuExecutor::hung_or(std::string e) {
  if (watchdog_ && watchdog_->fired())
    return watchdog_->message();
  return e;
}

// A collective that timed out is named by the watchdog's line, whatever
// the aborted calls returned (an error, or nothing: the stream drained).
std::string GpuExecutor::run(const pl::Program &program, uint64_t rng_offset) {
  return hung_or(run_program(program, rng_offset));
}

std::string GpuExecutor::run_program(const pl::Program &program, uint64_t rng_offset) {
  if (!pending_error_.empty())
    return std::exchange(pending_error_, "");
  if (std::string e = staged(program, true); !e.empty())
    return e;
  if (std::string e = write_scalars(rng_offset); !e.empty())
    return e;
  Graph &g = graphs_[&program];
  const std::string who = "rank " + std::to_string(rank_.rank()) + ": " + str(program.name());
  // A program that waits for the host mid-way (the expert exchange reads
  // its counts) cannot be captured: it always runs eagerly.
  if (!use_graphs_ || g.runs++ == 0 || host_synchronizing(program)) {
    // Eager: every run without graphs, and the first with them (kernels
    // load, cuBLASLt chooses its algorithms, before anything is captured).
    if (std::string e = run_steps(program); !e.empty())
      return e;
  } else {
    if (!g.handle) {
      if (std::string e = device_->begin_capture(); !e.empty())
        return who + ": capturing a CUDA graph: " + e;
      if (watchdog_)
        watchdog_->begin_capture(); // the graph's collectives are recorded at each launch
      std::string e = run_steps(program);
      uint64_t handle = 0;
      std::string end = device_->end_capture(&handle); // ends the capture whatever happened
      if (watchdog_)
        g.collectives = watchdog_->end_capture();
      if (!e.empty()) {
        if (handle)
          device_->destroy_graph(handle);
        return e;
      }
      if (!end.empty())
        return who + ": capturing a CUDA graph: " + end +
               "; run with --no-cuda-graph to run the steps one by one";
      g.handle = handle;
    }
    auto launch = [&] { return device_->launch_graph(g.handle); };
    if (std::string e = watchdog_ ? watchdog_->launch(g.collectives, launch) : launch(); !e.empty())
      return who + ": " + e;
    ++graph_launches_;
  }
  if (std::string e = device_->synchronize(); !e.empty())
    return who + ": " + e;
  return staged(program, false);
}

} // namespace mt::rt
