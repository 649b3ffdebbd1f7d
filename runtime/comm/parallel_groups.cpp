#include "runtime/comm/parallel_groups.h"

#include <vector>

namespace mt::rt {

RankCoords coords_of(const ParallelLayout &l, int rank) {
  RankCoords c;
  c.tp = rank % l.tp;
  c.dp = (rank / l.tp) % l.dp;
  c.pp = rank / (l.tp * l.dp);
  return c;
}

int rank_of(const ParallelLayout &l, const RankCoords &c) {
  return c.tp + l.tp * (c.dp + l.dp * c.pp);
}

const char *group_name(Group g) {
  switch (g) {
  case Group::DP: return "dp";
  case Group::TP: return "tp";
  case Group::PP: return "pp";
  case Group::MP: return "mp";
  }
  return "?";
}

Communicator *ParallelGroups::get(Group g) const {
  switch (g) {
  case Group::DP: return dp.get();
  case Group::TP: return tp.get();
  case Group::PP: return pp.get();
  case Group::MP: return mp.get();
  }
  return nullptr;
}

int ParallelGroups::size(Group g) const {
  switch (g) {
  case Group::DP: return layout.dp;
  case Group::TP: return layout.tp;
  case Group::PP: return layout.pp;
  case Group::MP: return layout.tp * layout.pp;
  }
  return 1;
}

std::string make_parallel_groups(Communicator *world, const ParallelLayout &layout, int rank,
                                 ParallelGroups *out) {
  out->layout = layout;
  out->rank = rank;
  out->coords = coords_of(layout, rank);
  out->world = world;
  if (layout.world() == 1)
    return "";
  if (!world)
    return "a layout of " + std::to_string(layout.world()) +
           " ranks needs a communicator; start it with that many ranks";
  const RankCoords me = out->coords;
  // Members of each group in ascending world rank; a group of one rank gets
  // no communicator. The splits run in the same order on every rank.
  auto members = [&](Group g) {
    std::vector<int> ranks;
    for (int r = 0; r < layout.world(); ++r) {
      RankCoords c = coords_of(layout, r);
      bool same = g == Group::TP   ? c.pp == me.pp && c.dp == me.dp
                  : g == Group::DP ? c.pp == me.pp && c.tp == me.tp
                  : g == Group::PP ? c.tp == me.tp && c.dp == me.dp
                                   : c.dp == me.dp;
      if (same)
        ranks.push_back(r);
    }
    return ranks;
  };
  for (Group g : {Group::TP, Group::DP, Group::PP, Group::MP}) {
    std::vector<int> ranks = members(g);
    if (ranks.size() < 2)
      continue;
    // A group that is the whole world is split anyway, so that error lines
    // name the group an operation was in. Both backends key sub-groups by
    // their members, so concurrent groups of one kind meet apart.
    std::string err;
    std::unique_ptr<Communicator> c = world->split(ranks, group_name(g), &err);
    if (!c)
      return err;
    (g == Group::TP   ? out->tp
     : g == Group::DP ? out->dp
     : g == Group::PP ? out->pp
                      : out->mp) = std::move(c);
  }
  return "";
}

} // namespace mt::rt
