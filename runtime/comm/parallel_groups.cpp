#include "runtime/comm/parallel_groups.h"

namespace mt::rt {

std::string check_layout(const ParallelLayout &l) {
  struct Size {
    const char *flag;
    int value;
  } sizes[] = {{"tensor_model_parallel_size", l.tp},
               {"pipeline_model_parallel_size", l.pp},
               {"data_parallel_size", l.dp},
               {"expert_model_parallel_size", l.ep},
               {"expert_tensor_parallel_size", l.etp}};
  for (const Size &s : sizes)
    if (s.value < 1)
      return std::string(s.flag) + " is " + std::to_string(s.value) + "; it must be at least 1";
  int stage = l.tp * l.dp, experts = l.etp * l.ep;
  if (stage % experts != 0)
    return "expert_tensor_parallel_size x expert_model_parallel_size (" + std::to_string(l.etp) +
           " x " + std::to_string(l.ep) + " = " + std::to_string(experts) +
           ") must divide tensor_model_parallel_size x data_parallel_size (" +
           std::to_string(l.tp) + " x " + std::to_string(l.dp) + " = " + std::to_string(stage) +
           ", the ranks of one pipeline stage), as in Megatron-Core, where the expert "
           "data-parallel size is their quotient; choose sizes whose product divides " +
           std::to_string(stage);
  return "";
}

RankCoords coords_of(const ParallelLayout &l, int rank) {
  RankCoords c;
  c.tp = rank % l.tp;
  c.dp = (rank / l.tp) % l.dp;
  c.pp = rank / (l.tp * l.dp);
  int local = rank % (l.tp * l.dp); // the same stage in both orders
  c.etp = local % l.etp;
  c.ep = (local / l.etp) % l.ep;
  c.edp = local / (l.etp * l.ep);
  return c;
}

int rank_of(const ParallelLayout &l, const RankCoords &c) {
  return c.tp + l.tp * (c.dp + l.dp * c.pp);
}

int expert_rank_of(const ParallelLayout &l, const RankCoords &c) {
  return c.etp + l.etp * (c.ep + l.ep * (c.edp + l.edp() * c.pp));
}

const char *group_name(Group g) {
  switch (g) {
  case Group::DP: return "dp";
  case Group::TP: return "tp";
  case Group::PP: return "pp";
  case Group::MP: return "mp";
  case Group::EP: return "ep";
  case Group::EXPT_TP: return "expt_tp";
  case Group::EXPT_DP: return "expt_dp";
  case Group::TP_EP: return "tp_ep";
  case Group::TP_EP_PP: return "tp_ep_pp";
  }
  return "?";
}

namespace {

// Whether ranks with coordinates a and b are in the same group g: they
// agree on every coordinate the group does not span.
bool same_group(Group g, const RankCoords &a, const RankCoords &b) {
  switch (g) {
  case Group::TP: return a.pp == b.pp && a.dp == b.dp;
  case Group::DP: return a.pp == b.pp && a.tp == b.tp;
  case Group::PP: return a.tp == b.tp && a.dp == b.dp;
  case Group::MP: return a.dp == b.dp;
  case Group::EP: return a.pp == b.pp && a.etp == b.etp && a.edp == b.edp;
  case Group::EXPT_TP: return a.pp == b.pp && a.ep == b.ep && a.edp == b.edp;
  case Group::EXPT_DP: return a.pp == b.pp && a.etp == b.etp && a.ep == b.ep;
  case Group::TP_EP: return a.pp == b.pp && a.edp == b.edp;
  case Group::TP_EP_PP: return a.edp == b.edp;
  }
  return false;
}

std::unique_ptr<Communicator> &slot_of(ParallelGroups *g, Group which) {
  switch (which) {
  case Group::DP: return g->dp;
  case Group::TP: return g->tp;
  case Group::PP: return g->pp;
  case Group::MP: return g->mp;
  case Group::EP: return g->ep;
  case Group::EXPT_TP: return g->expt_tp;
  case Group::EXPT_DP: return g->expt_dp;
  case Group::TP_EP: return g->tp_ep;
  case Group::TP_EP_PP: return g->tp_ep_pp;
  }
  return g->dp;
}

bool is_expert(Group g) { return int(g) >= int(Group::EP); }

// The lowest rank of `rank`'s group g: its coordinates with those the group
// spans set to 0.
int leader(const ParallelLayout &l, Group g, int rank) {
  RankCoords c = coords_of(l, rank);
  switch (g) {
  case Group::TP: c.tp = 0; return rank_of(l, c);
  case Group::DP: c.dp = 0; return rank_of(l, c);
  case Group::PP: c.pp = 0; return rank_of(l, c);
  case Group::MP: c.tp = c.pp = 0; return rank_of(l, c);
  case Group::EP: c.ep = 0; return expert_rank_of(l, c);
  case Group::EXPT_TP: c.etp = 0; return expert_rank_of(l, c);
  case Group::EXPT_DP: c.edp = 0; return expert_rank_of(l, c);
  case Group::TP_EP: c.etp = c.ep = 0; return expert_rank_of(l, c);
  case Group::TP_EP_PP: c.etp = c.ep = c.pp = 0; return expert_rank_of(l, c);
  }
  return rank;
}

// Whether groups a and b split the world into the same sets, for every
// rank (so every rank decides alike).
bool same_partition(const ParallelLayout &l, Group a, Group b) {
  for (int r = 0; r < l.world(); ++r)
    if (leader(l, a, r) != leader(l, b, r))
      return false;
  return true;
}

} // namespace

std::vector<int> group_members(const ParallelLayout &layout, Group g, int rank) {
  const RankCoords me = coords_of(layout, rank);
  std::vector<int> ranks;
  for (int r = 0; r < layout.world(); ++r)
    if (same_group(g, me, coords_of(layout, r)))
      ranks.push_back(r);
  return ranks;
}

Communicator *ParallelGroups::get(Group g) const {
  if (int(g) < 0 || int(g) >= kNumGroups)
    return nullptr;
  if (alias_[int(g)])
    return alias_[int(g)];
  return slot_of(const_cast<ParallelGroups *>(this), g).get();
}

int ParallelGroups::size(Group g) const {
  const ParallelLayout &l = layout;
  switch (g) {
  case Group::DP: return l.dp;
  case Group::TP: return l.tp;
  case Group::PP: return l.pp;
  case Group::MP: return l.tp * l.pp;
  case Group::EP: return l.ep;
  case Group::EXPT_TP: return l.etp;
  case Group::EXPT_DP: return l.edp();
  case Group::TP_EP: return l.etp * l.ep;
  case Group::TP_EP_PP: return l.etp * l.ep * l.pp;
  }
  return 1;
}

std::string make_parallel_groups(Communicator *world, const ParallelLayout &layout, int rank,
                                 ParallelGroups *out) {
  if (std::string err = check_layout(layout); !err.empty())
    return "parallel layout: " + err;
  out->layout = layout;
  out->rank = rank;
  out->coords = coords_of(layout, rank);
  out->world = world;
  if (layout.world() == 1)
    return "";
  if (!world)
    return "a layout of " + std::to_string(layout.world()) +
           " ranks needs a communicator; start it with that many ranks";
  // Members of each group in ascending world rank; a group of one rank gets
  // no communicator. The splits run in the same order on every rank, and
  // whether an expert group reuses an earlier one depends only on the
  // layout, so every rank makes the same splits.
  bool made[kNumGroups] = {};
  for (Group g : {Group::TP, Group::DP, Group::PP, Group::MP, Group::EP, Group::EXPT_TP,
                  Group::EXPT_DP, Group::TP_EP, Group::TP_EP_PP}) {
    if (is_expert(g) && !layout.experts)
      continue;
    std::vector<int> ranks = group_members(layout, g, rank);
    if (ranks.size() < 2)
      continue;
    if (is_expert(g)) {
      Communicator *same = nullptr;
      for (int other = 0; other < kNumGroups && !same; ++other)
        if (made[other] && same_partition(layout, g, Group(other)))
          same = out->get(Group(other));
      if (same) {
        out->alias_[int(g)] = same;
        made[int(g)] = true;
        continue;
      }
    }
    // A group that is the whole world is split anyway, so that error lines
    // name the group an operation was in. Both backends key sub-groups by
    // their members, so concurrent groups of one kind meet apart.
    std::string err;
    std::unique_ptr<Communicator> c = world->split(ranks, group_name(g), &err);
    if (!c)
      return err;
    slot_of(out, g) = std::move(c);
    made[int(g)] = true;
  }
  return "";
}

} // namespace mt::rt
