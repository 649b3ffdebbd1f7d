// The GPU executor: runs one rank's programs by their instructions' GPU
// steps (plan.fbs GpuStep) on a GpuDevice. It makes no decision of its own:
// kernels, launch geometry, arguments, GEMM descriptors and collectives all
// come from the plan.
//
// Memory. One device allocation holds, in order, the state buffer
// (state_bytes: weights in their dtype, f32 gradients, masters, moments, at
// the plan's offsets), the activation arena (arena_bytes), the kernel
// workspace (kernel_workspace_bytes) and the device scalars
// (gpu_scalar_bytes, plan_reader.h: 256 bytes unless a pipeline schedule
// has more than 29 micro-batches): the loss scale (an f32, read by
// GRAD_SEED's kernel), the seed, the program's RNG offset and one RNG offset
// per micro-batch (u64 each; SEED and RNG_OFFSET arguments point at them).
// That is exactly what `mtc` printed, plus the stated cuBLASLt workspace the
// device allocates itself.
//
// CUDA graphs. Everything a step varies (inputs, the loss scale, the seed,
// the RNG offsets) is in device memory at fixed addresses and every
// argument is an address or a constant of the plan, so a program's steps
// can be captured once and replayed. A program's first run is eager
// (kernels load, cuBLASLt chooses its algorithms), its second is captured
// into a graph and launched, later runs launch the graph. Host copies (the
// scalars, inputs, outputs) stay outside the graph, around the launch.
// set_cuda_graphs(false) keeps every run eager (mtrun --no-cuda-graph).
// A program with an expert exchange (MOE_DISPATCH, MOE_COMBINE) waits for
// the host mid-way: the rows each expert-parallel peer sends are counts
// the host reads from the device (a device-to-host copy and a stream
// wait, as Megatron's alltoall dispatcher synchronises for its split
// sizes), and a capture cannot hold that. Such a program is never
// captured: every run is eager, the others keep their graphs.
//
// Host side. Program inputs and outputs are staged in host buffers
// (value_data), uploaded before run() and downloaded after it; they are
// f32, i32 and i64 values, so host and device bytes are the same.
// Parameter state has host views of floats (executor.h), filled by
// state_to_host() and written back by state_to_device(), converting 16-bit
// weights.
//
// Collectives. Each parallel group of the rank (parallel_groups.h) gets a
// DeviceComm from the device (NCCL on a GPU), bootstrapped over the group's
// host communicator, in the same order on every rank (plan group numbers:
// dp, tp, pp, mp, then the expert groups ep, expt_tp, expt_dp, tp_ep,
// tp_ep_pp; a group whose host communicator is an earlier one's shares its
// connection) when open() runs; set_groups() comes first. ALL_REDUCE steps reduce workspace
// elements; NATIVE steps run the communication of their opcode on device
// memory, in stream order with the kernels:
//   ALL_REDUCE          in -> out, summed over tp (out of place when they differ)
//   SEQ_ALL_GATHER      args[0] -> args[1] (the step's explicit source and
//   SEQ_REDUCE_SCATTER  destination: the values, or the workspace where a
//                       kernel reorders [b, s, ...] blocks; CudaOpKernels.h)
//   ALL_REDUCE_GRADS    each parameter's f32 gradient in place, times the scale
//   REDUCE_GRADS        the bucket's range of the flat gradient buffer in
//                       place (all-reduce), or reduce-scattered in place onto
//                       this rank's shard, times the scale. Over a group of
//                       one rank there is nothing to sum: a scale below 1
//                       (expert buckets at edp = 1 with dp > 1) comes as
//                       KERNEL steps scaling the bucket's gradients
//                       (compiler/cuda/GpuSteps.cpp), which run on the
//                       compute stream; a NATIVE step with such a scale is
//                       refused when it runs
//   ALL_GATHER_PARAMS   the bucket's range of the flat weight buffer, in place
//   SEND, RECV          the value to / from the pipeline peer. A run of
//                       consecutive SEND/RECV instructions is one group
//                       (NCCL's group semantics: its transfers progress
//                       together), so the schedule's paired "send forward,
//                       receive backward" cannot deadlock; point-to-point
//                       messages of a pair match by order (mt-schedule-pp
//                       issues them in the same order on both sides)
//   ALL_REDUCE_TIED_GRAD the gradient sent to the peer stage while the
//                       peer's arrives in the workspace (one group); the
//                       step's kernel then adds it
//   MOE_DISPATCH        over the S = etp x ep ranks of the stage's experts
//                       (ints[0]: ep, or tp_ep when expert_tensor_parallel
//                       ints[3] > 1): every rank's tokens_per_expert
//                       gathered into the workspace and read by the host;
//                       alltoall: each peer's rows by all_to_all_v (NCCL:
//                       grouped ncclSend/ncclRecv; the etp ranks of one ep
//                       rank get the same rows) into the workspace, then
//                       device copies put them local expert major;
//                       allgather: every rank's y gathered, this rank's ep
//                       rank's experts' rows copied out. The rest of `rows`
//                       zeroed; local_counts and layout written from the host
//   MOE_COMBINE         the inverse, each row the sum of its etp ranks' rows:
//                       alltoall stages each peer's rows peer-major, sums
//                       them over expt_tp at etp > 1 (an all-reduce of the
//                       staged rows, which the etp ranks of an ep rank hold
//                       in the same order) and sends them back from the
//                       rank of the source's etp rank; allgather writes the
//                       rows into a zeroed image of every rank's y and
//                       reduce-scatters it (at etp 1 a sum of one value and
//                       zeros: exact)
// Whole expert-parallel training steps (ep, and etp x ep) are checked
// against the CPU executor on emulated GPUs (GpuExecutorParallelTest).
// Hung ranks: when the world communicator keeps collective records (Gloo,
// mtrun) or set_watchdog gave one, each group's DeviceComm is wrapped by a
// DeviceWatchdog (device_watchdog.h): every device collective is recorded
// as it is issued and ended when an event after it has passed; one not
// done within the run's collective timeout gets the peers' records read,
// the hung rank(s) named (host, state, last collective), every
// communicator aborted, and run() returns that line. A captured graph's
// collectives are recorded at each launch.
// Expert buckets (Bucket.group 6) reduce and gather over expt_dp as the
// dense ones over dp; with the distributed optimizer, a bucket's shard is
// its group rank's, its state at Bucket.shard_offset (open() refuses
// expert shards the optimizer kernels do not index: check_shards).
// The data-parallel groups' (dp, expt_dp) ALL_REDUCE_GRADS, REDUCE_GRADS
// and ALL_GATHER_PARAMS go to the device's side stream (begin_side), one
// batch each, where they overlap the kernels after them. The compute stream
// waits, before an instruction whose device bytes (spans_of) meet those of
// a pending one, for that one and the side work issued before it (so a
// layer waits for its own weights' gather, not for the gathers queued
// behind it); before any other collective over a communicator the side
// stream uses, and before an expert exchange (the host reads), it waits
// for all of them, and at the program's end.
#ifndef MT_RUNTIME_GPU_EXECUTOR_H
#define MT_RUNTIME_GPU_EXECUTOR_H

#include "runtime/comm/collective_record.h"
#include "runtime/comm/collectives.h"
#include "runtime/comm/parallel_groups.h"
#include "runtime/exec/executor.h"
#include "runtime/plan/pipeline_expand.h"

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace mt::rt {

// Element types of device collectives.
enum class CommElement : uint8_t { F32, F64, BF16, F16 };

// Collectives between the devices of one parallel group, on device memory,
// ordered with the device's kernels (NCCL on a GPU). Counts are elements;
// every call returns "" or one error line.
class DeviceComm {
public:
  virtual ~DeviceComm() = default;
  virtual int rank() const = 0; // within the group
  virtual int size() const = 0;
  // out = (sum or max over the group of in) * scale; scale is 1, or 1/size()
  // with Sum (an average). in == out: in place.
  virtual std::string all_reduce(uint64_t in, uint64_t out, uint64_t count, CommElement t,
                                 ReduceOp op, double scale) = 0;
  // out holds size() * count elements, rank r's `in` at element r * count;
  // in == out + rank() * count is in place.
  virtual std::string all_gather(uint64_t in, uint64_t out, uint64_t count, CommElement t) = 0;
  // in holds size() * count elements; out = the sum over the group of block
  // rank(), times scale (as all_reduce's); out == in + rank() * count is in place.
  virtual std::string reduce_scatter(uint64_t in, uint64_t out, uint64_t count, CommElement t,
                                     double scale) = 0;
  // out on group rank `root` = the sum over the group of in (count
  // elements); out is written on the root only (other ranks may pass in);
  // in == out is in place.
  virtual std::string reduce(uint64_t in, uint64_t out, uint64_t count, CommElement t,
                             int root) = 0;
  // reduce_scatter with a count per rank (size() entries, zeros allowed):
  // `in` holds the blocks of every rank back to back in rank order, and
  // rank r gets the sum over the group of block r (counts[r] elements) in
  // out; out == the block of rank() in `in` is in place. One group of
  // reduces, one per non-empty block with its rank as the root (NCCL:
  // ncclReduce between ncclGroupStart and ncclGroupEnd, as
  // torch.distributed.reduce_scatter does with blocks of unequal sizes),
  // which this default issues: no rank holds more than `in`.
  virtual std::string reduce_scatter_v(uint64_t in, const std::vector<uint64_t> &counts,
                                       uint64_t out, CommElement t);
  // Point to point with a peer of the group. The calls between group_start()
  // and group_end() progress together; messages between two ranks match in
  // the order they were issued.
  virtual std::string group_start() = 0;
  virtual std::string send(uint64_t buf, uint64_t count, CommElement t, int peer) = 0;
  virtual std::string recv(uint64_t buf, uint64_t count, CommElement t, int peer) = 0;
  virtual std::string group_end() = 0;
  // All-to-all with per-peer counts (elements): send_counts[p] elements
  // from send + send_displs[p] elements to group rank p, recv_counts[p] from
  // p into recv + recv_displs[p]; size() entries each, zero counts allowed,
  // a rank's own block copied. The counts are host values: the caller has
  // them before it calls (NCCL: one group of ncclSend/ncclRecv per peer,
  // which this default issues).
  virtual std::string all_to_all_v(uint64_t send, const std::vector<uint64_t> &send_counts,
                                   const std::vector<uint64_t> &send_displs, uint64_t recv,
                                   const std::vector<uint64_t> &recv_counts,
                                   const std::vector<uint64_t> &recv_displs, CommElement t);
  // Ends the communicator's collectives that have not completed, from any
  // thread (the watchdog's, device_watchdog.h): kernels waiting for a peer
  // that never comes stop (NCCL: ncclCommAbort), calls blocked in it
  // return, and every later call fails. The communicator cannot be used
  // again and what it was moving is lost.
  virtual void abort() = 0;
};

// What the executor needs from a device. Addresses are device addresses as
// integers. Every call returns "" or one error line.
class GpuDevice {
public:
  virtual ~GpuDevice() = default;
  virtual std::string allocate(uint64_t bytes, uint64_t *base) = 0;
  virtual std::string to_device(uint64_t dst, const void *src, uint64_t bytes) = 0;
  virtual std::string to_host(void *dst, uint64_t src, uint64_t bytes) = 0;
  virtual std::string fill(uint64_t dst, uint8_t byte, uint64_t bytes) = 0;
  // A device-to-device copy in stream order (the expert dispatchers'
  // reordering of rows whose counts the host has read).
  virtual std::string copy(uint64_t dst, uint64_t src, uint64_t bytes) = 0;
  // Compiles (or finds in a cache) and loads plan kernel `index`.
  virtual std::string load_kernel(uint32_t index, const mt::plan::Kernel &kernel) = 0;
  // cuLaunchKernel's convention: params[i] points at argument i's value
  // (`count` of them, 8 bytes each).
  virtual std::string launch(uint32_t index, const mt::plan::Kernel &kernel, void **params,
                             uint32_t count) = 0;
  // ptr: A, B, D, then the epilogue's bias and aux (plan.fbs Gemm).
  virtual std::string gemm(const mt::plan::Gemm &g, const uint64_t *ptr) = 0;
  virtual std::string synchronize() = 0;
  // Events for the watchdog over the collectives (device_watchdog.h).
  // record_event marks the point the work issued so far has reached on the
  // stream DeviceComm calls go to now (the side stream between begin_side
  // and end_side), never under capture; *event is not 0. event_done says
  // whether the device has passed it (*error: one line when the device
  // failed instead). event_done and release_event may be called from
  // another thread than the one issuing work.
  virtual std::string record_event(uint64_t *event) = 0;
  virtual bool event_done(uint64_t event, std::string *error) = 0;
  virtual void release_event(uint64_t event) = 0;
  // Device memory the device allocated for itself (cuBLASLt's workspace),
  // beside what allocate() gave the executor, and in how many allocations.
  virtual uint64_t own_bytes() const { return 0; }
  virtual uint64_t own_allocations() const { return 0; }
  // The device side of a host group (collective over its ranks: every
  // member calls it, in the same order as its other groups). Null with
  // *error one line when the device has no collectives.
  virtual std::unique_ptr<DeviceComm> connect(Communicator &group, std::string *error) {
    *error = "this device has no collectives between GPUs";
    (void)group;
    return nullptr;
  }
  // A second stream for collectives that may run beside the kernels (the
  // data-parallel reductions and gathers). begin_side(): the side stream
  // waits for all work issued so far, and DeviceComm calls go to it until
  // end_side(), which closes one batch of side work. join_side(n): later
  // work waits for the oldest n batches not yet joined (all of them when
  // there are fewer), which are then joined; the side stream runs its
  // batches in order, so the younger ones may still be running. Graph
  // captures take the side stream in and must have joined all of it
  // before end_capture. A device without one returns false from
  // has_side_stream() and the executor issues everything in order.
  static constexpr size_t kAllSideWork = SIZE_MAX;
  virtual bool has_side_stream() const { return false; }
  virtual std::string begin_side() { return ""; }
  virtual std::string end_side() { return ""; }
  virtual std::string join_side(size_t batches = kAllSideWork) {
    (void)batches;
    return "";
  }
  // CUDA graphs. Between begin_capture and end_capture, launch and gemm
  // record their work with the argument values they were given, running
  // nothing; end_capture makes the record an executable graph (*graph, not
  // 0). launch_graph runs it again, as recorded, in stream order.
  virtual std::string begin_capture() = 0;
  virtual std::string end_capture(uint64_t *graph) = 0;
  virtual std::string launch_graph(uint64_t graph) = 0;
  virtual void destroy_graph(uint64_t graph) = 0;
};

// One expert exchange (plan.fbs MOE_DISPATCH / MOE_COMBINE) on device
// memory over the group's S = etp x ep ranks: E experts, L = E / ep a rank,
// group rank g of ep rank q = g / etp holding (a shard of) [q L, q L + L);
// y [N, H] a rank's permuted rows (expert-major over all E experts), rows
// [R, H] the received ones (local expert major, then source rank, then the
// source's order), layout [S, L] i32 the rows from each source for each
// local expert, local_counts [L] i32 their sums.
// Workspaces: counts_workspace holds [S, E] i32 (every rank's
// tokens_per_expert, gathered), rows_workspace R rows (alltoall: the rows
// staged source-major) or S * N rows (allgather: every rank's y).
// The counts reach the host (a device-to-host copy, which waits for the
// stream), as Megatron's alltoall dispatcher synchronises for its split
// sizes; the rows then move by DeviceComm (all_to_all_v, or all_gather /
// reduce_scatter for the allgather dispatcher; at etp > 1 the alltoall
// combine's reduce_scatter_v over expt_tp, in place in rows_workspace) and
// by device copies, and the
// dispatch writes local_counts and layout from the host. Rows past the
// received (dispatch) or sent (combine) ones are zeroed. Not capturable.
struct MoeExchange {
  bool dispatch = true;   // MOE_DISPATCH; false: MOE_COMBINE
  bool allgather = false; // the allgather dispatcher; false: alltoall
  uint64_t y = 0, rows = 0, tokens_per_expert = 0, local_counts = 0, layout = 0;
  uint64_t counts_workspace = 0, rows_workspace = 0;
  int64_t n = 0, r = 0, experts = 0, local_experts = 1;
  int64_t etp = 1; // expert_tensor_parallel
  uint64_t hidden = 0;
  CommElement element = CommElement::F32;
  size_t element_bytes = 4;
};
// `group` (the S ranks; null: a group of one rank); `expt_tp` the etp ranks
// of this rank's ep rank (needed by the alltoall combine at etp > 1).
std::string run_moe_exchange(GpuDevice &device, DeviceComm *group, const MoeExchange &x,
                             DeviceComm *expt_tp = nullptr);

class DeviceWatchdog;
struct CapturedCollective;

class GpuExecutor : public Executor {
public:
  // The plan must have been verified by PlanFile and outlive the executor.
  GpuExecutor(const mt::plan::Plan &plan, int rank, std::unique_ptr<GpuDevice> device);
  ~GpuExecutor() override;

  // Checks that every instruction has a GPU form, allocates device memory,
  // loads every kernel and connects the device collectives of the groups
  // set_groups() gave (plans of several ranks). "" or one error line naming
  // what is missing.
  std::string open();

  std::string init_params(uint64_t seed) override;
  std::string reset_optimizer_state() override;
  float *weight(int param) override;
  float *master(int param) override;
  float *exp_avg(int param) override;
  float *exp_avg_sq(int param) override;
  float *grad(int param); // host view, current after state_to_host()
  int64_t param_elements(int param) const override;
  float *shard_master() override;
  float *shard_exp_avg() override;
  float *shard_exp_avg_sq() override;
  int64_t shard_elements() const override;
  std::string state_to_host() override;
  std::string state_to_device() override;

  std::string load_error() const override { return load_error_; }
  void *value_data(const mt::plan::Program &program, uint32_t value) override;
  const mt::plan::Program *program(const std::string &name) const override;
  const mt::plan::Program *program_for_micro_batches(const std::string &name,
                                                     int64_t micro_batches,
                                                     std::string *error) override;
  std::string run(const mt::plan::Program &program, uint64_t rng_offset) override;

  void set_seed(uint64_t seed) override { seed_ = seed; }
  void set_micro_batch_rng_offsets(std::vector<uint64_t> offsets) override {
    micro_offsets_ = std::move(offsets);
  }
  void set_loss_scale(float scale) override;
  void zero_grads() override;
  void set_check_memory_plan(bool) override {}
  void set_groups(const ParallelGroups *groups) override { groups_ = groups; }
  // The record and timeout the watchdog over the device collectives uses
  // (device_watchdog.h). open() takes them from the world communicator
  // when it keeps records (Gloo: mtrun); tests of ranks as threads give
  // their own before open(). `grace`: see DeviceWatchdog.
  void set_watchdog(const RecordTarget &target,
                    std::chrono::milliseconds grace = std::chrono::milliseconds(0));

  // The training log's figures (executor.h): the counted elements are
  // copied to the host and summed there; memory: the one allocation of the
  // plan's bytes, plus what the device allocated for itself (cuBLASLt's
  // workspace) in `reserved`.
  std::string params_sum_squares(double *out) override;
  std::string grad_stats(float unscale, float clip, GradStats *out) override;
  MemoryStats memory_stats() const override;

  // Whether steady-state runs replay a captured CUDA graph (default on).
  void set_cuda_graphs(bool on);
  // Runs that launched a captured graph (tests).
  int64_t graph_launches() const { return graph_launches_; }

  // Device addresses (tests).
  uint64_t state_base() const { return base_; }
  uint64_t arena_base() const { return base_ + rank_.state_bytes(); }

private:
  struct HostState; // host views of every parameter
  std::string step(const mt::plan::Program &program, const mt::plan::Instruction &ins,
                   const mt::plan::GpuStep &s);
  uint64_t address(const mt::plan::Program &program, const mt::plan::GpuArg &a) const;
  std::string staged(const mt::plan::Program &program, bool upload);
  DeviceComm *comm(int64_t group, std::string *error) const;
  std::string native(const mt::plan::Program &program, const mt::plan::Instruction &ins,
                     const mt::plan::GpuStep &s);
  std::string point_to_point(const mt::plan::Program &program, const mt::plan::Instruction &ins,
                             DeviceComm &pp);
  std::string write_scalars(uint64_t rng_offset);
  std::string download_floats(uint64_t at, mt::plan::DType t, int64_t n, std::vector<float> *out);
  std::string run_steps(const mt::plan::Program &program);
  std::string run_program(const mt::plan::Program &program, uint64_t rng_offset);
  // Device bytes [first, second).
  using Span = std::pair<uint64_t, uint64_t>;
  void spans_of(const mt::plan::Program &program, const mt::plan::Instruction &ins,
                std::vector<Span> *out) const;
  bool on_side(const mt::plan::Instruction &ins) const;
  bool uses_side_comm(const mt::plan::Instruction &ins) const;
  uint64_t rng_offset_at(int32_t micro_batch) const;
  void drop_graphs();

  const mt::plan::Plan &plan_;
  const mt::plan::Rank &rank_;
  RankPrograms programs_; // the programs that run (a pipelined step expanded)
  std::string load_error_;
  void allocate_host_state(); // may throw std::bad_alloc
  std::unique_ptr<GpuDevice> device_;
  const ParallelGroups *groups_ = nullptr;
  uint64_t base_ = 0, workspace_ = 0, loss_scale_at_ = 0, seed_at_ = 0;
  uint64_t allocated_ = 0; // bytes of that one allocation
  // The flat buffers of data-parallel plans: element e's gradient at
  // grad_base_ + grad_bytes_ e, its weight at weight_base_ + weight_bytes_ e.
  // The gradients are f32, or bf16 with --grad-reduce-in-bf16 (reduced as
  // bf16 over NCCL).
  uint64_t grad_base_ = 0, weight_base_ = 0, weight_bytes_ = 4, grad_bytes_ = 4;
  CommElement weight_element_ = CommElement::F32, grad_element_ = CommElement::F32;
  // The device side of each group, by plan group number (0 dp .. 8
  // tp_ep_pp; null: one rank). Groups whose host communicator is another's
  // (ParallelGroups::get aliases them) share its DeviceComm.
  std::vector<std::unique_ptr<DeviceComm>> owned_comms_;
  DeviceComm *comms_[kNumGroups] = {};
  // The communicators the side stream's collectives use (dp, expt_dp).
  std::vector<const DeviceComm *> side_comms_;
  // Expert parallelism (MOE_DISPATCH, MOE_COMBINE): the rows each peer
  // sends and receives are counts the host reads from the device.
  std::string moe_exchange(const mt::plan::Program &program, const mt::plan::Instruction &ins,
                           const mt::plan::GpuStep &s);
  // "" or why the distributed optimizer's kernels cannot run the plan's
  // expert buckets.
  std::string check_shards() const;
  // Programs whose steps wait for the host (no CUDA graph for them).
  bool host_synchronizing(const mt::plan::Program &program) const;
  uint64_t seed_ = 0;
  std::vector<uint64_t> micro_offsets_;
  uint64_t micro_slots_ = 0; // RNG offset slots after the program's
  // Per program: runs so far and its captured graph (0: none yet).
  struct Graph {
    int64_t runs = 0;
    uint64_t handle = 0;
    std::vector<CapturedCollective> collectives; // issued again at each launch
  };
  std::map<const mt::plan::Program *, Graph> graphs_;
  // The ramp-up's expansion of the pipelined step for a smaller batch, or
  // null; forget_program drops what the executor keeps per program.
  const mt::plan::Program *resized_ = nullptr;
  int64_t resized_micro_batches_ = 0;
  std::string resized_name_;
  void forget_program(const mt::plan::Program *program);
  bool use_graphs_ = true;
  // The side stream (GpuDevice::begin_side): used when the device has one
  // and the plan has data-parallel collectives.
  bool side_stream_ = false;
  int64_t graph_launches_ = 0;
  std::unique_ptr<HostState> host_;
  std::string pending_error_; // from calls that cannot return one (zero_grads)
  // The watchdog over the device collectives (null: one rank, or no
  // record to write). Declared after the communicators: it goes first.
  RecordTarget watch_target_;
  std::chrono::milliseconds watch_grace_{0};
  std::unique_ptr<DeviceWatchdog> watchdog_;
  // e, or the watchdog's line when a collective timed out (the aborted
  // calls' own errors say nothing of the hung rank).
  std::string hung_or(std::string e);
};

} // namespace mt::rt

#endif // MT_RUNTIME_GPU_EXECUTOR_H
