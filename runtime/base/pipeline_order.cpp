#include "runtime/base/pipeline_order.h"

#include <algorithm>

namespace mt::rt {

std::vector<PipelineStep> pipeline_order(int64_t pp, int64_t vp, int64_t rank, int64_t m) {
  std::vector<PipelineStep> order;
  if (pp < 1 || vp < 1 || rank < 0 || rank >= pp || m < 1)
    return order;
  if (vp == 1) {
    // 1F1B: warm-up forwards, then one forward and one backward in turn,
    // then the remaining backwards.
    const int64_t warmup = std::min(pp - rank - 1, m), steady = m - warmup;
    for (int64_t i = 0; i < warmup; ++i)
      order.push_back({true, i, 0, 0});
    for (int64_t i = 0; i < steady; ++i) {
      order.push_back({true, warmup + i, 0, 0});
      order.push_back({false, i, 0, 0});
    }
    for (int64_t i = steady; i < m; ++i)
      order.push_back({false, i, 0, 0});
    return order;
  }
  // Interleaved: virtual micro-batch k runs micro-batch
  // (k / (pp * vp)) * pp + k % pp on chunk (k % (pp * vp)) / pp; backwards
  // visit the chunks in reverse. Warm-up as Megatron-Core 0.16's
  // get_pp_rank_microbatches (micro-batch groups of pp per chunk), all of
  // the step when that reaches its end.
  const int64_t total = m * vp;
  const int64_t warmup = std::min((pp - rank - 1) * 2 + (vp - 1) * pp, total);
  auto step = [&](int64_t k, bool forward, int64_t unit) {
    int64_t chunk = (k % (pp * vp)) / pp;
    if (!forward)
      chunk = vp - chunk - 1;
    return PipelineStep{forward, (k / (pp * vp)) * pp + k % pp, chunk, unit};
  };
  const int64_t steady = total - warmup;
  int64_t unit = 0;
  for (int64_t k = 0; k < warmup; ++k, ++unit)
    order.push_back(step(k, true, unit));
  for (int64_t i = 0; i < steady; ++i, ++unit) {
    order.push_back(step(warmup + i, true, unit));
    order.push_back(step(i, false, unit));
  }
  for (int64_t k = steady; k < total; ++k, ++unit)
    order.push_back(step(k, false, unit));
  return order;
}

std::vector<ScheduledSegment> expand_pipeline(int64_t pp, int64_t vp, int64_t rank, int64_t m,
                                              const std::vector<SegmentKey> &segments,
                                              std::string *error) {
  std::vector<ScheduledSegment> out;
  auto fail = [&](const std::string &e) {
    if (error)
      *error = e;
    out.clear();
    return out;
  };
  if (pp < 2 || vp < 1 || rank < 0 || rank >= pp || m < 1)
    return fail("a pipeline schedule needs stages >= 2, chunks >= 1, 0 <= rank < stages and "
                "micro-batches >= 1 (stages " + std::to_string(pp) + ", chunks " +
                std::to_string(vp) + ", rank " + std::to_string(rank) + ", micro-batches " +
                std::to_string(m) + ")");
  if (vp > 1 && m % pp != 0)
    return fail("the interleaved schedule needs the micro-batch count (" + std::to_string(m) +
                ") to be a multiple of the stage count (" + std::to_string(pp) + ")");
  // (forward, chunk, part) -> segment index, -1 when it has none.
  std::vector<int32_t> index(size_t(2 * vp * 4), -1);
  auto slot = [&](bool forward, int64_t chunk, SegmentPart part) -> int32_t & {
    return index[size_t(((forward ? 0 : 1) * vp + chunk) * 4 + int(part))];
  };
  for (size_t i = 0; i < segments.size(); ++i) {
    const SegmentKey &k = segments[i];
    if (k.chunk < 0 || k.chunk >= vp || int(k.part) > 3)
      return fail("segment " + std::to_string(i) + " names chunk " + std::to_string(k.chunk) +
                  " of " + std::to_string(vp));
    if ((vp == 1) != (k.part == SegmentPart::All))
      return fail("segment " + std::to_string(i) +
                  (vp == 1 ? " splits a 1F1B step into exchanges"
                           : " is a whole step in an interleaved schedule"));
    int32_t &s = slot(k.forward, k.chunk, k.part);
    if (s >= 0)
      return fail("segments " + std::to_string(s) + " and " + std::to_string(i) +
                  " are the same part of the same step");
    s = int32_t(i);
  }
  const std::vector<PipelineStep> order = pipeline_order(pp, vp, rank, m);
  auto emit = [&](const PipelineStep &s, SegmentPart part) {
    int32_t seg = slot(s.forward, s.chunk, part);
    if (seg >= 0)
      out.push_back({seg, int32_t(s.micro_batch)});
  };
  if (vp == 1) {
    // Each step receives first and sends last; the GPU executor issues a
    // step's sends and the next step's receives, adjacent, as one NCCL
    // group (Megatron's send_forward_recv_backward and its kin).
    for (const PipelineStep &s : order)
      emit(s, SegmentPart::All);
    return out;
  }
  // Interleaved, as Megatron-LM exchanges: after each unit, one group sends
  // the unit's outputs and receives the inputs of the next unit's steps
  // (the first unit's are received up front). Each stage's k-th group then
  // meets its neighbours' k-th groups, which NCCL needs
  // (runtime/comm/comm_order.h).
  for (const PipelineStep &s : order)
    if (s.unit == order.front().unit)
      emit(s, SegmentPart::Recv);
  for (size_t i = 0; i < order.size();) {
    size_t end = i;
    while (end < order.size() && order[end].unit == order[i].unit)
      ++end;
    for (size_t k = i; k < end; ++k)
      emit(order[k], SegmentPart::Compute);
    for (size_t k = i; k < end; ++k)
      emit(order[k], SegmentPart::Send);
    for (size_t k = end; k < order.size() && order[k].unit == order[end].unit; ++k)
      emit(order[k], SegmentPart::Recv);
    i = end;
  }
  return out;
}

std::string check_restriction(const std::vector<ScheduledSegment> &full,
                              const std::vector<ScheduledSegment> &fewer, int64_t micro_batches) {
  size_t i = 0;
  for (size_t k = 0; k < full.size(); ++k) {
    const ScheduledSegment &s = full[k];
    if (s.micro_batch >= micro_batches)
      continue;
    if (i == fewer.size())
      return "the step of " + std::to_string(micro_batches) + " micro-batches ends after " +
             std::to_string(i) + " segments, before the longer step's segment " +
             std::to_string(s.segment) + " of micro-batch " + std::to_string(s.micro_batch);
    if (fewer[i].segment != s.segment || fewer[i].micro_batch != s.micro_batch)
      return "the step of " + std::to_string(micro_batches) + " micro-batches runs segment " +
             std::to_string(fewer[i].segment) + " of micro-batch " +
             std::to_string(fewer[i].micro_batch) + " at its position " + std::to_string(i) +
             ", where the longer step runs segment " + std::to_string(s.segment) +
             " of micro-batch " + std::to_string(s.micro_batch);
    ++i;
  }
  if (i != fewer.size())
    return "the step of " + std::to_string(micro_batches) + " micro-batches runs " +
           std::to_string(fewer.size()) + " segments, the longer step " + std::to_string(i) +
           " for its micro-batches";
  return "";
}

int64_t micro_batches_in_flight(const std::vector<PipelineStep> &order, int64_t chunk) {
  int64_t inFlight = 0, most = 0;
  for (const PipelineStep &s : order)
    if (s.chunk == chunk)
      most = std::max(most, inFlight += s.forward ? 1 : -1);
  return most;
}

} // namespace mt::rt
