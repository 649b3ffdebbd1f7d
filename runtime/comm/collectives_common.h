// What both communicator backends (threads, Gloo) share: the wording of their
// error lines and the checks of their arguments, so that a user reads the
// same message whichever backend runs.
#ifndef MT_RUNTIME_COLLECTIVES_COMMON_H
#define MT_RUNTIME_COLLECTIVES_COMMON_H

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

namespace mt::rt::detail {

inline std::string format_duration(std::chrono::milliseconds t) {
  if (t.count() % 1000 == 0)
    return std::to_string(t.count() / 1000) + " s";
  return std::to_string(t.count()) + " ms";
}

// "rank 3: all_reduce on group 'dp' (2 ranks)": ranks are world ranks.
inline std::string op_prefix(int world_rank, const std::string &what, const std::string &group,
                             int size) {
  return "rank " + std::to_string(world_rank) + ": " + what + " on group '" + group + "' (" +
         std::to_string(size) + " ranks)";
}

// "" or why `peer` (group numbering) cannot be sent to or received from.
inline std::string check_peer(const std::string &prefix, int peer, int rank, int size) {
  if (peer < 0 || peer >= size)
    return prefix + ": peer " + std::to_string(peer) + " is not a rank of the group; use 0.." +
           std::to_string(size - 1);
  if (peer == rank)
    return prefix + ": the peer is this rank itself; send to another rank";
  return "";
}

// "" or why `ranks` is not a valid split of a group of `size` for `rank`.
inline std::string check_split(const std::string &prefix, const std::vector<int> &ranks,
                               int rank, int size) {
  if (ranks.empty() || !std::is_sorted(ranks.begin(), ranks.end()) ||
      std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end() || ranks.front() < 0 ||
      ranks.back() >= size)
    return prefix + ": ranks must be distinct, ascending and within 0.." +
           std::to_string(size - 1);
  if (!std::binary_search(ranks.begin(), ranks.end(), rank))
    return prefix + ": this rank is not in the list; only members call split";
  return "";
}

} // namespace mt::rt::detail

#endif // MT_RUNTIME_COLLECTIVES_COMMON_H
