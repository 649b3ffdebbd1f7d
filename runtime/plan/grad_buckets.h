// Data-parallel buckets (plan.fbs Bucket): which parts of which parameters a
// range of the flat weight and gradient buffers holds, and which shard of a
// bucket a data-parallel rank owns under the distributed optimizer.
#ifndef MT_RUNTIME_GRAD_BUCKETS_H
#define MT_RUNTIME_GRAD_BUCKETS_H

#include <cstdint>
#include <vector>

namespace mt::rt {

// A parameter's place in the flat buffers: elements [flat_offset,
// flat_offset + elements).
struct FlatParam {
  uint32_t param;
  int64_t flat_offset, elements;
};

// `count` elements of parameter `param`, from its element `param_begin`, at
// flat element `flat_begin`.
struct FlatSegment {
  uint32_t param;
  int64_t param_begin, count, flat_begin;
};

// The parts of `params` inside the flat range [begin, end), in flat order;
// elements of the range that no parameter covers (padding) are in none.
std::vector<FlatSegment> flat_segments(const std::vector<FlatParam> &params, int64_t begin,
                                       int64_t end);

// The shard of bucket [begin, end) that dp rank `dp_rank` of `dp` owns:
// [begin + dp_rank * n, begin + (dp_rank + 1) * n), n = (end - begin) / dp.
// (end - begin) must divide by dp, as the plan reader checks.
struct FlatRange {
  int64_t begin, end;
};
FlatRange bucket_shard(int64_t begin, int64_t end, int dp, int dp_rank);

// Where bucket [begin, end)'s shard starts in a rank's shard state (the
// distributed optimizer's masters and moments): begin / dp, as every bucket
// before it contributes its own (size / dp) elements.
inline int64_t shard_state_offset(int64_t begin, int dp) { return begin / dp; }

} // namespace mt::rt

#endif // MT_RUNTIME_GRAD_BUCKETS_H
