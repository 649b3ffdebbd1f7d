// The collectives with a size per rank that every backend shares, built on
// its exchange_v (collectives.h).
#include "runtime/comm/collectives.h"

namespace mt::rt {

std::string Communicator::all_gather_v(const float *in, const std::vector<size_t> &counts,
                                       float *out) {
  int n = size(), me = rank();
  // A wrong number of counts is reported by exchange_v, by their name.
  size_t mine = counts.size() == size_t(n) ? counts[me] : 0;
  std::vector<size_t> send_counts(n, mine), send_displs(n, 0), recv_displs(counts.size());
  size_t offset = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    recv_displs[r] = offset;
    offset += counts[r];
  }
  return exchange_v("all_gather_v", in, send_counts, send_displs, out, counts, recv_displs,
                    sizeof(float));
}

std::string Communicator::reduce_scatter_v(const float *in, const std::vector<size_t> &counts,
                                           float *out) {
  int n = size(), me = rank();
  size_t mine = counts.size() == size_t(n) ? counts[me] : 0;
  std::vector<size_t> send_displs(counts.size()), recv_counts(n, mine), recv_displs(n);
  size_t offset = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    send_displs[r] = offset;
    offset += counts[r];
  }
  for (int r = 0; r < n; ++r)
    recv_displs[r] = size_t(r) * mine;
  // Every rank's block for this rank, then their sum in rank order.
  std::vector<float> blocks(size_t(n) * mine);
  if (std::string err = exchange_v("reduce_scatter_v", in, counts, send_displs, blocks.data(),
                                   recv_counts, recv_displs, sizeof(float));
      !err.empty())
    return err;
  for (size_t i = 0; i < mine; ++i) {
    float sum = blocks[i];
    for (int r = 1; r < n; ++r)
      sum += blocks[size_t(r) * mine + i];
    out[i] = sum;
  }
  return "";
}

} // namespace mt::rt
