// mt-plan-memory: persistent-state layout and the activation arena, placed
// offline by size with online best-fit kept where it is smaller.
#include "passes/Passes.h"

#include "dialects/mt/MtOps.h"
#include "passes/StageModules.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

#include <map>

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
// inclusive (-1: a program argument, live before the first op).
struct Buffer {
  int64_t size, begin, end;
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
    for (; next < buffers.size() && buffers[next].begin == t; ++next) {
      offsets[next] = arena.allocate(buffers[next].size);
      freeAt[buffers[next].end + 1].push_back(next);
    }
    for (int64_t id : freeAt[t + 1])
      arena.release(offsets[id], buffers[id].size);
  }
  return arena.peak();
}

// Offline placement, greedy by size: the largest buffers first (then the
// longest-lived, then the earliest), each at the lowest offset free over
// its whole lifetime. All lifetimes are known before placement, so a large
// buffer is never stranded above the small ones that best-fit put first.
// (Pisarchyk and Lee, "Efficient Memory Management for Deep Neural Net
// Inference", 2020.) Returns the peak, or `limit` as soon as the peak would
// reach it (best-fit's peak: this layout would not be kept).
int64_t placeBySize(ArrayRef<Buffer> buffers, int64_t end, int64_t limit,
                    MutableArrayRef<int64_t> offsets) {
  SmallVector<int64_t> order(buffers.size());
  for (auto [i, o] : llvm::enumerate(order))
    o = i;
  llvm::sort(order, [&](int64_t a, int64_t b) {
    const Buffer &x = buffers[a], &y = buffers[b];
    if (x.size != y.size)
      return x.size > y.size;
    if (x.end - x.begin != y.end - y.begin)
      return x.end - x.begin > y.end - y.begin;
    return std::make_pair(x.begin, a) < std::make_pair(y.begin, b);
  });

  // The placed buffers that overlap a new one in time are those live at its
  // first op and those that start later within its lifetime. Two segment
  // trees over op indices (shifted by one, so program arguments start at 0)
  // answer both with O(log n) nodes: `live` keeps a buffer at the nodes that
  // tile its lifetime, so the nodes on a leaf's path to the root hold the
  // buffers live there; `starts` keeps it at every node above its first op,
  // so the nodes that tile a range hold the buffers starting in it. A node
  // keeps only the union of its buffers' bytes, as sorted disjoint
  // [begin, end) ranges: a tight layout merges them into a few, and the
  // lowest free offset is found by skipping forward through each node's
  // ranges instead of sorting every overlapping buffer.
  using Ranges = SmallVector<std::pair<int64_t, int64_t>, 0>;
  int64_t leaves = 1;
  while (leaves < end + 2)
    leaves *= 2;
  std::vector<Ranges> live(2 * leaves), starts(2 * leaves);
  // The first range of `r` that ends after `at`.
  auto firstAfter = [](const Ranges &r, int64_t at) {
    return llvm::upper_bound(r, at, [](int64_t v, const auto &x) { return v < x.second; });
  };
  // Adds [from, to) to `r`, merged with the ranges it overlaps or touches.
  auto add = [](Ranges &r, int64_t from, int64_t to) {
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
  };

  int64_t peak = 0;
  // The nodes to search, each with the first of its ranges not yet passed.
  SmallVector<std::pair<const Ranges *, size_t>> nodes;
  for (int64_t id : order) {
    const Buffer &buf = buffers[id];
    const int64_t first = buf.begin + 1 + leaves, last = buf.end + 1 + leaves;
    nodes.clear();
    auto search = [&](const Ranges &r) {
      if (!r.empty())
        nodes.push_back({&r, 0});
    };
    for (int64_t node = first; node >= 1; node /= 2)
      search(live[node]);
    for (int64_t lo = first + 1, hi = last + 1; lo < hi; lo /= 2, hi /= 2) {
      if (lo & 1)
        search(starts[lo++]);
      if (hi & 1)
        search(starts[--hi]);
    }
    // The lowest offset free in every node: move past any range that
    // overlaps [at, at + size) until none does. Each move is to the end of
    // a range that overlaps every offset skipped, so none is missed; `at`
    // only grows, so each node's position only moves forward.
    int64_t at = 0;
    for (bool moved = true; moved;) {
      moved = false;
      for (auto &[r, i] : nodes) {
        if (i < r->size() && (*r)[i].second <= at)
          i = firstAfter(*r, at) - r->begin();
        for (; i < r->size() && (*r)[i].first < at + buf.size; ++i) {
          at = (*r)[i].second;
          moved = true;
        }
      }
    }
    if (at + buf.size >= limit)
      return limit; // no smaller than best-fit: stop early
    offsets[id] = at;
    peak = std::max(peak, at + buf.size);

    for (int64_t lo = first, hi = last + 1; lo < hi; lo /= 2, hi /= 2) {
      if (lo & 1)
        add(live[lo++], at, at + buf.size);
      if (hi & 1)
        add(live[--hi], at, at + buf.size);
    }
    for (int64_t node = first; node >= 1; node /= 2)
      add(starts[node], at, at + buf.size);
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
    buffers.push_back({alignUp(std::max<int64_t>(bytesOf(v.getType()), 1)), defIndex,
                       std::max(lastUse.lookup(v), defIndex)});
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
        buffers[id].end = std::max(lastUse.lookup(ce.getResult()), i);
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

// Data-parallel plans: weights and gradients as flat buffers indexed alike
// by element, so a bucket is one contiguous range of both (the range its
// gradients are reduced over and its weights gathered over). Each tensor
// starts at a multiple of `align` elements (256 bytes of the weights' type;
// the f32 gradients are then 256-byte aligned too), and each bucket is
// padded to a multiple of dp * align elements, so it splits into dp equal,
// aligned shards. Buckets are laid out from the last (the first parameters)
// to bucket 0 (the last parameters, reduced first), parameters in module
// order inside each. With the distributed optimizer, f32 masters (reduced
// precision only) and Adam moments (SGD's momentum buffer alone: `sgd`)
// exist for one shard of every bucket: flat_elements / dp elements each,
// bucket b's shard at begin_b / dp.
LogicalResult planBuckets(ModuleOp module, ArrayAttr buckets, bool sgd, int64_t &cursor,
                          int64_t &weights, int64_t &grads, int64_t &masters, int64_t &moments) {
  OpBuilder b(module.getContext());
  auto dpAttr = module->getAttrOfType<IntegerAttr>("mt.data_parallel");
  if (!dpAttr || dpAttr.getInt() < 1)
    return module.emitError("mt-plan-memory: mt.grad_buckets needs mt.data_parallel >= 1");
  const int64_t dp = dpAttr.getInt();
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
  SmallVector<std::pair<int64_t, int64_t>> ranges(buckets.size());
  int64_t elements = 0;
  for (int64_t i = int64_t(buckets.size()) - 1; i >= 0; --i) {
    auto dict = dyn_cast<DictionaryAttr>(buckets[i]);
    auto names = dict ? dict.getAs<ArrayAttr>("params") : ArrayAttr();
    if (!names)
      return module.emitError("mt-plan-memory: mt.grad_buckets[")
             << i << "] is not {params = [...]}";
    const int64_t begin = elements;
    for (Attribute a : llvm::reverse(names)) {
      auto ref = dyn_cast<FlatSymbolRefAttr>(a);
      auto p = ref ? module.lookupSymbol<ParamOp>(ref) : ParamOp();
      if (!p || flat.count(p.getSymName()))
        return module.emitError("mt-plan-memory: mt.grad_buckets[")
               << i << "] names " << a << ", which is not a parameter or is in another bucket";
      elements = roundUp(elements, align);
      flat[p.getSymName()] = elements;
      elements += p.getNumElements();
    }
    elements = begin + roundUp(elements - begin, dp * align);
    ranges[i] = {begin, elements};
  }
  for (ParamOp p : params)
    if (!flat.count(p.getSymName()))
      return p.emitError("mt-plan-memory: the parameter is in none of mt.grad_buckets");

  const int64_t weightBase = cursor;
  weights = alignUp(elements * elemBytes);
  const int64_t gradBase = weightBase + weights;
  grads = alignUp(elements * 4);
  cursor = gradBase + grads;
  for (ParamOp p : params) {
    int64_t e = flat.lookup(p.getSymName());
    p->setAttr("mt.flat_offset", b.getI64IntegerAttr(e));
    p->setAttr("mt.weight_offset", b.getI64IntegerAttr(weightBase + e * bytesOf(p.getType()) /
                                                                       p.getNumElements()));
    p->setAttr("mt.grad_offset", b.getI64IntegerAttr(gradBase + e * 4));
  }
  SmallVector<Attribute> rewritten;
  for (auto [i, a] : llvm::enumerate(buckets)) {
    NamedAttribute fields[] = {
        b.getNamedAttr("params", cast<DictionaryAttr>(a).get("params")),
        b.getNamedAttr("begin", b.getI64IntegerAttr(ranges[i].first)),
        b.getNamedAttr("end", b.getI64IntegerAttr(ranges[i].second)),
    };
    rewritten.push_back(b.getDictionaryAttr(fields));
  }
  module->setAttr("mt.grad_buckets", b.getArrayAttr(rewritten));
  module->setAttr("mt.flat_elements", b.getI64IntegerAttr(elements));
  if (!distOpt)
    return success();

  const int64_t shard = elements / dp, shardBytes = alignUp(shard * 4);
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
    for (ModuleOp stage : stageModules(getOperation()))
      runOnStage(stage);
  }

  void runOnStage(ModuleOp module) {
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
    auto region = [&](StringRef attr, bool f32, bool present, int64_t &total) {
      for (ParamOp p : params) {
        if (!present || (attr == "mt.master_offset" &&
                         p.getTensorType().getElementType().isF32())) {
          p->setAttr(attr, b.getI64IntegerAttr(-1));
          continue;
        }
        int64_t bytes = f32 ? p.getNumElements() * 4 : bytesOf(p.getType());
        p->setAttr(attr, b.getI64IntegerAttr(cursor));
        cursor += alignUp(bytes);
        total += alignUp(bytes);
      }
    };
    if (auto buckets = module->getAttrOfType<ArrayAttr>("mt.grad_buckets")) {
      if (failed(planBuckets(module, buckets, sgd, cursor, weights, grads, masters, moments)))
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
    for (auto f : module.getOps<func::FuncOp>())
      arenaBytes = std::max(arenaBytes, planFunction(f));

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
