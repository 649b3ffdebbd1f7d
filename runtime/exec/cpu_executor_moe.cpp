// The CPU executor's expert parallelism (plan.fbs MOE_DISPATCH, MOE_COMBINE)
// and the router's token counts summed over tensor-parallel ranks
// (MOE_ROUTER's count_group), over the rank's Communicators.
//
// The exchange runs over the S = etp x ep ranks of the stage's experts (the
// plan's group: 4 ep at etp 1, 7 tp_ep), group rank g having etp rank
// g % etp and ep rank q = g / etp; L local experts, E = ep L. The rank's
// permuted rows y are expert-major over all E experts, so the rows of ep
// rank p's experts [p L, p L + L) are one contiguous block of y.
// Dispatch: every source s in [0, S) sends rank g its rows of g's ep
// rank's experts, so the etp ranks of one ep rank receive the same rows
// (each holds a shard of the same experts).
// Both dispatchers first gather every rank's per-expert counts (all_gather:
// this rank's layout[s][j] is what s sends for local expert j), and every
// rank checks every rank's receive rows against the plan's (a bound below
// the worst case, moe_dispatch_buffer_factor, can be exceeded: all ranks
// then stop with the same error before any row moves). Then
//   alltoall (Megatron's MoEAlltoAllTokenDispatcher: an all-to-all over ep,
//     then an all-gather over expt_tp, here one all_to_all_v over the S
//     ranks): the rows (all_to_all_v, each peer's block), received
//     source-major and regrouped expert-major (Megatron's
//     sort_chunks_by_idxs).
//   allgather (MoEAllGatherTokenDispatcher, which gathers over tp_ep too):
//     every rank's rows are gathered (all_gather_v) and each rank keeps the
//     rows of its ep rank's experts, in the same order.
// Combine is the inverse, each row returned to its source as the sum of
// the etp ranks' rows for it (their partial products of the row-parallel
// second expert layer):
//   alltoall: at etp > 1 the etp ranks of an ep rank, whose rows lie in
//     the same order, sum them first, each only the rows it returns
//     (reduce_scatter_v over expt_tp, group 5, of the rows packed by their
//     source's etp rank, as Megatron reduce-scatters over tp); then each
//     row goes back to its source from the one rank of its source's etp
//     rank (all_to_all_v over the S ranks);
//   allgather: the rows go into every source's y-shaped block, zero
//     elsewhere, and the blocks are reduce-scattered (reduce_scatter_v),
//     each row arriving as the sum of its etp ranks' rows plus zeros.
#include "runtime/exec/cpu_executor_impl.h"

#include "runtime/exec/cpu_kernels_moe.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

namespace mt::rt {

using namespace cpu_exec_detail; // the CPU executor's own pieces (cpu_executor_impl.h)

namespace {

// Exchanged counts travel as floats through all_gather: exact below 2^24.
constexpr int64_t kMaxExactCount = int64_t(1) << 24;

// Where each expert's segment starts in a rank's y: prefix sums of its
// tokens_per_expert, after checking them against its N rows.
std::string segment_starts(const int32_t *tpe, int64_t experts, int64_t rows,
                           std::vector<int64_t> &start) {
  start.assign(size_t(experts + 1), 0);
  for (int64_t e = 0; e < experts; ++e) {
    if (tpe[e] < 0)
      return "tokens_per_expert[" + std::to_string(e) + "] is " + std::to_string(tpe[e]);
    start[size_t(e + 1)] = start[size_t(e)] + tpe[e];
  }
  if (start[size_t(experts)] > rows)
    return "tokens_per_expert sums to " + std::to_string(start[size_t(experts)]) +
           " rows, more than the " + std::to_string(rows) + " permuted rows";
  return "";
}

} // namespace

// The group of a dispatch or combine: its ints[0] (4 ep, 7 tp_ep), of
// exactly the plan's expert_tensor_parallel x expert_model_parallel ranks.
static Communicator *exchange_group(const CpuExecutor::Impl &impl, const pl::Instruction &ins,
                                    std::string *error) {
  Communicator *c = impl.group(ins.ints()->Get(0), error);
  if (!error->empty())
    return nullptr;
  const int64_t sources = int64_t(std::max(1, impl.plan.expert_model_parallel())) *
                          std::max(1, impl.plan.expert_tensor_parallel());
  if (!c || c->size() != sources) {
    *error = "exchanges tokens over " + std::to_string(sources) + " expert ranks (expert tensor "
             "x expert model parallel), but its group has " + std::to_string(c ? c->size() : 1) +
             "; run the plan with all its ranks";
    return nullptr;
  }
  return c;
}

// Every rank's tokens_per_expert [S, E] (MOE_DISPATCH; MOE_COMBINE's
// allgather dispatcher).
std::string CpuExecutor::Impl::gather_expert_counts(Communicator *c, const int32_t *tpe,
                                                    int64_t experts, int64_t rows,
                                                    std::vector<int32_t> &all) {
  if (rows >= kMaxExactCount)
    return "the allgather dispatcher's " + std::to_string(rows) +
           " rows exceed the counts it exchanges exactly (2^24)";
  std::vector<float> mine(static_cast<size_t>(experts)), all_f(size_t(experts * c->size()));
  for (int64_t e = 0; e < experts; ++e)
    mine[size_t(e)] = float(tpe[e]);
  if (std::string err = c->all_gather(mine.data(), size_t(experts), all_f.data()); !err.empty())
    return err;
  all.resize(all_f.size());
  for (size_t i = 0; i < all_f.size(); ++i)
    all[i] = int32_t(all_f[i]);
  return "";
}

// MOE_DISPATCH: in y[N, H], tokens_per_expert[E] ; out rows[R, H],
// local_counts[L], layout[S, L].
std::string CpuExecutor::Impl::moe_dispatch(const pl::Instruction &ins, const Frame &f) {
  std::string err;
  Communicator *c = exchange_group(*this, ins, &err);
  if (!c)
    return err;
  const pl::Value &yv = f.value(ins.in()->Get(0)), &rv = f.value(ins.out()->Get(0));
  const float *y = reinterpret_cast<const float *>(f.ptr[ins.in()->Get(0)]);
  const int32_t *tpe = reinterpret_cast<const int32_t *>(f.ptr[ins.in()->Get(1)]);
  float *rows = reinterpret_cast<float *>(f.ptr[ins.out()->Get(0)]);
  int32_t *local_counts = reinterpret_cast<int32_t *>(f.ptr[ins.out()->Get(1)]);
  int32_t *layout = reinterpret_cast<int32_t *>(f.ptr[ins.out()->Get(2)]);
  // S sources, this rank's ep rank q (whose experts it holds a shard of).
  const int64_t sources = c->size(), etp = ins.ints()->Get(3), q = c->rank() / etp;
  const int64_t l = ins.ints()->Get(1), e = sources / etp * l;
  const int64_t n = yv.shape()->Get(0), h = yv.shape()->Get(1), r = rv.shape()->Get(0);
  std::vector<int64_t> start;
  if (std::string e2 = segment_starts(tpe, e, n, start); !e2.empty())
    return e2;
  const bool allgather = ins.ints()->Get(2) == 1;
  const size_t ns = size_t(sources);

  // Every rank's tokens_per_expert [S, E], gathered before any row moves
  // (Megatron's dispatchers gather them over the group too): layout[s][j],
  // the rows source s sends for local expert j, and every rank's receive
  // rows, checked on every rank against the plan's R so that all stop
  // together when a step's routing needs more.
  std::vector<int32_t> all_counts;
  if (std::string e2 = gather_expert_counts(c, tpe, e, n, all_counts); !e2.empty())
    return e2;
  if (std::string e2 = cpu::moe_receive_overflow(all_counts.data(), sources, e, l, r);
      !e2.empty())
    return e2;
  for (int64_t s = 0; s < sources; ++s)
    for (int64_t j = 0; j < l; ++j)
      layout[s * l + j] = all_counts[size_t(s * e + q * l + j)];
  std::vector<int64_t> from(ns, 0); // rows from each source
  int64_t total = 0;
  for (int64_t s = 0; s < sources; ++s) {
    for (int64_t j = 0; j < l; ++j) {
      if (layout[s * l + j] < 0)
        return "expert rank " + std::to_string(s) + " of the exchange sends " +
               std::to_string(layout[s * l + j]) + " rows";
      from[size_t(s)] += layout[s * l + j];
    }
    total += from[size_t(s)];
  }

  // The rows arrive source-major in `exchange`.
  exchange.assign(size_t(total * h), 0.0f);
  std::vector<size_t> recv_counts(ns), recv_displs(ns);
  for (int64_t s = 0, at = 0; s < sources; at += from[size_t(s)], ++s) {
    recv_counts[size_t(s)] = size_t(from[size_t(s)] * h);
    recv_displs[size_t(s)] = size_t(at * h);
  }
  if (allgather) {
    // Every rank's used rows, then this rank's experts' segments of each.
    std::vector<size_t> sizes(ns);
    int64_t all_rows = 0;
    for (int64_t s = 0; s < sources; ++s) {
      int64_t used = 0;
      for (int64_t x = 0; x < e; ++x)
        used += all_counts[size_t(s * e + x)];
      sizes[size_t(s)] = size_t(used * h);
      all_rows += used;
    }
    gathered.assign(size_t(all_rows * h), 0.0f);
    if (std::string e2 = c->all_gather_v(y, sizes, gathered.data()); !e2.empty())
      return e2;
    int64_t base = 0;
    for (int64_t s = 0; s < sources; ++s) {
      int64_t first = 0; // row of expert q L in source s's y
      for (int64_t x = 0; x < q * l; ++x)
        first += all_counts[size_t(s * e + x)];
      std::copy(gathered.begin() + (base + first) * h,
                gathered.begin() + (base + first + from[size_t(s)]) * h,
                exchange.begin() + int64_t(recv_displs[size_t(s)]));
      base += int64_t(sizes[size_t(s)]) / h;
    }
  } else {
    // Group rank p gets the block of its ep rank's experts (the etp ranks
    // of one ep rank the same block).
    std::vector<size_t> send_counts(ns), send_displs(ns);
    for (int64_t p = 0; p < sources; ++p) {
      const int64_t b = p / etp * l;
      send_counts[size_t(p)] = size_t((start[size_t(b + l)] - start[size_t(b)]) * h);
      send_displs[size_t(p)] = size_t(start[size_t(b)] * h);
    }
    if (std::string e2 = c->all_to_all_v(y, send_counts, send_displs, exchange.data(),
                                         recv_counts, recv_displs);
        !e2.empty())
      return e2;
  }
  // Local expert j major, then source s: s's rows of expert j follow its
  // rows of experts before j.
  int64_t out = 0;
  for (int64_t j = 0; j < l; ++j) {
    int32_t sum = 0;
    for (int64_t s = 0; s < sources; ++s) {
      int64_t off = int64_t(recv_displs[size_t(s)]) / h;
      for (int64_t jj = 0; jj < j; ++jj)
        off += layout[s * l + jj];
      const int64_t k = layout[s * l + j];
      std::copy(exchange.begin() + off * h, exchange.begin() + (off + k) * h, rows + out * h);
      out += k;
      sum += int32_t(k);
    }
    local_counts[j] = sum;
  }
  std::fill(rows + out * h, rows + r * h, 0.0f);
  return "";
}

// MOE_COMBINE: in rows[R, H], layout[S, L], tokens_per_expert[E] ; out y[N, H].
std::string CpuExecutor::Impl::moe_combine(const pl::Instruction &ins, const Frame &f) {
  std::string err;
  Communicator *c = exchange_group(*this, ins, &err);
  if (!c)
    return err;
  const pl::Value &rv = f.value(ins.in()->Get(0)), &yv = f.value(ins.out()->Get(0));
  const float *rows = reinterpret_cast<const float *>(f.ptr[ins.in()->Get(0)]);
  const int32_t *layout = reinterpret_cast<const int32_t *>(f.ptr[ins.in()->Get(1)]);
  const int32_t *tpe = reinterpret_cast<const int32_t *>(f.ptr[ins.in()->Get(2)]);
  float *y = reinterpret_cast<float *>(f.ptr[ins.out()->Get(0)]);
  const int64_t sources = c->size(), etp = ins.ints()->Get(3);
  const int64_t g = c->rank(), q = g / etp, l = ins.ints()->Get(1), e = sources / etp * l;
  const int64_t n = yv.shape()->Get(0), h = yv.shape()->Get(1), r = rv.shape()->Get(0);
  const size_t ns = size_t(sources);
  std::vector<int64_t> start;
  if (std::string e2 = segment_starts(tpe, e, n, start); !e2.empty())
    return e2;
  int64_t total = 0;
  std::vector<int64_t> to(ns, 0); // rows back to each source
  for (int64_t s = 0; s < sources; ++s) {
    for (int64_t j = 0; j < l; ++j) {
      if (layout[s * l + j] < 0)
        return "layout[" + std::to_string(s) + "][" + std::to_string(j) + "] is " +
               std::to_string(layout[s * l + j]);
      to[size_t(s)] += layout[s * l + j];
    }
    total += to[size_t(s)];
  }
  if (total > r)
    return "its layout holds " + std::to_string(total) + " rows, more than the " +
           std::to_string(r) + " rows of its input";
  // Source-major again: for s, its rows of each local expert j, which sit in
  // `rows` at expert j's segment after the sources before s. The alltoall
  // combine at etp > 1 takes the sources by their etp rank first (those of
  // etp rank 0, then 1, ...), so that each etp rank's are one block.
  const bool by_etp = ins.ints()->Get(2) != 1 && etp > 1;
  std::vector<int64_t> order; // the sources in packing order
  for (int64_t k = 0; k < (by_etp ? etp : 1); ++k)
    for (int64_t s = by_etp ? k : 0; s < sources; s += by_etp ? etp : 1)
      order.push_back(s);
  packed.assign(size_t(total * h), 0.0f);
  std::vector<size_t> send_counts(ns), send_displs(ns);
  {
    std::vector<int64_t> expert_start(static_cast<size_t>(l + 1), 0);
    for (int64_t j = 0; j < l; ++j) {
      int64_t k = 0;
      for (int64_t s = 0; s < sources; ++s)
        k += layout[s * l + j];
      expert_start[size_t(j + 1)] = expert_start[size_t(j)] + k;
    }
    int64_t at = 0;
    for (int64_t s : order) {
      send_displs[size_t(s)] = size_t(at * h);
      send_counts[size_t(s)] = size_t(to[size_t(s)] * h);
      for (int64_t j = 0; j < l; ++j) {
        int64_t off = expert_start[size_t(j)];
        for (int64_t ss = 0; ss < s; ++ss)
          off += layout[ss * l + j];
        const int64_t k = layout[s * l + j];
        std::copy(rows + off * h, rows + (off + k) * h, packed.begin() + at * h);
        at += k;
      }
    }
  }
  const int64_t used = start[size_t(e)];
  if (ins.ints()->Get(2) == 1) {
    // allgather: each source's y-shaped block holds this rank's experts'
    // rows at their places, zero elsewhere; reduce_scatter_v sums them
    // (the etp ranks' rows for the same places add up).
    std::vector<int32_t> all_counts;
    if (std::string e2 = gather_expert_counts(c, tpe, e, n, all_counts); !e2.empty())
      return e2;
    std::vector<size_t> sizes(ns);
    std::vector<int64_t> base(ns + 1, 0);
    for (int64_t s = 0; s < sources; ++s) {
      int64_t rows_s = 0;
      for (int64_t x = 0; x < e; ++x)
        rows_s += all_counts[size_t(s * e + x)];
      sizes[size_t(s)] = size_t(rows_s * h);
      base[size_t(s + 1)] = base[size_t(s)] + rows_s;
    }
    gathered.assign(size_t(base[ns] * h), 0.0f);
    for (int64_t s = 0; s < sources; ++s) {
      int64_t first = 0; // row of expert q L in source s's y
      for (int64_t x = 0; x < q * l; ++x)
        first += all_counts[size_t(s * e + x)];
      std::copy(packed.begin() + int64_t(send_displs[size_t(s)]),
                packed.begin() + int64_t(send_displs[size_t(s)] + send_counts[size_t(s)]),
                gathered.begin() + (base[size_t(s)] + first) * h);
    }
    if (std::string e2 = c->reduce_scatter_v(gathered.data(), sizes, y); !e2.empty())
      return e2;
  } else {
    const float *from = packed.data();
    if (etp > 1) {
      // The etp ranks of ep rank q hold the same rows in the same order
      // (their dispatch received the same), packed by their source's etp
      // rank: a reduce-scatter over expt_tp (Megatron's over its expert
      // tp group, with input_split_sizes) leaves etp rank k the sums of
      // the rows of its own sources only, which it then returns to them.
      Communicator *tp = group(int64_t(Group::EXPT_TP), &err);
      if (!err.empty())
        return err;
      if (!tp || tp->size() != etp || tp->rank() != g % etp)
        return "sums its rows over " + std::to_string(etp) + " expert tensor-parallel ranks, "
               "but the expt_tp group has " + std::to_string(tp ? tp->size() : 1) +
               (tp ? " with this rank at " + std::to_string(tp->rank()) : std::string()) +
               "; run the plan with all its ranks";
      std::vector<size_t> blocks(size_t(etp), 0);
      for (int64_t s = 0; s < sources; ++s)
        blocks[size_t(s % etp)] += send_counts[size_t(s)];
      size_t before = 0; // the packed elements of the etp ranks before this one
      for (int64_t k = 0; k < g % etp; ++k)
        before += blocks[size_t(k)];
      summed.assign(blocks[size_t(g % etp)], 0.0f);
      if (std::string e2 = tp->reduce_scatter_v(packed.data(), blocks, summed.data());
          !e2.empty())
        return e2;
      from = summed.data();
      for (int64_t s = 0; s < sources; ++s) {
        if (s % etp != g % etp)
          send_counts[size_t(s)] = 0;
        else
          send_displs[size_t(s)] -= before;
      }
    }
    // From group rank p (of this rank's etp rank): this rank's rows of p's
    // ep rank's experts.
    std::vector<size_t> recv_counts(ns, 0), recv_displs(ns, 0);
    for (int64_t p = 0; p < sources; ++p) {
      const int64_t b = p / etp * l;
      recv_displs[size_t(p)] = size_t(start[size_t(b)] * h);
      if (p % etp == g % etp)
        recv_counts[size_t(p)] = size_t((start[size_t(b + l)] - start[size_t(b)]) * h);
    }
    if (std::string e2 = c->all_to_all_v(from, send_counts, send_displs, y, recv_counts,
                                         recv_displs);
        !e2.empty())
      return e2;
  }
  std::fill(y + used * h, y + n * h, 0.0f);
  return "";
}

// MOE_ROUTER / MOE_ROUTER_GRAD with count_group 1: this rank's aux-loss
// token counts summed over the tensor-parallel group into *global, and the
// config pointed at them.
template <class T>
std::string CpuExecutor::Impl::router_group_counts(const pl::Instruction &ins, const T *logits,
                                                   cpu::MoeRouterConfig &c,
                                                   std::vector<double> &global) {
  if (ins.ints()->Get(9) != 1)
    return "";
  std::string err;
  Communicator *tp = group(int64_t(Group::TP), &err);
  if (!err.empty())
    return err;
  global = cpu::moe_router_aux_counts(logits, c);
  if (global.empty())
    return ""; // no aux loss: nothing is counted
  if (tp)
    if (std::string e = all_reduce_doubles(tp, global); !e.empty())
      return e;
  c.global_counts = global.data();
  c.count_ranks = tp ? tp->size() : 1;
  return "";
}

template std::string CpuExecutor::Impl::router_group_counts<float>(const pl::Instruction &,
                                                                   const float *,
                                                                   cpu::MoeRouterConfig &,
                                                                   std::vector<double> &);
template std::string CpuExecutor::Impl::router_group_counts<double>(const pl::Instruction &,
                                                                    const double *,
                                                                    cpu::MoeRouterConfig &,
                                                                    std::vector<double> &);

} // namespace mt::rt
