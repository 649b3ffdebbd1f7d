// Flat-buffer segments and bucket shards (see grad_buckets.h).
#include "runtime/plan/grad_buckets.h"

#include <algorithm>

namespace mt::rt {

std::vector<FlatSegment> flat_segments(const std::vector<FlatParam> &params, int64_t begin,
                                       int64_t end) {
  std::vector<FlatSegment> out;
  for (const FlatParam &p : params) {
    int64_t b = std::max(begin, p.flat_offset), e = std::min(end, p.flat_offset + p.elements);
    if (b < e)
      out.push_back({p.param, b - p.flat_offset, e - b, b});
  }
  std::sort(out.begin(), out.end(),
            [](const FlatSegment &x, const FlatSegment &y) { return x.flat_begin < y.flat_begin; });
  return out;
}

FlatRange bucket_shard(int64_t begin, int64_t end, int dp, int dp_rank) {
  const int64_t n = (end - begin) / dp;
  return {begin + dp_rank * n, begin + (dp_rank + 1) * n};
}

} // namespace mt::rt
