// mt-plan-memory: persistent-state layout and the activation arena, placed
// offline by size with online best-fit kept where it is smaller.
#include "passes/Passes.h"

#include "dialects/mt/MtOps.h"
#include "passes/StageModules.h"
#include "runtime/base/pipeline_order.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"

#include <limits>
#include <map>
#include <numeric>

namespace mt {
#define GEN_PASS_DEF_MTPLANMEMORYPASS
#include "passes/Passes.h.inc"
} // namespace mt

using namespace mlir;

namespace mt {
namespace {

constexpr int64_t kAlign = 256; // cudaMalloc's alignment; cuBLASLt wants 16+

int64_t alignUp(int64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

int64_t bytesOf(Type t) {
  auto rt = cast<RankedTensorType>(t);
  return rt.getNumElements() * ((rt.getElementTypeBitWidth() + 7) / 8);
}

// Best-fit allocator over one address range that grows at the top.
class Arena {
public:
  int64_t allocate(int64_t size) {
    size = alignUp(std::max<int64_t>(size, 1));
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->second >= size && (best == free_.end() || it->second < best->second))
        best = it;
    if (best != free_.end()) {
      int64_t off = best->first, rest = best->second - size;
      free_.erase(best);
      if (rest > 0)
        free_[off + size] = rest;
      return off;
    }
    // Grow: reuse a free block that ends at the top.
    int64_t off = top_;
    if (!free_.empty()) {
      auto last = std::prev(free_.end());
      if (last->first + last->second == top_) {
        off = last->first;
        free_.erase(last);
      }
    }
    top_ = off + size;
    peak_ = std::max(peak_, top_);
    return off;
  }
  void release(int64_t off, int64_t size) {
    size = alignUp(std::max<int64_t>(size, 1));
    auto it = free_.emplace(off, size).first;
    auto next = std::next(it);
    if (next != free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
      }
    }
  }
  int64_t peak() const { return peak_; }

private:
  std::map<int64_t, int64_t> free_; // offset -> size
  int64_t top_ = 0, peak_ = 0;
};

// Values whose bytes are not in the arena: parameters read in place.
bool inArena(Value v) {
  return isa<RankedTensorType>(v.getType()) && !v.getDefiningOp<ParamRefOp>();
}

// One range of arena bytes: a value with its reshape aliases, or logits and
// the gradient written over them. Live over op indices [begin, end],
// inclusive (-1: a program argument, live before the first op); in a
// pipelined step's expansion, over several such spans, in order (one per
// micro-batch sharing its slot). A value used only inside its segment of a
// pipelined step has no spans: `segment` is that segment, and the value is
// live over its ops [local.first, local.second] in every run of it.
struct Buffer {
  int64_t size;
  SmallVector<std::pair<int64_t, int64_t>, 1> spans;
  int64_t segment = -1;
  std::pair<int64_t, int64_t> local{0, -1};
  int64_t begin() const { return spans.front().first; }
  int64_t end() const { return spans.back().second; }
};

// A pipelined step expanded: event e runs segment `segment[e]` over op
// indices [base[e], base[e + 1]).
struct Timeline {
  SmallVector<int64_t> segment, base;
  SmallVector<int64_t> ops; // per segment
  // Calls f(segment, first, last) for each run that [b, e] meets, with the
  // ops of that run it meets.
  template <typename F> void forEachRun(int64_t b, int64_t e, F f) const {
    int64_t i = std::upper_bound(base.begin(), base.end(), b) - base.begin() - 1;
    for (i = std::max<int64_t>(i, 0); i + 1 < int64_t(base.size()) && base[i] <= e; ++i)
      f(segment[i], std::max(b, base[i]) - base[i], std::min(e, base[i + 1] - 1) - base[i]);
  }
};

// Online best-fit in program order: at each op, its new buffers are placed,
// then those whose last use it is are freed (after, so results never overlap
// the operands they are computed from). Buffers are numbered in the order
// they start. Returns the peak.
int64_t placeBestFit(ArrayRef<Buffer> buffers, int64_t end, MutableArrayRef<int64_t> offsets) {
  SmallVector<SmallVector<int64_t>> freeAt(end + 2);
  Arena arena;
  size_t next = 0;
  for (int64_t t = -1; t <= end; ++t) {
    for (; next < buffers.size() && buffers[next].begin() == t; ++next) {
      offsets[next] = arena.allocate(buffers[next].size);
      freeAt[buffers[next].end() + 1].push_back(next);
    }
    for (int64_t id : freeAt[t + 1])
      arena.release(offsets[id], buffers[id].size);
  }
  return arena.peak();
}

// Sorted disjoint [begin, end) byte ranges.
using Ranges = SmallVector<std::pair<int64_t, int64_t>, 0>;

// Adds [from, to) to `r`, merged with the ranges it overlaps or touches.
void addRange(Ranges &r, int64_t from, int64_t to) {
  if (r.empty() || r.back().second < from) { // above all: the usual case
    r.push_back({from, to});
    return;
  }
  auto lo = llvm::lower_bound(r, from, [](const auto &x, int64_t v) { return x.second < v; });
  auto hi = lo;
  for (; hi != r.end() && hi->first <= to; ++hi) {
    from = std::min(from, hi->first);
    to = std::max(to, hi->second);
  }
  if (lo == hi) {
    r.insert(lo, {from, to});
    return;
  }
  *lo = {from, to};
  r.erase(lo + 1, hi);
}

// The bytes placed buffers take, by op index: a segment tree over op
// indices (shifted by one, so program arguments start at 0). Down to blocks
// of 2^K ops (at most 32 blocks: each placed lifetime updates the upper
// levels along two paths, and 32 was the fastest of 32-1024 on the GPT-3
// 175B layout), each node keeps the union of the bytes
// taken anywhere in its range (`full`) and throughout it (`cover`), as
// merged ranges: over a long range they are nearly one range, which a
// search passes in one step. A placed lifetime goes into `cover` at the
// nodes that tile it, reaching the nodes below lazily (`pending`, handed
// down when a query passes), and into `full` at every node above those.
// Inside a block that a lifetime meets in part, two finer trees: `live`
// keeps it at the nodes that tile its part of the block, `starts` at every
// node from its first op up to the block. What is taken at some op of
// [b, e] is then the `full` of the upper nodes that tile [b, e] and, in a
// block it meets in part, the block's `cover`, the `live` nodes on the path
// of its first op there and the `starts` nodes that tile the rest.
class Occupancy {
public:
  explicit Occupancy(int64_t end) {
    while ((int64_t(1) << height_) < end + 2)
      ++height_;
    leaves_ = int64_t(1) << height_;
    block_ = std::max<int64_t>(0, height_ - 5);
    const size_t upper = size_t((2 * leaves_) >> block_);
    full_.resize(upper);
    cover_.resize(upper);
    pending_.resize(upper);
    if (block_ > 0) {
      live_.resize(size_t(2 * leaves_));
      starts_.resize(size_t(2 * leaves_));
    }
  }

  // Appends lists whose union is what is taken at some op of [b, e]: the
  // merged unions of long ranges to `dense`, the rest to `fine`.
  void query(int64_t b, int64_t e, SmallVectorImpl<const Ranges *> &dense,
             SmallVectorImpl<const Ranges *> &fine) {
    query(1, height_, 0, leaves_ - 1, b + 1, e + 1, dense, fine);
  }

  // Marks [from, to) taken over ops [b, e].
  void insert(int64_t b, int64_t e, int64_t from, int64_t to) {
    insert(1, height_, 0, leaves_ - 1, b + 1, e + 1, {from, to});
    int64_t node = b + 1 + leaves_;
    for (int64_t level = 0; level < block_; ++level, node /= 2)
      addRange(starts_[size_t(node)], from, to);
  }

  // Everything taken, at any op.
  const Ranges &all() const { return full_[1]; }

private:
  void query(int64_t n, int64_t level, int64_t lo, int64_t hi, int64_t b, int64_t e,
             SmallVectorImpl<const Ranges *> &dense, SmallVectorImpl<const Ranges *> &fine) {
    if (b <= lo && hi <= e) {
      dense.push_back(&full_[size_t(n)]);
      return;
    }
    if (level == block_) {
      dense.push_back(&cover_[size_t(n)]);
      const int64_t first = std::max(b, lo) + leaves_, last = std::min(e, hi) + leaves_;
      for (int64_t node = first; node > n; node /= 2)
        fine.push_back(&live_[size_t(node)]);
      for (int64_t l = first + 1, h = last + 1; l < h; l /= 2, h /= 2) {
        if (l & 1)
          fine.push_back(&starts_[size_t(l++)]);
        if (h & 1)
          fine.push_back(&starts_[size_t(--h)]);
      }
      return;
    }
    push(n, level);
    const int64_t mid = (lo + hi) / 2;
    if (b <= mid)
      query(2 * n, level - 1, lo, mid, b, e, dense, fine);
    if (e > mid)
      query(2 * n + 1, level - 1, mid + 1, hi, b, e, dense, fine);
  }

  void insert(int64_t n, int64_t level, int64_t lo, int64_t hi, int64_t b, int64_t e,
              std::pair<int64_t, int64_t> r) {
    addRange(full_[size_t(n)], r.first, r.second);
    if (b <= lo && hi <= e) {
      addRange(cover_[size_t(n)], r.first, r.second);
      if (level > block_)
        addRange(pending_[size_t(n)], r.first, r.second);
      return;
    }
    if (level == block_) {
      for (int64_t l = std::max(b, lo) + leaves_, h = std::min(e, hi) + leaves_ + 1; l < h;
           l /= 2, h /= 2) {
        if (l & 1)
          addRange(live_[size_t(l++)], r.first, r.second);
        if (h & 1)
          addRange(live_[size_t(--h)], r.first, r.second);
      }
      return;
    }
    const int64_t mid = (lo + hi) / 2;
    if (b <= mid)
      insert(2 * n, level - 1, lo, mid, b, e, r);
    if (e > mid)
      insert(2 * n + 1, level - 1, mid + 1, hi, b, e, r);
  }

  // Hands what covers node n down to its children.
  void push(int64_t n, int64_t level) {
    Ranges &p = pending_[size_t(n)];
    if (p.empty())
      return;
    for (int64_t c : {2 * n, 2 * n + 1})
      for (auto [from, to] : p) {
        addRange(full_[size_t(c)], from, to);
        addRange(cover_[size_t(c)], from, to);
        if (level - 1 > block_)
          addRange(pending_[size_t(c)], from, to);
      }
    p.clear();
  }

  int64_t height_ = 0, leaves_ = 1, block_ = 0;
  std::vector<Ranges> full_, cover_, pending_, live_, starts_;
};

// Offline placement, greedy by size: the largest buffers first (then the
// longest-lived, then the earliest), each at the lowest offset free over
// its whole lifetime (every span of it). All lifetimes are known before
// placement, so a large buffer is never stranded above the small ones that
// best-fit put first. (Pisarchyk and Lee, "Efficient Memory Management for
// Deep Neural Net Inference", 2020.) Returns the peak, or `limit` as soon
// as the peak would reach it (best-fit's peak: this layout would not be
// kept).
//
// The placed buffers that overlap a new one in time are found in
// Occupancy. In a pipelined step (`timeline`), a segment's own values are
// live only during its runs and the same ops in each, so they are kept
// folded, one per segment over its ops (`own`): a value of that segment
// searches one span there, and with it `others`, what the spanning buffers
// (slots) take in some run of the segment at those ops (`everywhere` when
// a span holds a whole run). A spanning buffer searches the other spanning
// buffers over its spans and, in each run that they meet, that segment's
// own values at the ops met. Each buffer thus sees exactly the buffers its
// lifetime overlaps, as if every run were a span of its own.
int64_t placeBySize(ArrayRef<Buffer> buffers, int64_t end, int64_t limit,
                    MutableArrayRef<int64_t> offsets, const Timeline *timeline = nullptr) {
  const int64_t segments = timeline ? int64_t(timeline->ops.size()) : 0;
  // Per buffer: its ops summed over spans (or runs) and its first op.
  SmallVector<std::pair<int64_t, int64_t>> key(buffers.size());
  {
    SmallVector<int64_t> runs(segments, 0), first(segments, -1);
    if (timeline)
      for (auto [i, s] : llvm::enumerate(timeline->segment)) {
        ++runs[s];
        if (first[s] < 0)
          first[s] = timeline->base[i];
      }
    for (auto [i, buf] : llvm::enumerate(buffers)) {
      if (buf.segment >= 0) {
        key[i] = {runs[buf.segment] * (buf.local.second - buf.local.first + 1),
                  first[buf.segment] + buf.local.first};
        continue;
      }
      int64_t n = 0;
      for (auto [b, e] : buf.spans)
        n += e - b + 1;
      key[i] = {n, buf.begin()};
    }
  }
  SmallVector<int64_t> order(buffers.size());
  for (auto [i, o] : llvm::enumerate(order))
    o = i;
  llvm::sort(order, [&](int64_t a, int64_t b) {
    if (buffers[a].size != buffers[b].size)
      return buffers[a].size > buffers[b].size;
    if (key[a].first != key[b].first)
      return key[a].first > key[b].first;
    return std::make_pair(key[a].second, a) < std::make_pair(key[b].second, b);
  });

  Occupancy spanning(end);
  std::vector<Occupancy> own, others;
  std::vector<Ranges> everywhere(segments);
  for (int64_t s = 0; s < segments; ++s) {
    own.emplace_back(timeline->ops[s] - 1);
    others.emplace_back(timeline->ops[s] - 1);
  }
  SmallVector<int64_t> seen(segments, -1); // the last buffer that listed a segment's `all`

  int64_t peak = 0;
  SmallVector<const Ranges *> dense, fine;
  SmallVector<int64_t> wholes;
  SmallVector<std::tuple<int64_t, int64_t, int64_t>> parts;
  // The lists to search, each with the first of its ranges not yet passed.
  SmallVector<std::pair<const Ranges *, size_t>> lists;
  for (int64_t id : order) {
    const Buffer &buf = buffers[id];
    dense.clear();
    fine.clear();
    if (buf.segment >= 0) {
      own[buf.segment].query(buf.local.first, buf.local.second, dense, fine);
      others[buf.segment].query(buf.local.first, buf.local.second, dense, fine);
      dense.push_back(&everywhere[buf.segment]);
    }
    // The runs its spans meet: the segments met whole, and the parts of
    // others (every span of a slot meets the same ops of its first and
    // last segments, so these repeat).
    wholes.clear();
    parts.clear();
    for (auto [begin, end] : buf.spans) {
      spanning.query(begin, end, dense, fine);
      if (timeline)
        timeline->forEachRun(begin, end, [&](int64_t s, int64_t first, int64_t last) {
          if (first > 0 || last < timeline->ops[s] - 1)
            parts.push_back({s, first, last});
          else if (seen[s] != id) {
            seen[s] = id;
            wholes.push_back(s);
          }
        });
    }
    llvm::sort(parts);
    parts.erase(std::unique(parts.begin(), parts.end()), parts.end());
    for (int64_t s : wholes)
      dense.push_back(&own[s].all());
    for (auto [s, first, last] : parts)
      own[s].query(first, last, dense, fine);
    lists.clear();
    for (const Ranges *r : dense)
      if (!r->empty())
        lists.push_back({r, 0});
    for (const Ranges *r : fine)
      if (!r->empty())
        lists.push_back({r, 0});

    // The lowest offset free in every list: move past any range that
    // overlaps [at, at + size) until none does. Each move is to the end of
    // a range that overlaps every offset skipped, so none is missed; `at`
    // only grows, so each list's position only moves forward (galloping
    // from where it is). The lists are visited round the ring until a
    // whole turn since the last move finds none to make; the merged unions
    // come first, so `at` passes most of what lies below in a few moves.
    int64_t at = 0;
    const size_t count = lists.size();
    for (size_t n = 0, sinceMove = 0; sinceMove < count; n = n + 1 == count ? 0 : n + 1) {
      auto &[r, i] = lists[n];
      ++sinceMove;
      const size_t size = r->size();
      if (i < size && (*r)[i].second <= at) {
        if (r->back().second <= at) {
          i = size;
          continue;
        }
        size_t step = 1, lo = i;
        while (lo + step < size && (*r)[lo + step].second <= at) {
          lo += step;
          step *= 2;
        }
        i = std::upper_bound(r->begin() + lo + 1, r->begin() + std::min(size, lo + step + 1),
                             at, [](int64_t v, const auto &x) { return v < x.second; }) -
            r->begin();
      }
      for (; i < size && (*r)[i].first < at + buf.size; ++i) {
        at = (*r)[i].second;
        sinceMove = 0;
      }
    }
    if (at + buf.size >= limit)
      return limit; // no smaller than best-fit: stop early
    offsets[id] = at;
    peak = std::max(peak, at + buf.size);

    const int64_t top = at + buf.size;
    if (buf.segment >= 0)
      own[buf.segment].insert(buf.local.first, buf.local.second, at, top);
    for (auto [begin, end] : buf.spans)
      spanning.insert(begin, end, at, top);
    for (int64_t s : wholes)
      addRange(everywhere[s], at, top);
    for (auto [s, first, last] : parts)
      others[s].insert(first, last, at, top);
  }
  return peak;
}

// Places one program's values; returns its arena size. Only the function's
// top-level ops are numbered and only their results placed: a value defined
// inside an op's region (an mt.fused body) lives in the kernel, not in the
// arena, and a use inside a region counts as a use by its top-level op.
// Both placements are computed and the one with the smaller peak is kept
// (best-fit on a tie), so the offline one can only shrink the arena.
int64_t planFunction(func::FuncOp f) {
  Block &body = f.getBody().front();
  DenseMap<Operation *, int64_t> index;
  int64_t n = 0;
  for (Operation &op : body)
    index[&op] = n++;
  const int64_t end = n; // the return op's index: outputs live to the end

  // Reshape results share their input's bytes: map each value to its root.
  DenseMap<Value, Value> root;
  auto rootOf = [&](Value v) {
    while (root.count(v))
      v = root.lookup(v);
    return v;
  };
  for (Operation &op : body)
    if (auto r = dyn_cast<ReshapeOp>(op))
      if (inArena(r.getInput()))
        root[r.getResult()] = r.getInput();

  DenseMap<Value, int64_t> lastUse;
  auto noteUses = [&](Value v) {
    if (!inArena(v))
      return;
    int64_t last = -1;
    for (Operation *user : v.getUsers()) {
      user = body.findAncestorOpInBlock(*user);
      last = std::max(last, isa<func::ReturnOp>(user) ? end : index.lookup(user));
    }
    Value r = rootOf(v);
    lastUse[r] = std::max(lastUse.lookup(r), last);
  };
  for (BlockArgument a : body.getArguments())
    noteUses(a);
  for (Operation &op : body)
    for (Value r : op.getResults())
      noteUses(r);

  // Every root value gets a buffer, in the order the values are defined.
  SmallVector<Buffer> buffers;
  DenseMap<Value, int64_t> bufferOf;
  auto open = [&](Value v, int64_t defIndex) {
    bufferOf[v] = buffers.size();
    buffers.push_back({alignUp(std::max<int64_t>(bytesOf(v.getType()), 1)),
                       {{defIndex, std::max(lastUse.lookup(v), defIndex)}}});
  };
  for (BlockArgument a : body.getArguments())
    if (inArena(a))
      open(a, -1);
  for (Operation &op : body) {
    int64_t i = index.lookup(&op);
    // The logits' gradient takes the logits' bytes when this is their last
    // use (the kernel writes each row after reading it): the largest
    // activation of a language model is then held once, not twice.
    if (auto ce = dyn_cast<CrossEntropyGradOp>(op)) {
      Value logits = ce.getLogits(), r = rootOf(logits);
      if (inArena(logits) && lastUse.lookup(r) == i &&
          bytesOf(r.getType()) == bytesOf(ce.getType())) {
        int64_t id = bufferOf.lookup(r);
        bufferOf[ce.getResult()] = id;
        buffers[id].spans.back().second = std::max(lastUse.lookup(ce.getResult()), i);
        continue;
      }
    }
    for (Value r : op.getResults())
      if (inArena(r) && rootOf(r) == r)
        open(r, i);
  }

  SmallVector<int64_t> bestFit(buffers.size()), bySize(buffers.size());
  int64_t peak = placeBestFit(buffers, end, bestFit);
  ArrayRef<int64_t> offsets = bestFit;
  if (int64_t offline = placeBySize(buffers, end, peak, bySize); offline < peak) {
    peak = offline;
    offsets = bySize;
  }

  OpBuilder b(f.getContext());
  auto offsetOf = [&](Value v) { return offsets[bufferOf.lookup(rootOf(v))]; };
  const StringAttr offsetsName = b.getStringAttr("mt.offsets");
  for (Operation &op : body) {
    if (op.getNumResults() == 0)
      continue;
    SmallVector<int64_t> resultOffsets;
    for (Value r : op.getResults())
      resultOffsets.push_back(inArena(r) ? offsetOf(r) : -1);
    op.setAttr(offsetsName, b.getDenseI64ArrayAttr(resultOffsets));
  }
  for (BlockArgument a : body.getArguments())
    if (inArena(a))
      f.setArgAttr(a.getArgNumber(), "mt.offset", b.getI64IntegerAttr(offsetOf(a)));
  f->setAttr("mt.arena_bytes", b.getI64IntegerAttr(peak));
  return peak;
}

// A pipelined @train_step (mt-schedule-pp): one micro-batch's program in
// segments, which mtrun runs in the schedule's order for every micro-batch
// (runtime/base/pipeline_order.h). A value used only inside its segment
// has one place, free over every run of that segment. A value that outlives
// its segment (a saved activation, a message received ahead) gets one slot
// per micro-batch the schedule keeps in flight at once: micro-batch m uses
// slot m % S, the smallest S for which micro-batch m's copy dies before
// micro-batch m + S's is born. Inputs and outputs get one slot per
// micro-batch, live over the whole step, below everything else.
//
// The places are found over the expanded step, as for any program, with
// each slot or segment-local value one buffer over all its spans. The
// schedule repeats in its steady phase: shifting it by Megatron's period
// (one micro-batch for 1F1B, `stages` for the interleaved schedule) and by
// every slot count leaves each span's neighbourhood as it was. So a long
// step is planned over a shorter one with the same warm-up, enough steady
// periods to hold every value's lifetime and the same cool-down (its
// micro-batch count equal modulo that shift): the arena is the same, and
// the planning time no longer grows with the micro-batch count.
//
// A batch ramp-up runs steps of fewer micro-batches inside this plan (each
// value's first slots). That holds when the shorter step runs the planned
// step's segments for its micro-batches in the same order: two values then
// live at once in it only if they do in the planned step. Megatron's
// schedules have that property for every count they accept; it is checked
// for each count in `rampCounts`.
FailureOr<int64_t> planScheduled(func::FuncOp f, DictionaryAttr schedule, ArrayAttr segmentList,
                                 ArrayRef<int64_t> rampCounts) {
  auto get = [&](StringRef n) {
    auto a = schedule.getAs<IntegerAttr>(n);
    return a ? a.getInt() : int64_t(-1);
  };
  const int64_t pp = get("stages"), vp = get("chunks"), rank = get("rank"),
                m = get("micro_batches");
  Block &body = f.getBody().front();
  std::vector<rt::SegmentKey> keys;
  SmallVector<int64_t> segmentOps;
  for (Attribute a : segmentList) {
    auto d = dyn_cast<DictionaryAttr>(a);
    auto fw = d ? d.getAs<BoolAttr>("forward") : BoolAttr();
    auto chunk = d ? d.getAs<IntegerAttr>("chunk") : IntegerAttr();
    auto part = d ? d.getAs<IntegerAttr>("part") : IntegerAttr();
    auto ops = d ? d.getAs<IntegerAttr>("ops") : IntegerAttr();
    if (!fw || !chunk || !part || !ops || ops.getInt() < 1 || part.getInt() < 0 ||
        part.getInt() > 3) {
      f.emitError("mt-plan-memory: mt.segments needs {forward, chunk, part 0-3, ops >= 1} "
                  "per segment; run mt-schedule-pp");
      return failure();
    }
    keys.push_back({fw.getValue(), chunk.getInt(), rt::SegmentPart(part.getInt())});
    segmentOps.push_back(ops.getInt());
  }
  std::string error;
  const std::vector<rt::ScheduledSegment> full = rt::expand_pipeline(pp, vp, rank, m, keys, &error);
  if (full.empty()) {
    f.emitError() << "mt-plan-memory: " << error;
    return failure();
  }
  for (int64_t count : rampCounts) {
    std::vector<rt::ScheduledSegment> fewer;
    if (count < m)
      fewer = rt::expand_pipeline(pp, vp, rank, count, keys, &error);
    if (error.empty())
      error = count < m ? rt::check_restriction(full, fewer, count)
                        : "the step plans only " + std::to_string(m) + " micro-batches";
    if (!error.empty()) {
      f.emitError() << "mt-plan-memory: the batch ramp-up's step of " << count
                    << " micro-batches cannot run in the memory planned for " << m << ": "
                    << error;
      return failure();
    }
  }

  // Each op's segment and index inside it; the order of one micro-batch's
  // segments is their order here.
  struct Where {
    int64_t segment = -1, local = -1;
    bool operator<(const Where &o) const {
      return std::make_pair(segment, local) < std::make_pair(o.segment, o.local);
    }
  };
  DenseMap<Operation *, Where> where;
  {
    int64_t seg = 0, local = 0;
    for (Operation &op : body.without_terminator()) {
      if (isa<ParamRefOp>(op))
        continue;
      if (seg >= int64_t(segmentOps.size())) {
        op.emitError("mt-plan-memory: op after the last of mt.segments' segments");
        return failure();
      }
      where[&op] = {seg, local};
      if (++local == segmentOps[seg]) {
        ++seg;
        local = 0;
      }
    }
    if (seg != int64_t(segmentOps.size())) {
      f.emitError("mt-plan-memory: mt.segments counts more ops than @train_step has");
      return failure();
    }
  }

  DenseMap<Value, Value> root;
  auto rootOf = [&](Value v) {
    while (root.count(v))
      v = root.lookup(v);
    return v;
  };
  for (Operation &op : body)
    if (auto r = dyn_cast<ReshapeOp>(op))
      if (inArena(r.getInput()))
        root[r.getResult()] = r.getInput();

  // Per root: its last use, and whether the step returns it.
  DenseMap<Value, Where> lastUse;
  DenseSet<Value> returned;
  auto noteUses = [&](Value v) {
    if (!inArena(v))
      return;
    Value r = rootOf(v);
    for (Operation *user : v.getUsers()) {
      user = body.findAncestorOpInBlock(*user);
      if (isa<func::ReturnOp>(user)) {
        returned.insert(r);
        continue;
      }
      Where w = where.lookup(user);
      auto it = lastUse.find(r);
      if (it == lastUse.end())
        lastUse[r] = w;
      else if (it->second < w)
        it->second = w;
    }
  };
  for (BlockArgument a : body.getArguments())
    noteUses(a);
  for (Operation &op : body)
    for (Value r : op.getResults())
      noteUses(r);

  struct Item {
    int64_t size;
    Where def, end;
    bool whole; // an input or output: one slot per micro-batch
  };
  SmallVector<Item> items;
  DenseMap<Value, int64_t> itemOf;
  auto open = [&](Value v, Where def, bool whole) {
    itemOf[v] = items.size();
    Where end = def;
    if (auto it = lastUse.find(v); it != lastUse.end() && def < it->second)
      end = it->second;
    items.push_back({alignUp(std::max<int64_t>(bytesOf(v.getType()), 1)), def, end,
                     whole || returned.contains(v)});
  };
  for (BlockArgument a : body.getArguments())
    if (inArena(a))
      open(a, {}, true);
  for (Operation &op : body.without_terminator()) {
    if (isa<ParamRefOp>(op))
      continue;
    Where w = where.lookup(&op);
    // The logits' gradient over the logits, as in planFunction.
    if (auto ce = dyn_cast<CrossEntropyGradOp>(op)) {
      Value logits = ce.getLogits(), r = rootOf(logits);
      auto last = lastUse.find(r);
      if (inArena(logits) && last != lastUse.end() && !(last->second < w) &&
          !(w < last->second) && bytesOf(r.getType()) == bytesOf(ce.getType()) &&
          !returned.contains(r)) {
        int64_t id = itemOf.lookup(r);
        itemOf[ce.getResult()] = id;
        if (auto g = lastUse.find(ce.getResult()); g != lastUse.end() && items[id].end < g->second)
          items[id].end = g->second;
        if (returned.contains(ce.getResult()))
          items[id].whole = true;
        continue;
      }
    }
    for (Value r : op.getResults())
      if (inArena(r) && rootOf(r) == r)
        open(r, w, false);
  }

  // Event positions of every (segment, micro-batch) in the whole step.
  const int64_t nseg = int64_t(keys.size());
  auto positions = [&](const std::vector<rt::ScheduledSegment> &events, int64_t mbs) {
    std::vector<int64_t> pos(size_t(nseg * mbs), -1);
    for (size_t e = 0; e < events.size(); ++e)
      pos[size_t(events[e].segment * mbs + events[e].micro_batch)] = int64_t(e);
    return pos;
  };
  const std::vector<int64_t> fullPos = positions(full, m);
  // Slot counts, per (defining segment, last segment).
  std::map<std::pair<int64_t, int64_t>, int64_t> slotCounts;
  for (Item &it : items) {
    if (it.whole || it.def.segment == it.end.segment)
      continue;
    auto [entry, inserted] = slotCounts.try_emplace({it.def.segment, it.end.segment}, 0);
    if (!inserted)
      continue;
    const int64_t d = it.def.segment, u = it.end.segment;
    int64_t slots = 1;
    for (; slots < m; ++slots) {
      bool ok = true;
      for (int64_t k = 0; ok && k + slots < m; ++k)
        ok = fullPos[size_t(u * m + k)] < fullPos[size_t(d * m + k + slots)];
      if (ok)
        break;
    }
    entry->second = slots;
  }

  // Interleaved: a rank's chunks hold their micro-batches at different
  // times, so slots m % S per chunk would keep every chunk's most in flight
  // at once. Instead each (chunk, micro-batch) takes the lowest slot free
  // when its forward starts, over all chunks (interval colouring, greedy by
  // start: as few slots as ever hold micro-batches at once), and a value
  // lists its slot per micro-batch. Equal chunks then share slots' bytes.
  const bool coloured = vp > 1;
  SmallVector<SmallVector<int64_t>> colour; // [chunk][micro-batch] -> slot
  SmallVector<int64_t> colours(vp, 0);      // per chunk: slots used (highest + 1)
  if (coloured) {
    SmallVector<int64_t> firstSeg(vp, -1), lastSeg(vp, -1);
    for (auto [i, k] : llvm::enumerate(keys)) {
      if (firstSeg[k.chunk] < 0)
        firstSeg[k.chunk] = int64_t(i);
      lastSeg[k.chunk] = int64_t(i);
    }
    struct Instance {
      int64_t start, end, chunk, mb;
    };
    SmallVector<Instance> instances;
    for (int64_t c = 0; c < vp; ++c)
      if (firstSeg[c] >= 0)
        for (int64_t k = 0; k < m; ++k)
          instances.push_back({fullPos[size_t(firstSeg[c] * m + k)],
                               fullPos[size_t(lastSeg[c] * m + k)], c, k});
    llvm::sort(instances, [](const Instance &a, const Instance &b) { return a.start < b.start; });
    colour.assign(vp, SmallVector<int64_t>(m, 0));
    SmallVector<int64_t> busyUntil; // per slot: the event its holder ends at
    for (const Instance &in : instances) {
      int64_t slot = 0;
      while (slot < int64_t(busyUntil.size()) && busyUntil[slot] >= in.start)
        ++slot;
      if (slot == int64_t(busyUntil.size()))
        busyUntil.push_back(0);
      busyUntil[slot] = in.end;
      colour[in.chunk][in.mb] = slot;
      colours[in.chunk] = std::max(colours[in.chunk], slot + 1);
    }
  }

  // The shorter step planned instead of a long one (1F1B).
  int64_t shift = vp > 1 ? pp : 1;
  for (auto &[key, slots] : slotCounts) {
    shift = std::lcm(shift, slots);
    if (shift > m)
      break;
  }
  const int64_t lead = pp; // more than the warm-up's forwards
  int64_t planned = m;
  if (!coloured && shift <= m && m > lead + 5 * shift)
    planned = lead + 4 * shift + (m - lead) % shift;
  std::vector<rt::ScheduledSegment> events = full;
  if (planned < m) {
    events = rt::expand_pipeline(pp, vp, rank, planned, keys, &error);
    if (events.empty()) {
      f.emitError() << "mt-plan-memory: " << error;
      return failure();
    }
  }
  const std::vector<int64_t> pos = planned < m ? positions(events, planned) : fullPos;
  SmallVector<int64_t> base(events.size() + 1, 0);
  for (size_t e = 0; e < events.size(); ++e)
    base[e + 1] = base[e] + segmentOps[size_t(events[e].segment)];
  const int64_t end = base.back();
  auto at = [&](Where w, int64_t mb) {
    return base[size_t(pos[size_t(w.segment * planned + mb)])] + w.local;
  };

  // Inputs and outputs first, one copy per micro-batch.
  SmallVector<SmallVector<int64_t, 1>> placed(items.size());
  int64_t reserved = 0;
  for (auto [i, it] : llvm::enumerate(items))
    if (it.whole)
      for (int64_t k = 0; k < m; ++k) {
        placed[i].push_back(reserved);
        reserved += it.size;
      }
  SmallVector<Buffer> buffers;
  SmallVector<std::pair<int64_t, int64_t>> owner; // buffer -> (item, slot)
  for (auto [i, it] : llvm::enumerate(items)) {
    if (it.whole)
      continue;
    if (it.def.segment == it.end.segment) {
      Buffer b{it.size, {}};
      b.segment = it.def.segment;
      b.local = {it.def.local, it.end.local};
      buffers.push_back(std::move(b));
      owner.push_back({int64_t(i), 0});
      continue;
    }
    if (coloured) {
      const int64_t c = keys[size_t(it.def.segment)].chunk;
      SmallVector<Buffer> bySlot(colours[c], Buffer{it.size, {}});
      for (int64_t k = 0; k < planned; ++k)
        bySlot[colour[c][k]].spans.push_back({at(it.def, k), at(it.end, k)});
      for (auto [s, b] : llvm::enumerate(bySlot))
        if (!b.spans.empty()) {
          buffers.push_back(std::move(b));
          owner.push_back({int64_t(i), int64_t(s)});
        }
      continue;
    }
    const int64_t slots = slotCounts.at({it.def.segment, it.end.segment});
    for (int64_t s = 0; s < slots; ++s) {
      Buffer b{it.size, {}};
      for (int64_t k = s; k < planned; k += slots)
        b.spans.push_back({at(it.def, k), at(it.end, k)});
      buffers.push_back(std::move(b));
      owner.push_back({int64_t(i), s});
    }
  }
  Timeline timeline;
  timeline.ops = segmentOps;
  timeline.base = base;
  for (const rt::ScheduledSegment &e : events)
    timeline.segment.push_back(e.segment);
  SmallVector<int64_t> offsets(buffers.size());
  const int64_t peak =
      placeBySize(buffers, end, std::numeric_limits<int64_t>::max(), offsets, &timeline);
  for (auto [b, o] : llvm::enumerate(owner)) {
    auto &slots = placed[size_t(o.first)];
    if (int64_t(slots.size()) <= o.second)
      slots.resize(size_t(o.second + 1));
    slots[size_t(o.second)] = reserved + offsets[b];
  }
  // Coloured values: their slot per micro-batch (micro-batch k uses entry
  // k % M = k).
  if (coloured)
    for (auto [i, it] : llvm::enumerate(items))
      if (!it.whole && it.def.segment != it.end.segment) {
        const int64_t c = keys[size_t(it.def.segment)].chunk;
        SmallVector<int64_t, 1> perMicroBatch;
        for (int64_t k = 0; k < m; ++k)
          perMicroBatch.push_back(placed[i][size_t(colour[c][k])]);
        placed[i] = std::move(perMicroBatch);
      }

  OpBuilder b(f.getContext());
  const StringAttr offsetsName = b.getStringAttr("mt.offsets"),
                   slotsName = b.getStringAttr("mt.slot_offsets");
  auto slotsOf = [&](Value v) -> ArrayRef<int64_t> {
    return placed[size_t(itemOf.lookup(rootOf(v)))];
  };
  for (Operation &op : body) {
    if (op.getNumResults() == 0 || isa<func::ReturnOp>(op))
      continue;
    SmallVector<int64_t> resultOffsets;
    SmallVector<Attribute> resultSlots;
    bool anySlots = false;
    for (Value r : op.getResults()) {
      if (!inArena(r)) {
        resultOffsets.push_back(-1);
        resultSlots.push_back(b.getDenseI64ArrayAttr({}));
        continue;
      }
      ArrayRef<int64_t> slots = slotsOf(r);
      resultOffsets.push_back(slots.front());
      anySlots |= slots.size() > 1 || items[size_t(itemOf.lookup(rootOf(r)))].whole;
      resultSlots.push_back(b.getDenseI64ArrayAttr(
          slots.size() > 1 || items[size_t(itemOf.lookup(rootOf(r)))].whole ? slots
                                                                             : ArrayRef<int64_t>()));
    }
    op.setAttr(offsetsName, b.getDenseI64ArrayAttr(resultOffsets));
    if (anySlots)
      op.setAttr(slotsName, b.getArrayAttr(resultSlots));
  }
  for (BlockArgument a : body.getArguments())
    if (inArena(a)) {
      f.setArgAttr(a.getArgNumber(), "mt.offset", b.getI64IntegerAttr(slotsOf(a).front()));
      f.setArgAttr(a.getArgNumber(), "mt.slot_offsets", b.getDenseI64ArrayAttr(slotsOf(a)));
    }
  const int64_t arena = reserved + peak;
  f->setAttr("mt.arena_bytes", b.getI64IntegerAttr(arena));
  f->setAttr("mt.planned_micro_batches", b.getI64IntegerAttr(planned));
  return arena;
}

// Data-parallel plans: weights and gradients as flat buffers indexed alike
// by element, so a bucket is one contiguous range of both (the range its
// gradients are reduced over and its weights gathered over). Each tensor
// starts at a multiple of `align` elements (256 bytes of the weights' type;
// the gradients, f32 or bf16, are then 256-byte aligned too), and each bucket is
// padded to a multiple of g * align elements, g the size of its group (dp, or
// edp = mt.expert_data_parallel for an expert bucket), so it splits into g
// equal, aligned shards. Buckets are laid out from the last (the first
// parameters) to bucket 0 (the last parameters, reduced first), parameters in
// module order inside each. With the distributed optimizer, f32 masters
// (reduced precision only) and Adam moments (SGD's momentum buffer alone:
// `sgd`) exist for one shard of every bucket, laid out in the flat buffers'
// order: bucket b's shard of (end_b - begin_b) / g_b elements at its
// `shard_offset` (begin_b / dp when every group is dp).
LogicalResult planBuckets(ModuleOp module, ArrayAttr buckets, bool sgd, int64_t gradBytes,
                          int64_t &cursor, int64_t &weights, int64_t &grads, int64_t &masters,
                          int64_t &moments) {
  OpBuilder b(module.getContext());
  auto dpAttr = module->getAttrOfType<IntegerAttr>("mt.data_parallel");
  if (!dpAttr || dpAttr.getInt() < 1)
    return module.emitError("mt-plan-memory: mt.grad_buckets needs mt.data_parallel >= 1");
  const int64_t dp = dpAttr.getInt();
  auto edpAttr = module->getAttrOfType<IntegerAttr>("mt.expert_data_parallel");
  const bool distOpt = module->hasAttr("mt.distributed_optimizer");
  SmallVector<ParamOp> params(module.getOps<ParamOp>());
  int64_t elemBytes = 4;
  bool reduced = false;
  for (ParamOp p : params) {
    int64_t bits = p.getTensorType().getElementTypeBitWidth();
    elemBytes = std::min<int64_t>(elemBytes, (bits + 7) / 8);
    reduced |= !p.getTensorType().getElementType().isF32();
  }
  const int64_t align = kAlign / elemBytes;
  auto roundUp = [](int64_t v, int64_t m) { return (v + m - 1) / m * m; };

  DenseMap<StringRef, int64_t> flat;
  SymbolTable symbols(module); // hashed: a module lookup scans every op
  SmallVector<std::pair<int64_t, int64_t>> ranges(buckets.size());
  SmallVector<int64_t> shardOffsets(buckets.size());
  int64_t elements = 0, shardElements = 0;
  for (int64_t i = int64_t(buckets.size()) - 1; i >= 0; --i) {
    auto dict = dyn_cast<DictionaryAttr>(buckets[i]);
    auto names = dict ? dict.getAs<ArrayAttr>("params") : ArrayAttr();
    if (!names)
      return module.emitError("mt-plan-memory: mt.grad_buckets[")
             << i << "] is not {params = [...]}";
    int64_t group = dp;
    if (auto g = dict.getAs<StringAttr>("group"); g && g.getValue() != "dp") {
      if (g.getValue() != "expt_dp")
        return module.emitError("mt-plan-memory: mt.grad_buckets[")
               << i << "] has group \"" << g.getValue() << "\"; expected \"dp\" or \"expt_dp\"";
      if (!edpAttr || edpAttr.getInt() < 1)
        return module.emitError("mt-plan-memory: mt.grad_buckets[")
               << i << "] is an expt_dp bucket, which needs mt.expert_data_parallel >= 1";
      group = edpAttr.getInt();
    }
    const int64_t begin = elements;
    for (Attribute a : llvm::reverse(names)) {
      auto ref = dyn_cast<FlatSymbolRefAttr>(a);
      auto p = ref ? symbols.lookup<ParamOp>(ref.getAttr()) : ParamOp();
      if (!p || flat.count(p.getSymName()))
        return module.emitError("mt-plan-memory: mt.grad_buckets[")
               << i << "] names " << a << ", which is not a parameter or is in another bucket";
      elements = roundUp(elements, align);
      flat[p.getSymName()] = elements;
      elements += p.getNumElements();
    }
    elements = begin + roundUp(elements - begin, group * align);
    ranges[i] = {begin, elements};
    shardOffsets[i] = shardElements;
    shardElements += (elements - begin) / group;
  }
  for (ParamOp p : params)
    if (!flat.count(p.getSymName()))
      return p.emitError("mt-plan-memory: the parameter is in none of mt.grad_buckets");

  const int64_t weightBase = cursor;
  weights = alignUp(elements * elemBytes);
  const int64_t gradBase = weightBase + weights;
  grads = alignUp(elements * gradBytes);
  cursor = gradBase + grads;
  for (ParamOp p : params) {
    int64_t e = flat.lookup(p.getSymName());
    p->setAttr("mt.flat_offset", b.getI64IntegerAttr(e));
    // e * bytes / elements, in 128 bits: the product passes 2^63 on large
    // models (e ~ 1e10 elements, a weight of ~1e9 bytes).
    const int64_t at = int64_t(static_cast<__int128>(e) * bytesOf(p.getType()) /
                               p.getNumElements());
    p->setAttr("mt.weight_offset", b.getI64IntegerAttr(weightBase + at));
    p->setAttr("mt.grad_offset", b.getI64IntegerAttr(gradBase + e * gradBytes));
  }
  SmallVector<Attribute> rewritten;
  for (auto [i, a] : llvm::enumerate(buckets)) {
    auto dict = cast<DictionaryAttr>(a);
    SmallVector<NamedAttribute> fields = {
        b.getNamedAttr("params", dict.get("params")),
        b.getNamedAttr("group", dict.get("group") ? dict.get("group") : b.getStringAttr("dp")),
        b.getNamedAttr("begin", b.getI64IntegerAttr(ranges[i].first)),
        b.getNamedAttr("end", b.getI64IntegerAttr(ranges[i].second)),
    };
    if (distOpt)
      fields.push_back(b.getNamedAttr("shard_offset", b.getI64IntegerAttr(shardOffsets[i])));
    rewritten.push_back(b.getDictionaryAttr(fields));
  }
  module->setAttr("mt.grad_buckets", b.getArrayAttr(rewritten));
  module->setAttr("mt.flat_elements", b.getI64IntegerAttr(elements));
  if (!distOpt)
    return success();

  const int64_t shard = shardElements, shardBytes = alignUp(shard * 4);
  int64_t masterAt = -1;
  if (reduced) {
    masterAt = cursor;
    cursor += shardBytes;
    masters = shardBytes;
  }
  const int64_t states = sgd ? 1 : 2;
  const int64_t m1 = cursor, m2 = sgd ? -1 : cursor + shardBytes;
  cursor += states * shardBytes;
  moments = states * shardBytes;
  for (ParamOp p : params)
    for (StringRef n : {"mt.master_offset", "mt.exp_avg_offset", "mt.exp_avg_sq_offset"})
      p->setAttr(n, b.getI64IntegerAttr(-1));
  NamedAttribute state[] = {
      b.getNamedAttr("elements", b.getI64IntegerAttr(shard)),
      b.getNamedAttr("master_offset", b.getI64IntegerAttr(masterAt)),
      b.getNamedAttr("exp_avg_offset", b.getI64IntegerAttr(m1)),
      b.getNamedAttr("exp_avg_sq_offset", b.getI64IntegerAttr(m2)),
  };
  module->setAttr("mt.shard_state", b.getDictionaryAttr(state));
  return success();
}

struct MtPlanMemoryPass : impl::MtPlanMemoryPassBase<MtPlanMemoryPass> {
  void runOnOperation() override {
    // A batch ramp-up's smaller micro-batch counts (mt.training).
    SmallVector<int64_t> rampCounts;
    if (auto t = getOperation()->getAttrOfType<DictionaryAttr>("mt.training"))
      if (auto a = t.getAs<DenseI64ArrayAttr>("ramp_micro_batches"))
        rampCounts.assign(a.asArrayRef().begin(), a.asArrayRef().end());
    for (ModuleOp stage : stageModules(getOperation()))
      runOnStage(stage, rampCounts);
  }

  void runOnStage(ModuleOp module, ArrayRef<int64_t> rampCounts) {
    OpBuilder b(module.getContext());

    // Persistent state, grouped by kind so each kind is one contiguous
    // region (flat buffers for the fused optimizer and gradient reductions).
    SmallVector<ParamOp> params(module.getOps<ParamOp>());
    int64_t cursor = 0;
    int64_t weights = 0, grads = 0, masters = 0, moments = 0;
    // SGD keeps one state tensor, its momentum buffer, in the first
    // moment's place; Adam two.
    bool sgd = false;
    module.walk([&](Operation *op) {
      if (isa<SgdOp, ShardedSgdOp>(op))
        sgd = true;
    });
    // The gradients' type: f32, or with grad_reduce_in_bf16 the parameters'
    // own bf16 (Megatron's DDP: grad_dtype = param.dtype without
    // grad_reduce_in_fp32), marked on each parameter as mt.grad_dtype.
    int64_t gradBytes = 4;
    if (auto t = moduleAttr(module, "mt.training"); t && t.get("grad_reduce_in_bf16")) {
      for (ParamOp p : params)
        if (!p.getTensorType().getElementType().isBF16()) {
          p.emitError("mt-plan-memory: mt.training.grad_reduce_in_bf16 needs bf16 "
                      "parameters, but this one is ")
              << p.getTensorType().getElementType();
          return signalPassFailure();
        }
      gradBytes = 2;
      for (ParamOp p : params)
        p->setAttr("mt.grad_dtype", TypeAttr::get(b.getBF16Type()));
    }
    auto region = [&](StringRef attr, bool f32, bool present, int64_t &total) {
      for (ParamOp p : params) {
        if (!present || (attr == "mt.master_offset" &&
                         p.getTensorType().getElementType().isF32())) {
          p->setAttr(attr, b.getI64IntegerAttr(-1));
          continue;
        }
        int64_t bytes = attr == "mt.grad_offset" ? p.getNumElements() * gradBytes
                        : f32                    ? p.getNumElements() * 4
                                                 : bytesOf(p.getType());
        p->setAttr(attr, b.getI64IntegerAttr(cursor));
        cursor += alignUp(bytes);
        total += alignUp(bytes);
      }
    };
    if (auto buckets = module->getAttrOfType<ArrayAttr>("mt.grad_buckets")) {
      if (failed(planBuckets(module, buckets, sgd, gradBytes, cursor, weights, grads, masters,
                             moments)))
        return signalPassFailure();
      // Without the distributed optimizer every rank keeps whole masters
      // and moments, per parameter as below.
      if (!module->hasAttr("mt.distributed_optimizer")) {
        region("mt.master_offset", true, true, masters);
        int64_t m1 = 0, m2 = 0;
        region("mt.exp_avg_offset", true, true, m1);
        region("mt.exp_avg_sq_offset", true, !sgd, m2);
        moments = m1 + m2;
      }
    } else {
      region("mt.weight_offset", false, true, weights);
      region("mt.grad_offset", true, true, grads);
      region("mt.master_offset", true, true, masters);
      int64_t m1 = 0, m2 = 0;
      region("mt.exp_avg_offset", true, true, m1);
      region("mt.exp_avg_sq_offset", true, !sgd, m2);
      moments = m1 + m2;
    }

    int64_t arenaBytes = 0;
    for (auto f : module.getOps<func::FuncOp>()) {
      auto schedule = f->getAttrOfType<DictionaryAttr>("mt.pipeline_schedule");
      auto segments = f->getAttrOfType<ArrayAttr>("mt.segments");
      if (schedule && segments) {
        FailureOr<int64_t> bytes = planScheduled(f, schedule, segments, rampCounts);
        if (failed(bytes))
          return signalPassFailure();
        arenaBytes = std::max(arenaBytes, *bytes);
        continue;
      }
      arenaBytes = std::max(arenaBytes, planFunction(f));
    }

    module->setAttr("mt.state_bytes", b.getI64IntegerAttr(cursor));
    module->setAttr("mt.arena_bytes", b.getI64IntegerAttr(arenaBytes));
    NamedAttribute memory[] = {
        b.getNamedAttr("weights", b.getI64IntegerAttr(weights)),
        b.getNamedAttr("grads", b.getI64IntegerAttr(grads)),
        b.getNamedAttr("master_weights", b.getI64IntegerAttr(masters)),
        b.getNamedAttr("optimizer_moments", b.getI64IntegerAttr(moments)),
        b.getNamedAttr("activations", b.getI64IntegerAttr(arenaBytes)),
    };
    module->setAttr("mt.memory", b.getDictionaryAttr(memory));
  }
};

} // namespace
} // namespace mt
