// The GPU executor (gpu_executor.h): plan GPU steps on a GpuDevice.
#include "runtime/gpu_executor.h"

#include "runtime/cpu_executor.h"
#include "runtime/cpu_kernels.h"
#include "runtime/plan_reader.h"

#include <cmath>
#include <cstring>
#include <map>
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

} // namespace

struct GpuExecutor::HostState {
  struct Param {
    std::vector<float> weight, grad, master, exp_avg, exp_avg_sq;
  };
  std::vector<Param> params;
  std::vector<uint8_t> image; // the state buffer's bytes, as on the device
  // Program inputs and outputs: host bytes, laid out as on the device.
  std::map<std::pair<const pl::Program *, uint32_t>, std::vector<uint8_t>> staging;
};

namespace {
// The f32 buffers a parameter holds (gradient, master copy, moments) with
// their state-buffer offsets, as laid out alike on host and device.
template <class H, class F> void for_each_f32(H &h, const pl::Param &p, F f) {
  for (auto [v, off] : {std::pair{&h.grad, p.grad_offset()}, {&h.master, p.master_offset()},
                        {&h.exp_avg, p.exp_avg_offset()}, {&h.exp_avg_sq, p.exp_avg_sq_offset()}})
    if (!v->empty())
      f(*v, off);
}
} // namespace

GpuExecutor::GpuExecutor(const pl::Plan &plan, int rank, std::unique_ptr<GpuDevice> device)
    : plan_(plan), rank_(*find_rank(plan, rank)), device_(std::move(device)),
      host_(std::make_unique<HostState>()) {
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
}

GpuExecutor::~GpuExecutor() { drop_graphs(); }

std::string GpuExecutor::open() {
  const std::string who = "rank " + std::to_string(rank_.rank());
  if (rank_.distributed_optimizer())
    return who + ": the distributed optimizer has no GPU form yet; run this plan with --device cpu";
  std::set<uint32_t> kernels;
  for (const pl::Program *prog : *rank_.programs()) {
    const auto *insts = prog->instructions();
    for (uint32_t i = 0; insts && i < insts->size(); ++i) {
      const pl::Instruction &ins = *insts->Get(i);
      const std::string at = who + ", program " + str(prog->name()) + " #" + std::to_string(i) +
                             " (" + str(ins.where()) + ") " + opcode_name(ins.op());
      if (!ins.gpu() || ins.gpu()->size() == 0)
        return at + ": this plan has no GPU form for it; recompile the spec with an mtc that "
                    "generates one, or run with --device cpu";
      for (const pl::GpuStep *s : *ins.gpu()) {
        if (s->kind() == pl::GpuStepKind::NATIVE && plan_.world_size() > 1)
          return at + ": collectives between GPUs (NCCL) are not built yet; run plans of "
                      "several ranks with --device cpu";
        if (s->kind() == pl::GpuStepKind::KERNEL)
          kernels.insert(uint32_t(s->kernel()));
      }
    }
  }
  const uint64_t state = align_up(rank_.state_bytes()), arena = align_up(rank_.arena_bytes());
  const uint64_t work = align_up(rank_.kernel_workspace_bytes());
  if (std::string e = device_->allocate(state + arena + work + gpu_scalar_bytes(rank_), &base_);
      !e.empty())
    return who + ": " + e;
  workspace_ = base_ + state + arena;
  loss_scale_at_ = workspace_ + work;
  seed_at_ = loss_scale_at_ + kGpuScalarSlotBytes;
  micro_slots_ = gpu_micro_batch_slots(rank_);
  for (uint32_t k : kernels)
    if (std::string e = device_->load_kernel(k, *plan_.kernels()->Get(k)); !e.empty())
      return who + ": " + e;
  set_loss_scale(1.0f);
  host_->image.assign(size_t(rank_.state_bytes()), 0);
  return pending_error_;
}

std::string GpuExecutor::init_params(uint64_t seed) {
  const int64_t tp = plan_.tensor_parallel();
  for (uint32_t i = 0; i < host_->params.size(); ++i) {
    const pl::Param &p = *rank_.params()->Get(i);
    HostState::Param &h = host_->params[i];
    if (!h.weight.empty()) {
      initial_weights(p, tp, rank_.tp_rank(), seed, h.weight.data());
      if (!h.master.empty())
        h.master = h.weight;
    }
    for (std::vector<float> *b : {&h.grad, &h.exp_avg, &h.exp_avg_sq})
      std::fill(b->begin(), b->end(), 0.0f);
  }
  return state_to_device();
}

namespace {
float *view(std::vector<float> &v) { return v.empty() ? nullptr : v.data(); }
} // namespace

float *GpuExecutor::weight(int p) { return view(host_->params[size_t(p)].weight); }
float *GpuExecutor::grad(int p) { return view(host_->params[size_t(p)].grad); }
float *GpuExecutor::master(int p) { return view(host_->params[size_t(p)].master); }
float *GpuExecutor::exp_avg(int p) { return view(host_->params[size_t(p)].exp_avg); }
float *GpuExecutor::exp_avg_sq(int p) { return view(host_->params[size_t(p)].exp_avg_sq); }
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
    for_each_f32(h, p, [&](std::vector<float> &v, int64_t off) {
      std::memcpy(v.data(), image.data() + off, v.size() * 4);
    });
  }
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
    for_each_f32(h, p, [&](std::vector<float> &v, int64_t off) {
      std::memcpy(image.data() + off, v.data(), v.size() * 4);
    });
  }
  return device_->to_device(base_, image.data(), image.size());
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
  for (const pl::Program *p : *rank_.programs())
    if (str(p->name()) == name)
      return p;
  return nullptr;
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
                                        uint64_t(element_count(p->shape())) * 4);
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
    uint64_t ptr[5] = {0, 0, 0, 0, 0};
    for (uint32_t i = 0; i < s.args()->size() && i < 5; ++i)
      ptr[i] = address(program, *s.args()->Get(i));
    return device_->gemm(*s.gemm(), ptr);
  }
  case pl::GpuStepKind::ALL_REDUCE: {
    const Communicator *c = groups_ ? groups_->get(Group(s.group())) : nullptr;
    if (!c || c->size() == 1)
      return ""; // a group of one rank
    return "all-reduce between GPUs (NCCL) is not built yet";
  }
  case pl::GpuStepKind::NATIVE:
    return "collectives between GPUs (NCCL) are not built yet";
  }
  return "unknown GPU step";
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
  for (uint32_t i = 0; insts && i < insts->size(); ++i) {
    const pl::Instruction &ins = *insts->Get(i);
    for (const pl::GpuStep *s : *ins.gpu())
      if (std::string e = step(program, ins, *s); !e.empty())
        return "rank " + std::to_string(rank_.rank()) + ": " + str(program.name()) + " #" +
               std::to_string(i) + " (" + str(ins.where()) + ") " + opcode_name(ins.op()) +
               ": " + e;
  }
  return "";
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

std::string GpuExecutor::run(const pl::Program &program, uint64_t rng_offset) {
  if (!pending_error_.empty())
    return std::exchange(pending_error_, "");
  if (std::string e = staged(program, true); !e.empty())
    return e;
  if (std::string e = write_scalars(rng_offset); !e.empty())
    return e;
  Graph &g = graphs_[&program];
  const std::string who = "rank " + std::to_string(rank_.rank()) + ": " + str(program.name());
  if (!use_graphs_ || g.runs++ == 0) {
    // Eager: every run without graphs, and the first with them (kernels
    // load, cuBLASLt chooses its algorithms, before anything is captured).
    if (std::string e = run_steps(program); !e.empty())
      return e;
  } else {
    if (!g.handle) {
      if (std::string e = device_->begin_capture(); !e.empty())
        return who + ": capturing a CUDA graph: " + e;
      std::string e = run_steps(program);
      uint64_t handle = 0;
      std::string end = device_->end_capture(&handle); // ends the capture whatever happened
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
    if (std::string e = device_->launch_graph(g.handle); !e.empty())
      return who + ": " + e;
    ++graph_launches_;
  }
  if (std::string e = device_->synchronize(); !e.empty())
    return who + ": " + e;
  return staged(program, false);
}

} // namespace mt::rt
