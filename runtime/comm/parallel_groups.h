// Where a rank sits in a tensor x pipeline x data parallel layout, and the
// communicators of its groups.
//
// Rank order is Megatron-LM's default ("tp-dp-pp"): tensor-parallel ranks are
// adjacent, then data-parallel replicas, and pipeline stages are outermost:
//   rank = tp_rank + tp * (dp_rank + dp * pp_rank)
// so a tensor-parallel group (the most traffic) shares a node whenever tp
// divides the GPUs per node.
//
// Groups (a null communicator means the group has one rank):
//   tp  ranks that differ only in tp_rank (one stage of one replica)
//   dp  ranks that differ only in dp_rank (same shard of the same stage)
//   pp  ranks that differ only in pp_rank (the stages of one model replica)
//   mp  ranks that differ in tp_rank or pp_rank (one whole model replica:
//       the gradient norm of a model-parallel layout is summed over it)
// Plan instructions name a group by number (plan.fbs): 0 dp, 1 tp, 2 pp, 3 mp.
#ifndef MT_RUNTIME_PARALLEL_GROUPS_H
#define MT_RUNTIME_PARALLEL_GROUPS_H

#include "runtime/comm/collectives.h"

#include <memory>
#include <string>

namespace mt::rt {

struct ParallelLayout {
  int tp = 1, pp = 1, dp = 1;
  int world() const { return tp * pp * dp; }
};

struct RankCoords {
  int tp = 0, pp = 0, dp = 0;
};

RankCoords coords_of(const ParallelLayout &layout, int rank);
int rank_of(const ParallelLayout &layout, const RankCoords &coords);

enum class Group : int { DP = 0, TP = 1, PP = 2, MP = 3 };
const char *group_name(Group g);

struct ParallelGroups {
  ParallelLayout layout;
  int rank = 0;
  RankCoords coords;
  Communicator *world = nullptr; // not owned; null for one rank
  std::unique_ptr<Communicator> tp, pp, dp, mp;

  // The group's communicator, or null when it has one rank.
  Communicator *get(Group g) const;
  int size(Group g) const;
};

// Splits `world` (null when the layout has one rank) into this rank's
// groups. Every rank of the world must call it with the same layout.
// Returns "" or an error line.
std::string make_parallel_groups(Communicator *world, const ParallelLayout &layout, int rank,
                                 ParallelGroups *out);

} // namespace mt::rt

#endif // MT_RUNTIME_PARALLEL_GROUPS_H
