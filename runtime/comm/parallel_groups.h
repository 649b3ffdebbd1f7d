// Where a rank sits in a tensor x pipeline x data parallel layout, with the
// expert layout of mixture-of-experts layers on top, and the communicators of
// its groups.
//
// Rank order is Megatron-LM's default ("tp-dp-pp"): tensor-parallel ranks are
// adjacent, then data-parallel replicas, and pipeline stages are outermost:
//   rank = tp_rank + tp * (dp_rank + dp * pp_rank)
// so a tensor-parallel group (the most traffic) shares a node whenever tp
// divides the GPUs per node.
//
// Expert layers split the same ranks another way, as Megatron-Core 0.16's
// expert rank generator does (parallel_state.initialize_model_parallel: a
// RankGenerator of sizes etp, ep, expert dp, pp in its default order
// "tp-cp-ep-dp-pp", cp being 1 for experts). Within one pipeline stage the
// tp * dp ranks are renumbered
//   rank = etp_rank + etp * (ep_rank + ep * (edp_rank + edp * pp_rank))
// with edp = tp * dp / (etp * ep), so etp * ep must divide tp * dp. The
// pipeline stages are the same for both (pp is outermost in both orders).
//
// Groups (a null communicator means the group has one rank; names are
// those of Megatron's ProcessGroupCollection):
//   tp        ranks that differ only in tp_rank (one stage of one replica)
//   dp        ranks that differ only in dp_rank (same shard of the same stage)
//   pp        ranks that differ only in pp_rank (the stages of one model replica)
//   mp        ranks that differ in tp_rank or pp_rank (one whole model replica:
//             the gradient norm of a model-parallel layout is summed over it)
//   ep        ranks that differ only in ep_rank (expert model parallel: they
//             hold different experts; tokens travel between them all-to-all)
//   expt_tp   ranks that differ only in etp_rank (expert tensor parallel:
//             shards of the same experts)
//   expt_dp   ranks that differ only in edp_rank (expert data parallel: copies
//             of the same expert shard; expert gradients are reduced over it
//             and the distributed optimizer shards expert states over it)
//   tp_ep     ranks that differ in etp_rank or ep_rank (one stage's experts;
//             the allgather token dispatcher gathers over it)
//   tp_ep_pp  ranks that differ in etp_rank, ep_rank or pp_rank (one whole
//             replica of the experts: the expert gradient norm is summed
//             over it, Megatron's expt_tp_pp group)
// Plan instructions name a group by number: 0 dp, 1 tp, 2 pp, 3 mp,
// 4 ep, 5 expt_tp, 6 expt_dp, 7 tp_ep, 8 tp_ep_pp.
//
// The expert groups are built only for a layout with `experts` set (an MoE
// plan): a dense run does not pay for communicators it never uses. Their
// sizes are known either way.
#ifndef MT_RUNTIME_PARALLEL_GROUPS_H
#define MT_RUNTIME_PARALLEL_GROUPS_H

#include "runtime/comm/collectives.h"

#include <memory>
#include <string>
#include <vector>

namespace mt::rt {

struct ParallelLayout {
  int tp = 1, pp = 1, dp = 1;
  int ep = 1;  // expert_model_parallel_size
  int etp = 1; // expert_tensor_parallel_size
  bool experts = false; // build the expert groups
  int world() const { return tp * pp * dp; }
  // Expert data-parallel size: tp * dp / (etp * ep) (check_layout first).
  int edp() const { return tp * dp / (etp * ep); }
};

// "" or one line saying what is wrong with the layout's sizes (each at
// least 1; etp * ep dividing tp * dp), naming the Megatron flags.
std::string check_layout(const ParallelLayout &layout);

struct RankCoords {
  int tp = 0, pp = 0, dp = 0;
  int etp = 0, ep = 0, edp = 0; // the expert layout's coordinates
};

// Both coordinate sets of `rank` (the layout must pass check_layout).
RankCoords coords_of(const ParallelLayout &layout, int rank);
// The rank of the dense coordinates tp, dp, pp (the expert ones are ignored).
int rank_of(const ParallelLayout &layout, const RankCoords &coords);
// The rank of the expert coordinates etp, ep, edp and pp.
int expert_rank_of(const ParallelLayout &layout, const RankCoords &coords);

enum class Group : int {
  DP = 0,
  TP = 1,
  PP = 2,
  MP = 3,
  EP = 4,
  EXPT_TP = 5,
  EXPT_DP = 6,
  TP_EP = 7,
  TP_EP_PP = 8,
};
constexpr int kNumGroups = 9;
const char *group_name(Group g);

// The world ranks of `rank`'s group `g`, ascending (the layout must pass
// check_layout).
std::vector<int> group_members(const ParallelLayout &layout, Group g, int rank);

struct ParallelGroups {
  ParallelLayout layout;
  int rank = 0;
  RankCoords coords;
  Communicator *world = nullptr; // not owned; null for one rank
  std::unique_ptr<Communicator> tp, pp, dp, mp;
  // The expert groups (layout.experts). One with the same members as an
  // earlier group is not split again: get() returns that group's
  // communicator (ep = 1 and etp = tp make expt_tp the tp group, expt_dp
  // the dp group, ...), so an operation's error line names the first.
  std::unique_ptr<Communicator> ep, expt_tp, expt_dp, tp_ep, tp_ep_pp;

  // The group's communicator, or null when it has one rank (or is an
  // expert group of a layout without experts).
  Communicator *get(Group g) const;
  int size(Group g) const;

private:
  friend std::string make_parallel_groups(Communicator *, const ParallelLayout &, int,
                                          ParallelGroups *);
  Communicator *alias_[kNumGroups] = {}; // a group that reuses another's communicator
};

// Splits `world` (null when the layout has one rank) into this rank's
// groups. Every rank of the world must call it with the same layout.
// Returns "" or an error line.
std::string make_parallel_groups(Communicator *world, const ParallelLayout &layout, int rank,
                                 ParallelGroups *out);

} // namespace mt::rt

#endif // MT_RUNTIME_PARALLEL_GROUPS_H
