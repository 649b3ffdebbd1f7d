// The expert groups of runtime/comm/parallel_groups.h against tables
// derived by hand from Megatron-Core 0.16's expert RankGenerator (sizes
// etp, ep, expert dp, pp; order "tp-cp-ep-dp-pp", cp 1): within a pipeline
// stage the expert tensor rank is fastest, then the expert-parallel rank,
// then the expert data-parallel rank.
#include "runtime/comm/parallel_groups.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

using mt::rt::Communicator;
using mt::rt::Group;
using mt::rt::ParallelLayout;
using namespace std::chrono_literals;

namespace {

// Every group of kind g over the world, e.g. "{0,2} {1,3} {4,6} {5,7}".
std::string partition(const ParallelLayout &layout, Group g) {
  std::set<std::vector<int>> groups;
  for (int r = 0; r < layout.world(); ++r)
    groups.insert(mt::rt::group_members(layout, g, r));
  std::string s;
  for (const std::vector<int> &members : groups) {
    s += s.empty() ? "{" : " {";
    for (size_t i = 0; i < members.size(); ++i)
      s += (i ? "," : "") + std::to_string(members[i]);
    s += "}";
  }
  return s;
}

ParallelLayout layout_of(int tp, int pp, int dp, int ep, int etp) {
  ParallelLayout l;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  l.ep = ep;
  l.etp = etp;
  l.experts = true;
  return l;
}

struct Expected {
  const char *name;
  ParallelLayout layout;
  const char *ep, *expt_tp, *expt_dp, *tp_ep, *tp_ep_pp;
};

const Expected kTable[] = {
    // world 8 = tp2 x dp4: expert dp = 8 / (etp * ep).
    {"tp2 dp4 ep2 etp1", layout_of(2, 1, 4, 2, 1), "{0,1} {2,3} {4,5} {6,7}",
     "{0} {1} {2} {3} {4} {5} {6} {7}", "{0,2,4,6} {1,3,5,7}", "{0,1} {2,3} {4,5} {6,7}",
     "{0,1} {2,3} {4,5} {6,7}"},
    {"tp2 dp4 ep4 etp1", layout_of(2, 1, 4, 4, 1), "{0,1,2,3} {4,5,6,7}",
     "{0} {1} {2} {3} {4} {5} {6} {7}", "{0,4} {1,5} {2,6} {3,7}", "{0,1,2,3} {4,5,6,7}",
     "{0,1,2,3} {4,5,6,7}"},
    {"tp2 dp4 ep2 etp2", layout_of(2, 1, 4, 2, 2), "{0,2} {1,3} {4,6} {5,7}",
     "{0,1} {2,3} {4,5} {6,7}", "{0,4} {1,5} {2,6} {3,7}", "{0,1,2,3} {4,5,6,7}",
     "{0,1,2,3} {4,5,6,7}"},
    // pp2 x dp4: each stage of 4 ranks is split alike; tp_ep_pp spans both.
    {"pp2 dp4 ep2", layout_of(1, 2, 4, 2, 1), "{0,1} {2,3} {4,5} {6,7}",
     "{0} {1} {2} {3} {4} {5} {6} {7}", "{0,2} {1,3} {4,6} {5,7}", "{0,1} {2,3} {4,5} {6,7}",
     "{0,1,4,5} {2,3,6,7}"},
    // etp 1 under tp 2: the expert weights are whole on each rank, so the
    // tensor-parallel ranks become expert data-parallel copies.
    {"tp2 pp2 ep1 etp1", layout_of(2, 2, 1, 1, 1), "{0} {1} {2} {3}", "{0} {1} {2} {3}",
     "{0,1} {2,3}", "{0} {1} {2} {3}", "{0,2} {1,3}"},
};

TEST(ExpertGroups, MegatronExpertRankGenerator) {
  for (const Expected &e : kTable) {
    SCOPED_TRACE(e.name);
    ASSERT_EQ(mt::rt::check_layout(e.layout), "");
    EXPECT_EQ(partition(e.layout, Group::EP), e.ep);
    EXPECT_EQ(partition(e.layout, Group::EXPT_TP), e.expt_tp);
    EXPECT_EQ(partition(e.layout, Group::EXPT_DP), e.expt_dp);
    EXPECT_EQ(partition(e.layout, Group::TP_EP), e.tp_ep);
    EXPECT_EQ(partition(e.layout, Group::TP_EP_PP), e.tp_ep_pp);
    // Coordinates round-trip in both orders; the stages agree.
    for (int r = 0; r < e.layout.world(); ++r) {
      mt::rt::RankCoords c = mt::rt::coords_of(e.layout, r);
      EXPECT_EQ(mt::rt::rank_of(e.layout, c), r);
      EXPECT_EQ(mt::rt::expert_rank_of(e.layout, c), r);
      EXPECT_LT(c.edp, e.layout.edp());
    }
  }
}

TEST(ExpertGroups, DenseGroupsUnchanged) {
  ParallelLayout l = layout_of(2, 2, 2, 2, 1);
  EXPECT_EQ(partition(l, Group::TP), "{0,1} {2,3} {4,5} {6,7}");
  EXPECT_EQ(partition(l, Group::DP), "{0,2} {1,3} {4,6} {5,7}");
  EXPECT_EQ(partition(l, Group::PP), "{0,4} {1,5} {2,6} {3,7}");
  EXPECT_EQ(partition(l, Group::MP), "{0,1,4,5} {2,3,6,7}");
  EXPECT_EQ(partition(l, Group::EXPT_DP), "{0,2} {1,3} {4,6} {5,7}");
}

TEST(ExpertGroups, LayoutErrors) {
  EXPECT_EQ(mt::rt::check_layout(layout_of(2, 1, 3, 4, 1)),
            "expert_tensor_parallel_size x expert_model_parallel_size (1 x 4 = 4) must divide "
            "tensor_model_parallel_size x data_parallel_size (2 x 3 = 6, the ranks of one "
            "pipeline stage), as in Megatron-Core, where the expert data-parallel size is their "
            "quotient; choose sizes whose product divides 6");
  EXPECT_EQ(mt::rt::check_layout(layout_of(2, 1, 3, 2, 1)), ""); // 2 divides 6: edp 3
  EXPECT_EQ(mt::rt::check_layout(layout_of(2, 1, 4, 4, 4)).rfind(
                "expert_tensor_parallel_size x expert_model_parallel_size (4 x 4 = 16) must divide",
                0),
            0u);
  EXPECT_EQ(mt::rt::check_layout(layout_of(1, 1, 2, 0, 1)),
            "expert_model_parallel_size is 0; it must be at least 1");
  mt::rt::ParallelGroups g;
  EXPECT_EQ(mt::rt::make_parallel_groups(nullptr, layout_of(1, 1, 4, 3, 1), 0, &g),
            "parallel layout: expert_tensor_parallel_size x expert_model_parallel_size (1 x 3 = "
            "3) must divide tensor_model_parallel_size x data_parallel_size (1 x 4 = 4, the ranks "
            "of one pipeline stage), as in Megatron-Core, where the expert data-parallel size is "
            "their quotient; choose sizes whose product divides 4");
}

std::vector<std::string> run_threads(int n, const std::function<std::string(Communicator &)> &fn) {
  mt::rt::ThreadGroup group(n, 5s);
  std::vector<std::string> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      auto comm = group.rank(r);
      results[r] = fn(*comm);
    });
  for (auto &t : threads)
    t.join();
  return results;
}

// Each group's communicator sums 2^rank over its members: the bits must be
// the members group_members names, and the communicator carries the name.
std::string check_communicators(Communicator &c, const ParallelLayout &layout) {
  mt::rt::ParallelGroups g;
  if (std::string e = mt::rt::make_parallel_groups(&c, layout, c.rank(), &g); !e.empty())
    return e;
  std::string who = "rank " + std::to_string(c.rank()) + ": ";
  for (Group which : {Group::TP, Group::DP, Group::PP, Group::MP, Group::EP, Group::EXPT_TP,
                      Group::EXPT_DP, Group::TP_EP, Group::TP_EP_PP}) {
    std::vector<int> members = mt::rt::group_members(layout, which, c.rank());
    if (int(members.size()) != g.size(which))
      return who + mt::rt::group_name(which) + " has size " + std::to_string(g.size(which));
    int expect = 0;
    for (int m : members)
      expect += 1 << m;
    Communicator *comm = g.get(which);
    if (!comm) {
      if (members.size() != 1)
        return who + "no communicator for " + mt::rt::group_name(which);
      continue;
    }
    float x = float(1 << c.rank());
    if (std::string e = comm->all_reduce(&x, 1, mt::rt::ReduceOp::Sum); !e.empty())
      return e;
    if (int(x) != expect)
      return who + mt::rt::group_name(which) + " sums to " + std::to_string(int(x));
    if (comm->size() != int(members.size()))
      return who + mt::rt::group_name(which) + " communicator has " +
             std::to_string(comm->size()) + " ranks";
  }
  return "";
}

TEST(ExpertGroups, CommunicatorsHoldTheTableMembers) {
  for (const ParallelLayout &layout :
       {layout_of(2, 1, 4, 2, 2), layout_of(1, 2, 4, 2, 1), layout_of(2, 2, 2, 2, 1)}) {
    auto results = run_threads(8, [&](Communicator &c) { return check_communicators(c, layout); });
    for (int r = 0; r < 8; ++r)
      EXPECT_EQ(results[r], "") << "tp" << layout.tp << " pp" << layout.pp << " dp" << layout.dp
                                << " ep" << layout.ep << " etp" << layout.etp;
  }
}

TEST(ExpertGroups, SameMembersReuseACommunicatorAndDenseBuildsNone) {
  auto results = run_threads(4, [](Communicator &c) -> std::string {
    // ep 1 and etp = tp: every expert group is a dense one.
    mt::rt::ParallelGroups g;
    ParallelLayout same = layout_of(2, 1, 2, 1, 2);
    if (std::string e = mt::rt::make_parallel_groups(&c, same, c.rank(), &g); !e.empty())
      return e;
    if (g.expt_tp || g.expt_dp || g.tp_ep || g.tp_ep_pp || g.ep)
      return "an expert group was split again";
    if (g.get(Group::EXPT_TP) != g.get(Group::TP) || g.get(Group::EXPT_DP) != g.get(Group::DP) ||
        g.get(Group::TP_EP) != g.get(Group::TP) || g.get(Group::TP_EP_PP) != g.get(Group::TP))
      return "an expert group is not its dense twin";
    if (g.get(Group::EXPT_DP)->name() != "dp")
      return "expt_dp is named " + g.get(Group::EXPT_DP)->name();
    // Without `experts`, no expert communicator, but the sizes stand.
    mt::rt::ParallelGroups dense;
    ParallelLayout plain = layout_of(1, 1, 4, 2, 1);
    plain.experts = false;
    if (std::string e = mt::rt::make_parallel_groups(&c, plain, c.rank(), &dense); !e.empty())
      return e;
    if (dense.get(Group::EP) || dense.get(Group::EXPT_DP))
      return "a dense layout built expert groups";
    if (dense.size(Group::EP) != 2 || dense.size(Group::EXPT_DP) != 2)
      return "expert group sizes of a dense layout are wrong";
    return "";
  });
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(results[r], "") << r;
}

} // namespace
