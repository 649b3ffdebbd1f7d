// --check-memory-plan on the CPU (see cpu_executor.h): value lifetimes, poisoned dead bytes,
// and the owner map that catches a read of overwritten bytes.
#include "runtime/exec/cpu_executor_impl.h"

#include "runtime/plan/plan_reader.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <vector>

namespace mt::rt {

using namespace cpu_exec_detail; // the CPU executor's own pieces (cpu_executor_impl.h)

namespace cpu_exec_detail {

void OwnerMap::assign(uint64_t begin, uint64_t end, Owner o) {
  o.end = end;
  auto it = map_.lower_bound(begin);
  if (it != map_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.end > begin) {
      Owner tail = prev->second;
      prev->second.end = begin;
      if (tail.end > end)
        map_[end] = tail;
    }
  }
  while (it != map_.end() && it->first < end) {
    if (it->second.end > end) {
      Owner tail = it->second;
      map_.erase(it);
      map_[end] = tail;
      break;
    }
    it = map_.erase(it);
  }
  map_[begin] = o;
}

const OwnerMap::Owner *OwnerMap::foreign(uint64_t begin, uint64_t end, uint32_t root,
                                         bool *unwritten) const {
  *unwritten = false;
  uint64_t at = begin;
  auto it = map_.upper_bound(begin);
  if (it != map_.begin())
    --it;
  for (; at < end; ++it) {
    if (it == map_.end() || it->first > at) {
      *unwritten = true;
      return nullptr;
    }
    if (it->second.end <= at)
      continue;
    if (it->second.root != root)
      return &it->second;
    at = it->second.end;
  }
  return nullptr;
}

} // namespace cpu_exec_detail

// Lifetimes per cpu_executor.h: defined at the first write, dead after the
// last read; inputs from the start, outputs to the end.
void CpuExecutor::Impl::plan_lifetimes(ProgramState &ps) {
  const pl::Program &prog = *ps.program;
  const Frame &f = ps.frame;
  const size_t nv = f.ptr.size(), ni = vsize(prog.instructions());
  ps.root.resize(nv);
  for (uint32_t v = 0; v < nv; ++v)
    ps.root[v] = v;
  for (size_t i = 0; i < ni; ++i) {
    const pl::Instruction &ins = *prog.instructions()->Get(uint32_t(i));
    // A result on its source's very bytes (out0_may_alias_in0) owns them
    // from then on: one lifetime for both.
    if (!out0_may_alias_in0(ins.op()))
      continue;
    uint32_t x = ins.in()->Get(0), y = ins.out()->Get(0);
    if (in_arena(f, x) && in_arena(f, y) && f.value(x).offset() == f.value(y).offset())
      ps.root[y] = ps.root[x];
  }
  std::vector<int64_t> def(nv, LLONG_MAX), last(nv, -1);
  for (size_t k = 0; k < vsize(prog.inputs()); ++k) {
    uint32_t r = ps.root[prog.inputs()->Get(uint32_t(k))];
    def[r] = -1;
    ps.input_roots.push_back(r);
  }
  for (size_t i = 0; i < ni; ++i) {
    const pl::Instruction &ins = *prog.instructions()->Get(uint32_t(i));
    for (size_t k = 0; k < vsize(ins.out()); ++k) {
      uint32_t r = ps.root[ins.out()->Get(uint32_t(k))];
      def[r] = std::min<int64_t>(def[r], int64_t(i));
    }
    for (size_t k = 0; k < vsize(ins.in()); ++k) {
      uint32_t r = ps.root[ins.in()->Get(uint32_t(k))];
      last[r] = std::max<int64_t>(last[r], int64_t(i));
    }
  }
  for (size_t k = 0; k < vsize(prog.outputs()); ++k)
    last[ps.root[prog.outputs()->Get(uint32_t(k))]] = int64_t(ni);
  ps.dead.assign(ni + 1, {});
  for (uint32_t v = 0; v < nv; ++v) {
    if (ps.root[v] != v || !in_arena(f, v) || def[v] == LLONG_MAX)
      continue;
    int64_t end = std::max(last[v], def[v]);
    if (end + 1 <= int64_t(ni) && end + 1 >= 0)
      ps.dead[size_t(end + 1)].push_back(v);
  }
}

void CpuExecutor::Impl::poison(uint64_t begin, uint64_t end) {
  if (end > begin)
    std::memset(arena.data() + begin * arena_scale, 0xff, (end - begin) * arena_scale);
}

// Fills every arena byte outside the inputs, which the caller has written.
void CpuExecutor::Impl::poison_all_but_inputs(const ProgramState &ps) {
  std::vector<std::pair<uint64_t, uint64_t>> keep;
  for (uint32_t r : ps.input_roots)
    keep.push_back(range(ps.frame, r));
  std::sort(keep.begin(), keep.end());
  uint64_t at = 0;
  for (auto [b, e] : keep) {
    poison(at, std::max(at, b));
    at = std::max(at, e);
  }
  poison(at, rank.arena_bytes());
}

// Owner-map checks before instruction #i; "" or the violation.
std::string CpuExecutor::Impl::check_before(const ProgramState &ps, const pl::Instruction &ins,
                                            size_t i) {
  const Frame &f = ps.frame;
  auto who = [&]() { return rank_name + ": memory plan violation: " + ps.name + " " +
                            instruction_label(ins, i); };
  for (size_t k = 0; k < vsize(ins.in()); ++k) {
    uint32_t v = ins.in()->Get(uint32_t(k));
    if (!in_arena(f, v))
      continue;
    auto [b, e] = range(f, v);
    bool unwritten = false;
    const OwnerMap::Owner *o = owners.foreign(b, e, ps.root[v], &unwritten);
    if (unwritten)
      return who() + " reads " + value_label(&f.value(v), v) +
             " but part of its bytes were never written";
    if (o) {
      std::string at = "before the program started"; // overlapping inputs
      if (o->instruction >= 0) {
        const size_t j = size_t(o->instruction);
        at = "at " + instruction_label(*ps.program->instructions()->Get(uint32_t(j)), j);
      }
      return who() + " reads " + value_label(&f.value(v), v) + " whose bytes were overwritten by " +
             value_label(&f.value(o->value), o->value) + " " + at;
    }
  }
  return "";
}

void CpuExecutor::Impl::record_after(const ProgramState &ps, const pl::Instruction &ins, size_t i) {
  for (size_t k = 0; k < vsize(ins.out()); ++k) {
    uint32_t y = ins.out()->Get(uint32_t(k));
    auto [b, e] = range(ps.frame, y);
    owners.assign(b, e, {0, y, ps.root[y], int64_t(i)});
  }
}

} // namespace mt::rt
