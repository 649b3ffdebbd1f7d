// A compact pipelined train_step expanded into the unrolled program the
// executors run (see pipeline_expand.h).
#include "runtime/plan/pipeline_expand.h"

#include "runtime/plan/plan_reader.h"
#include "runtime/plan/plan_verifier.h"

#include <cstdint>
#include <limits>
#include <utility>

namespace mt::rt {

namespace pl = mt::plan;
using detail::vsize;
namespace fb = flatbuffers;

// The copy below writes every field of these tables; a field added to
// plan.fbs must be added there too (each static_assert names the last
// field: its vtable slot is 4 + 2 x the field count - 2).
static_assert(pl::Value::VT_SLOT_OFFSETS == 14, "copy Value's new field in pipeline_expand.cpp");
static_assert(pl::Instruction::VT_RUNS_IN == 22,
              "copy Instruction's new field in pipeline_expand.cpp");
static_assert(pl::GpuStep::VT_REDUCE == 18, "copy GpuStep's new field in pipeline_expand.cpp");
static_assert(pl::Gemm::VT_STRIDE_D == 38, "copy Gemm's new field in pipeline_expand.cpp");
static_assert(pl::Program::VT_PIPELINE == 20, "copy Program's new field in pipeline_expand.cpp");
static_assert(sizeof(pl::GpuArg) == 16, "GpuArg gained a field: map it in pipeline_expand.cpp");

namespace {

bool is_p2p(pl::Opcode op) { return op == pl::Opcode::SEND || op == pl::Opcode::RECV; }

bool runs_for(pl::MicroBatches in, int64_t m, int64_t last) {
  return in == pl::MicroBatches::ALL || (in == pl::MicroBatches::FIRST && m == 0) ||
         (in == pl::MicroBatches::LAST && m == last);
}

std::string label(const pl::Program &p, uint32_t v) {
  return value_label(p.values()->Get(v), v);
}

} // namespace

std::vector<SegmentKey> segment_keys(const pl::PipelineSchedule &schedule) {
  std::vector<SegmentKey> keys;
  for (size_t k = 0; k < vsize(schedule.segments()); ++k) {
    const pl::Segment &s = *schedule.segments()->Get(uint32_t(k));
    keys.push_back({s.forward(), s.chunk(), SegmentPart(uint8_t(s.part()))});
  }
  return keys;
}

std::string check_pipeline_schedule(const pl::Program &p, std::vector<ScheduledSegment> *order) {
  order->clear();
  const pl::PipelineSchedule *s = p.pipeline();
  if (!s)
    return "has no pipeline schedule (Program.pipeline)";
  auto n = [](int64_t v) { return std::to_string(v); };
  if (p.unrolled_micro_batches() != 0)
    return "unrolled_micro_batches " + n(p.unrolled_micro_batches()) +
           " beside a pipeline schedule; a compact train_step is one micro-batch's (0)";
  const int64_t m = s->micro_batches();
  if (s->stages() < 2)
    return "pipeline.stages " + n(s->stages()) + " is below 2";
  if (s->chunks() < 1)
    return "pipeline.chunks " + n(s->chunks()) + " is below 1";
  if (s->rank() < 0 || s->rank() >= s->stages())
    return "pipeline.rank " + n(s->rank()) + " is not one of the " + n(s->stages()) + " stages";
  if (m < 1 || m > int64_t(kMaxMicroBatch) + 1)
    return "pipeline.micro_batches " + n(m) + " is outside 1 to " + n(kMaxMicroBatch + 1);
  if (s->tag_stride() < 0)
    return "pipeline.tag_stride " + n(s->tag_stride()) + " is negative";

  const size_t ni = vsize(p.instructions()), nv = vsize(p.values());
  uint64_t at = 0;
  for (size_t k = 0; k < vsize(s->segments()); ++k) {
    const pl::Segment &seg = *s->segments()->Get(uint32_t(k));
    const std::string who = "pipeline.segments[" + n(int64_t(k)) + "]";
    if (seg.begin() != at)
      return who + " begins at instruction " + n(seg.begin()) + "; it must begin where " +
             (k ? "segments[" + n(int64_t(k) - 1) + "] ends (" + n(int64_t(at)) + ")"
                : std::string("the program does (0)"));
    if (seg.end() < seg.begin() || seg.end() > ni)
      return who + " ends at instruction " + n(seg.end()) + ", outside " + n(seg.begin()) +
             " to the program's " + n(int64_t(ni)) + " instructions";
    if (seg.part() > pl::SegmentPart::MAX)
      return who + " has unknown part code " + n(int(seg.part()));
    at = seg.end();
  }
  if (at != ni)
    return "pipeline.segments cover instructions 0 to " + n(int64_t(at)) +
           ", but the program has " + n(int64_t(ni)) + "; every instruction needs its segment";
  std::string e;
  *order = expand_pipeline(s->stages(), s->chunks(), s->rank(), m, segment_keys(*s), &e);
  if (!e.empty())
    return "pipeline: " + e;

  for (uint32_t v = 0; v < nv; ++v) {
    const pl::Value &val = *p.values()->Get(v);
    const auto *slots = val.slot_offsets();
    if (!slots)
      continue;
    const std::string who = "value " + n(v) + " (" + label(p, v) + ")";
    if (reinterpret_cast<uintptr_t>(slots->data()) % alignof(uint64_t) != 0)
      return who + ": its slot_offsets are not 8-byte aligned in the file";
    if (val.region() != pl::Region::ARENA)
      return who + " has slot_offsets but is not an arena value";
    if (slots->size() == 0)
      return who + " has an empty slot_offsets (absent means one copy)";
    if (slots->Get(0) != val.offset())
      return who + " has slot_offsets[0] " + n(int64_t(slots->Get(0))) + ", not its offset " +
             n(int64_t(val.offset()));
  }
  for (int io = 0; io < 2; ++io) {
    const auto *list = io ? p.outputs() : p.inputs();
    const char *what = io ? "output " : "input ";
    for (size_t k = 0; k < vsize(list); ++k) {
      const uint32_t v = list->Get(uint32_t(k));
      if (v >= nv)
        return what + n(int64_t(k)) + " is value " + n(v) + ", but the program has " +
               n(int64_t(nv)) + " values";
      const size_t slots = vsize(p.values()->Get(v)->slot_offsets());
      if (int64_t(slots) != m)
        return what + n(int64_t(k)) + " (" + label(p, v) + ") has " + n(int64_t(slots)) +
               " slot_offsets; a pipelined train_step's inputs and outputs need one per "
               "micro-batch (pipeline.micro_batches " + n(m) + ")";
    }
  }
  for (size_t i = 0; i < ni; ++i) {
    const pl::Instruction &ins = *p.instructions()->Get(uint32_t(i));
    const std::string who = instruction_label(ins, i);
    if (ins.runs_in() > pl::MicroBatches::MAX)
      return who + ": unknown runs_in code " + n(int(ins.runs_in()));
    if (ins.micro_batch() != -1)
      return who + ": micro_batch " + n(ins.micro_batch()) +
             " in a pipelined train_step, whose instructions run for every micro-batch (-1)";
    if (is_p2p(ins.op()) && vsize(ins.ints()) >= 2) {
      const int64_t tag = ins.ints()->Get(1), stride = s->tag_stride();
      if (tag >= 0 && stride > 0 && m - 1 > (std::numeric_limits<int64_t>::max() - tag) / stride)
        return who + ": tag " + n(tag) + " + " + n(m - 1) + " x pipeline.tag_stride " +
               n(stride) + " overflows";
    }
  }
  return "";
}

namespace {

// The expansion's state: the output builder and, per instruction of the
// compact program, its parts that every micro-batch shares and its operand
// lists per slot phase.
class Expander {
public:
  Expander(const pl::Program &c, std::vector<ScheduledSegment> order, int64_t micro_batches)
      : c_(c), order_(std::move(order)), m_(micro_batches),
        stride_(c.pipeline()->tag_stride()) {}

  std::string run(fb::DetachedBuffer *out) {
    const uint32_t nv = uint32_t(vsize(c_.values()));
    const size_t ni = vsize(c_.instructions());
    if (std::string e = check_indices(nv, ni); !e.empty())
      return e;

    // Slot s > 0 of value v is value extra_[v] + s - 1.
    slots_.assign(nv, 1);
    extra_.assign(nv, 0);
    uint64_t total = nv;
    for (uint32_t v = 0; v < nv; ++v)
      if (const auto *so = c_.values()->Get(v)->slot_offsets(); so && so->size() > 1) {
        slots_[v] = so->size();
        extra_[v] = uint32_t(total);
        total += so->size() - 1;
        if (total > std::numeric_limits<uint32_t>::max())
          return "its slots make more than 2^32 values";
      }

    // How many instructions the step runs.
    const auto *segs = c_.pipeline()->segments();
    std::vector<uint64_t> every(vsize(segs)), first(vsize(segs)), last(vsize(segs));
    for (size_t k = 0; k < vsize(segs); ++k)
      for (uint32_t i = segs->Get(uint32_t(k))->begin(); i < segs->Get(uint32_t(k))->end(); ++i) {
        const pl::MicroBatches r = c_.instructions()->Get(i)->runs_in();
        (r == pl::MicroBatches::ALL ? every : r == pl::MicroBatches::FIRST ? first : last)[k]++;
      }
    uint64_t instances = 0;
    for (const ScheduledSegment &s : order_)
      instances += every[size_t(s.segment)] + (s.micro_batch == 0 ? first[size_t(s.segment)] : 0) +
                   (s.micro_batch == m_ - 1 ? last[size_t(s.segment)] : 0);
    // The builder stays under FlatBuffers' 2 GiB with room for the
    // instruction vector and the inputs and outputs.
    const uint64_t reserve = instances * 4 + (uint64_t(64) << 20);
    if (instances > std::numeric_limits<uint32_t>::max() || reserve >= FLATBUFFERS_MAX_BUFFER_SIZE)
      return "the expanded step has " + std::to_string(instances) +
             " instructions, more than one plan program can hold";
    const uint64_t limit = FLATBUFFERS_MAX_BUFFER_SIZE - reserve;
    auto too_big = [&] {
      return "the expanded step of " + std::to_string(instances) +
             " instructions would pass FlatBuffers' 2 GiB; use fewer micro-batches per step";
    };

    std::vector<fb::Offset<pl::Value>> values(total);
    for (uint32_t v = 0; v < nv; ++v)
      copy_value(v, values);

    copies_.resize(ni);
    std::vector<fb::Offset<pl::Instruction>> insts;
    insts.reserve(size_t(instances));
    for (const ScheduledSegment &s : order_) {
      const pl::Segment &seg = *segs->Get(uint32_t(s.segment));
      const int64_t mb = s.micro_batch;
      for (uint32_t i = seg.begin(); i < seg.end(); ++i) {
        const pl::Instruction &ins = *c_.instructions()->Get(i);
        if (!runs_for(ins.runs_in(), mb, m_ - 1))
          continue;
        insts.push_back(instance(i, ins, mb));
        if (fbb_.GetSize() > limit)
          return too_big();
      }
    }

    auto instsVec = fbb_.CreateVector(insts);
    std::vector<uint32_t> io[2];
    std::vector<fb::Offset<fb::String>> names[2];
    const fb::Vector<uint32_t> *lists[2] = {c_.inputs(), c_.outputs()};
    const fb::Vector<fb::Offset<fb::String>> *listNames[2] = {c_.input_names(),
                                                              c_.output_names()};
    for (int k = 0; k < 2; ++k)
      for (int64_t mb = 0; mb < m_; ++mb)
        for (uint32_t j = 0; j < vsize(lists[k]); ++j) {
          io[k].push_back(slot_of(lists[k]->Get(j), mb));
          if (listNames[k])
            names[k].push_back(
                fbb_.CreateString(listNames[k]->Get(j)->str() + "." + std::to_string(mb)));
        }
    auto valuesVec = fbb_.CreateVector(values);
    auto name = c_.name() ? fbb_.CreateString(c_.name()->c_str(), c_.name()->size())
                          : fb::Offset<fb::String>();
    auto program = pl::CreateProgram(
        fbb_, name, valuesVec, lists[0] ? fbb_.CreateVector(io[0]) : 0,
        listNames[0] ? fbb_.CreateVector(names[0]) : 0, lists[1] ? fbb_.CreateVector(io[1]) : 0,
        listNames[1] ? fbb_.CreateVector(names[1]) : 0, instsVec, int32_t(m_));
    fbb_.Finish(program);
    if (fbb_.GetSize() >= FLATBUFFERS_MAX_BUFFER_SIZE)
      return too_big();
    *out = fbb_.Release();
    return "";
  }

private:
  // Operand lists and GPU steps of one slot phase of an instruction.
  struct Operands {
    bool made = false;
    fb::Offset<fb::Vector<uint32_t>> in, out;
    fb::Offset<fb::Vector<fb::Offset<pl::GpuStep>>> gpu;
  };
  // What every micro-batch's copy of an instruction shares.
  struct Copy {
    bool made = false;
    fb::Offset<fb::String> where;
    fb::Offset<fb::Vector<uint32_t>> params;
    fb::Offset<fb::Vector<int64_t>> ints;
    fb::Offset<fb::Vector<double>> floats;
    std::vector<fb::Offset<pl::Gemm>> gemms; // per GPU step
    int64_t period = 1;                      // the operands repeat every `period` micro-batches
    std::vector<Operands> phases;
  };

  std::string check_indices(uint32_t nv, size_t ni) const {
    for (size_t i = 0; i < ni; ++i) {
      const pl::Instruction &ins = *c_.instructions()->Get(uint32_t(i));
      const std::string who = instruction_label(ins, i);
      for (int k = 0; k < 2; ++k) {
        const auto *list = k ? ins.out() : ins.in();
        for (size_t j = 0; j < vsize(list); ++j)
          if (list->Get(uint32_t(j)) >= nv)
            return who + ": " + (k ? "out[" : "in[") + std::to_string(j) + "] is value " +
                   std::to_string(list->Get(uint32_t(j))) + ", but the program has " +
                   std::to_string(nv) + " values";
      }
      for (size_t g = 0; g < vsize(ins.gpu()); ++g) {
        const pl::GpuStep &step = *ins.gpu()->Get(uint32_t(g));
        for (size_t a = 0; a < vsize(step.args()); ++a) {
          const pl::GpuArg &arg = *step.args()->Get(uint32_t(a));
          if (arg.kind() == pl::GpuArgKind::VALUE && arg.index() >= nv)
            return who + ": GPU step " + std::to_string(g) + " args[" + std::to_string(a) +
                   "] is value " + std::to_string(arg.index()) + ", but the program has " +
                   std::to_string(nv) + " values";
        }
      }
      if (is_p2p(ins.op()) && vsize(ins.ints()) < 2)
        return who + ": has " + std::to_string(vsize(ins.ints())) +
               " ints; SEND and RECV take peer and tag";
    }
    return "";
  }

  uint32_t slot_of(uint32_t v, int64_t mb) const {
    const uint32_t s = uint32_t(mb % int64_t(slots_[v]));
    return s == 0 ? v : extra_[v] + s - 1;
  }

  fb::Offset<fb::String> shared(const fb::String *s) {
    return s ? fbb_.CreateSharedString(s->c_str(), s->size()) : fb::Offset<fb::String>();
  }
  template <class T> fb::Offset<fb::Vector<T>> vec(const fb::Vector<T> *v) {
    return v ? fbb_.CreateVector(v->data(), v->size()) : fb::Offset<fb::Vector<T>>();
  }

  void copy_value(uint32_t v, std::vector<fb::Offset<pl::Value>> &values) {
    const pl::Value &val = *c_.values()->Get(v);
    auto shape = vec(val.shape());
    values[v] = pl::CreateValue(fbb_, shared(val.name()), val.region(), val.offset(), shape,
                                val.dtype());
    const std::string name = val.name() ? val.name()->str() : "";
    for (uint32_t s = 1; s < slots_[v]; ++s)
      values[extra_[v] + s - 1] = pl::CreateValue(
          fbb_, name.empty() ? 0 : fbb_.CreateString(name + "@" + std::to_string(s)),
          pl::Region::ARENA, val.slot_offsets()->Get(s), shape, val.dtype());
  }

  Copy &copy_of(uint32_t i, const pl::Instruction &ins) {
    Copy &c = copies_[i];
    if (c.made)
      return c;
    c.made = true;
    c.where = shared(ins.where());
    c.params = vec(ins.params());
    c.ints = vec(ins.ints());
    c.floats = vec(ins.floats());
    // The operands' slot counts repeat with their least common multiple
    // (beyond the step's micro-batch count, each micro-batch is its own).
    auto join = [&](uint32_t v) {
      const int64_t s = slots_[v];
      int64_t a = c.period, b = s;
      while (b) {
        const int64_t t = a % b;
        a = b;
        b = t;
      }
      c.period = std::min<int64_t>(c.period / a * s, m_);
    };
    for (size_t k = 0; k < vsize(ins.in()); ++k)
      join(ins.in()->Get(uint32_t(k)));
    for (size_t k = 0; k < vsize(ins.out()); ++k)
      join(ins.out()->Get(uint32_t(k)));
    for (size_t g = 0; g < vsize(ins.gpu()); ++g) {
      const pl::GpuStep &step = *ins.gpu()->Get(uint32_t(g));
      for (size_t a = 0; a < vsize(step.args()); ++a)
        if (step.args()->Get(uint32_t(a))->kind() == pl::GpuArgKind::VALUE)
          join(uint32_t(step.args()->Get(uint32_t(a))->index()));
      const pl::Gemm *gm = step.gemm();
      c.gemms.push_back(gm ? pl::CreateGemm(fbb_, gm->m(), gm->n(), gm->k(), gm->trans_a(),
                                            gm->trans_b(), gm->lda(), gm->ldb(), gm->ldd(),
                                            gm->a_type(), gm->b_type(), gm->d_type(),
                                            gm->accumulate(), gm->epilogue(), gm->bias_type(),
                                            gm->batch(), gm->stride_a(), gm->stride_b(),
                                            gm->stride_d())
                           : fb::Offset<pl::Gemm>());
    }
    c.phases.resize(size_t(c.period));
    return c;
  }

  const Operands &operands(Copy &c, const pl::Instruction &ins, int64_t mb) {
    Operands &o = c.phases[size_t(mb % c.period)];
    if (o.made)
      return o;
    o.made = true;
    auto mapped = [&](const fb::Vector<uint32_t> *list) {
      if (!list)
        return fb::Offset<fb::Vector<uint32_t>>();
      scratch_.clear();
      for (uint32_t v : *list)
        scratch_.push_back(slot_of(v, mb));
      return fbb_.CreateVector(scratch_);
    };
    o.in = mapped(ins.in());
    o.out = mapped(ins.out());
    if (ins.gpu()) {
      std::vector<fb::Offset<pl::GpuStep>> steps;
      for (size_t g = 0; g < ins.gpu()->size(); ++g) {
        const pl::GpuStep &st = *ins.gpu()->Get(uint32_t(g));
        fb::Offset<fb::Vector<const pl::GpuArg *>> args;
        if (st.args()) {
          std::vector<pl::GpuArg> a;
          a.reserve(st.args()->size());
          for (const pl::GpuArg *arg : *st.args())
            a.push_back(arg->kind() == pl::GpuArgKind::VALUE
                            ? pl::GpuArg(arg->kind(), slot_of(uint32_t(arg->index()), mb))
                            : *arg);
          args = fbb_.CreateVectorOfStructs(a);
        }
        steps.push_back(pl::CreateGpuStep(fbb_, st.kind(), st.kernel(), args, c.gemms[g],
                                          st.count(), st.element(), st.group(), st.reduce()));
      }
      o.gpu = fbb_.CreateVector(steps);
    }
    return o;
  }

  fb::Offset<pl::Instruction> instance(uint32_t i, const pl::Instruction &ins, int64_t mb) {
    Copy &c = copy_of(i, ins);
    const Operands &o = operands(c, ins, mb);
    fb::Offset<fb::Vector<int64_t>> ints = c.ints;
    if (is_p2p(ins.op()) && stride_ != 0 && mb != 0) {
      tags_.assign(ins.ints()->begin(), ins.ints()->end());
      tags_[1] += mb * stride_;
      ints = fbb_.CreateVector(tags_);
    }
    return pl::CreateInstruction(fbb_, ins.op(), o.in, o.out, c.params, ints, c.floats, c.where,
                                 int32_t(mb), o.gpu);
  }

  const pl::Program &c_;
  const std::vector<ScheduledSegment> order_;
  const int64_t m_, stride_;
  fb::FlatBufferBuilder fbb_{1 << 20};
  std::vector<uint32_t> slots_, extra_;
  std::vector<Copy> copies_;
  std::vector<uint32_t> scratch_;
  std::vector<int64_t> tags_;
};

} // namespace

fb::DetachedBuffer expand_pipeline_program(const pl::Program &compact, std::string *error,
                                           int64_t micro_batches) {
  const std::string name = compact.name() ? compact.name()->str() : "";
  std::vector<ScheduledSegment> order;
  std::string e = check_pipeline_schedule(compact, &order);
  const pl::PipelineSchedule *s = compact.pipeline();
  int64_t m = s ? s->micro_batches() : 0;
  if (e.empty() && micro_batches > 0 && micro_batches != m) {
    // A ramp-up's smaller step: it runs the planned step's segments for its
    // micro-batches in the planned order (checked), so every value it holds
    // at once is held at once in the planned step, in the same slot, and
    // the arena holds it as planned (pipeline_order.h, check_restriction).
    if (micro_batches > m) {
      e = "a step of " + std::to_string(micro_batches) + " micro-batches from a schedule "
          "planned for " + std::to_string(m) + "; the arena holds at most those";
    } else {
      std::vector<ScheduledSegment> fewer = expand_pipeline(
          s->stages(), s->chunks(), s->rank(), micro_batches, segment_keys(*s), &e);
      if (e.empty())
        e = check_restriction(order, fewer, micro_batches);
      if (e.empty())
        order = std::move(fewer);
    }
    m = micro_batches;
  }
  fb::DetachedBuffer out;
  if (e.empty())
    e = Expander(compact, std::move(order), m).run(&out);
  if (!e.empty()) {
    if (error)
      *error = "program " + name + ": " + e;
    return fb::DetachedBuffer();
  }
  return out;
}

std::string RankPrograms::load(const pl::Rank &rank) {
  rank_ = &rank;
  expanded_.clear();
  programs_.clear();
  for (size_t p = 0; p < vsize(rank.programs()); ++p) {
    const pl::Program *prog = rank.programs()->Get(uint32_t(p));
    if (!prog->pipeline()) {
      programs_.push_back(prog);
      continue;
    }
    std::string e;
    fb::DetachedBuffer b = expand_pipeline_program(*prog, &e);
    if (!e.empty())
      return "rank " + std::to_string(rank.rank()) + ", " + e;
    expanded_.push_back(std::move(b));
    programs_.push_back(fb::GetRoot<pl::Program>(expanded_.back().data()));
  }
  return "";
}

const pl::Program *RankPrograms::for_micro_batches(const std::string &name,
                                                   int64_t micro_batches, std::string *error) {
  const pl::Program *compact = nullptr;
  for (size_t p = 0; p < vsize(rank_->programs()); ++p)
    if (const pl::Program *prog = rank_->programs()->Get(uint32_t(p));
        prog->name() && prog->name()->str() == name)
      compact = prog;
  if (!compact || !compact->pipeline() || compact->pipeline()->micro_batches() == micro_batches)
    return find(name);
  if (resized_program_ && resized_micro_batches_ == micro_batches && resized_name_ == name)
    return resized_program_;
  std::string e;
  fb::DetachedBuffer b = expand_pipeline_program(*compact, &e, micro_batches);
  if (!e.empty()) {
    if (error)
      *error = "rank " + std::to_string(rank_->rank()) + ", " + e;
    return nullptr;
  }
  resized_ = std::move(b);
  resized_program_ = fb::GetRoot<pl::Program>(resized_.data());
  resized_micro_batches_ = micro_batches;
  resized_name_ = name;
  return resized_program_;
}

const pl::Program *RankPrograms::find(const std::string &name) const {
  for (const pl::Program *p : programs_)
    if (p->name() && p->name()->str() == name)
      return p;
  return nullptr;
}

} // namespace mt::rt
