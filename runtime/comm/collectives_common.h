// What both communicator backends (threads, Gloo) share: the wording of their
// error lines and the checks of their arguments, so that a user reads the
// same message whichever backend runs.
#ifndef MT_RUNTIME_COLLECTIVES_COMMON_H
#define MT_RUNTIME_COLLECTIVES_COMMON_H

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <utility>
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

// "" or why this rank's arguments to an all_to_all_v-like exchange are
// wrong (checked before anything is sent). Counts and displacements are in
// elements of `elem_bytes`.
inline std::string check_exchange_v(const std::string &prefix, int size, const void *send,
                                    const std::vector<size_t> &send_counts,
                                    const std::vector<size_t> &send_displs, const void *recv,
                                    const std::vector<size_t> &recv_counts,
                                    const std::vector<size_t> &recv_displs, size_t elem_bytes) {
  const std::pair<const char *, const std::vector<size_t> *> vectors[] = {
      {"send_counts", &send_counts},
      {"send_displs", &send_displs},
      {"recv_counts", &recv_counts},
      {"recv_displs", &recv_displs}};
  for (const auto &[name, v] : vectors)
    if (v->size() != size_t(size))
      return prefix + ": " + name + " has " + std::to_string(v->size()) +
             " entries for a group of " + std::to_string(size) + " ranks; give one per rank";
  if (elem_bytes == 0)
    return prefix + ": the element size is 0 bytes; give the size of one element";
  // Byte ranges [first, second) of the blocks in use.
  using Range = std::pair<uintptr_t, uintptr_t>;
  std::vector<Range> sends, recvs;
  size_t sent = 0, received = 0;
  for (int p = 0; p < size; ++p) {
    sent += send_counts[p];
    received += recv_counts[p];
    if (send_counts[p])
      sends.push_back({uintptr_t(send) + send_displs[p] * elem_bytes,
                       uintptr_t(send) + (send_displs[p] + send_counts[p]) * elem_bytes});
    if (recv_counts[p])
      recvs.push_back({uintptr_t(recv) + recv_displs[p] * elem_bytes,
                       uintptr_t(recv) + (recv_displs[p] + recv_counts[p]) * elem_bytes});
  }
  if ((sent && !send) || (received && !recv))
    return prefix + ": the " + (sent && !send ? "send" : "receive") +
           " buffer is null but its counts are not all 0";
  std::sort(recvs.begin(), recvs.end());
  for (size_t i = 1; i < recvs.size(); ++i)
    if (recvs[i].first < recvs[i - 1].second)
      return prefix + ": two receive blocks overlap (recv_displs and recv_counts); give each "
                      "peer its own block";
  for (const Range &s : sends)
    for (const Range &r : recvs)
      if (s.first < r.second && r.first < s.second)
        return prefix + ": a receive block overlaps a send block; use separate buffers";
  return "";
}

// "" or why the members' exchange arguments disagree, given every member's
// (by group rank) send_counts, recv_counts and element size; `world_ranks`
// names them. The same text on every member.
inline std::string check_exchange_counts(const std::vector<int> &world_ranks,
                                         const std::vector<std::vector<size_t>> &send_counts,
                                         const std::vector<std::vector<size_t>> &recv_counts,
                                         const std::vector<size_t> &elem_bytes) {
  int n = int(world_ranks.size());
  for (int r = 1; r < n; ++r)
    if (elem_bytes[r] != elem_bytes[0])
      return "rank " + std::to_string(world_ranks[0]) + " exchanges " +
             std::to_string(elem_bytes[0]) + "-byte elements and rank " +
             std::to_string(world_ranks[r]) + " " + std::to_string(elem_bytes[r]) +
             "-byte ones; every rank must use the same element type";
  for (int r = 0; r < n; ++r)
    for (int p = 0; p < n; ++p)
      if (send_counts[r][p] != recv_counts[p][r])
        return "rank " + std::to_string(world_ranks[r]) + " sends " +
               std::to_string(send_counts[r][p]) + " elements to rank " +
               std::to_string(world_ranks[p]) + ", which expects " +
               std::to_string(recv_counts[p][r]) +
               "; each rank's send count to a peer must equal that peer's receive count from it";
  return "";
}

} // namespace mt::rt::detail

#endif // MT_RUNTIME_COLLECTIVES_COMMON_H
