// Replaying a plan's inter-stage communication under NCCL's rules (see
// comm_order.h).
#include "runtime/comm/comm_order.h"

#include "runtime/comm/parallel_groups.h"
#include "runtime/plan/pipeline_expand.h"
#include "runtime/plan/plan_reader.h"

#include <map>
#include <set>
#include <utility>

namespace mt::rt {
namespace pl = mt::plan;

namespace {

// Groups whose members sit in different pipeline stages.
bool spans_stages(int64_t group) {
  return group == int64_t(Group::PP) || group == int64_t(Group::MP);
}

std::string stage_name(int s) { return "stage " + std::to_string(s); }

std::string op_text(const CommOp &op) {
  return std::string(op.send ? "send to " : "receive from ") + stage_name(op.peer) + " (tag " +
         std::to_string(op.tag) + ", " + std::to_string(op.bytes) + " bytes)";
}

const char *group_text(int group) {
  return group == int(Group::PP) ? "pipeline" : group == int(Group::MP) ? "model-parallel" : "?";
}

} // namespace

bool issued_as_p2p(const pl::Instruction &ins) {
  return (ins.op() == pl::Opcode::SEND || ins.op() == pl::Opcode::RECV) && ins.gpu() &&
         ins.gpu()->size() == 1 && ins.gpu()->Get(0)->kind() == pl::GpuStepKind::NATIVE;
}

int native_collective_group(const pl::Instruction &ins) {
  switch (ins.op()) {
  case pl::Opcode::ALL_REDUCE:
  case pl::Opcode::SEQ_ALL_GATHER:
  case pl::Opcode::SEQ_REDUCE_SCATTER:
  case pl::Opcode::ALL_REDUCE_GRADS:
  case pl::Opcode::REDUCE_GRADS:
  case pl::Opcode::ALL_GATHER_PARAMS:
    return ins.ints() && ins.ints()->size() > 0 ? int(ins.ints()->Get(0)) : -1;
  default:
    return -1;
  }
}

namespace {

int64_t int_at(const pl::Instruction &ins, uint32_t k) {
  return ins.ints() && ins.ints()->size() > k ? ins.ints()->Get(k) : int64_t(0);
}

// The events of one run of an instruction that is not a SEND or RECV of an
// NCCL group: collectives over groups that span stages, and the tied
// gradient's exchange.
void other_events(const pl::Rank &rank, const pl::Instruction &ins, uint32_t i, int32_t mb,
                  std::vector<CommEvent> &events) {
  for (size_t k = 0; ins.gpu() && k < ins.gpu()->size(); ++k) {
    const pl::GpuStep &s = *ins.gpu()->Get(uint32_t(k));
    if (s.kind() == pl::GpuStepKind::ALL_REDUCE && spans_stages(s.group())) {
      const uint64_t element = s.element() == pl::ReduceElement::F64 ? 8 : 4;
      events.push_back({CommEvent::COLLECTIVE, {}, s.group(), s.count() * element, i, mb});
    } else if (s.kind() == pl::GpuStepKind::NATIVE) {
      switch (ins.op()) {
      case pl::Opcode::ALL_REDUCE_TIED_GRAD: {
        // Its send and receive are one group (GpuExecutor::native).
        const int peer = int(int_at(ins, 0));
        const pl::Param &param = *rank.params()->Get(ins.params()->Get(0));
        const uint64_t bytes = uint64_t(element_count(param.shape())) * 4;
        events.push_back(
            {CommEvent::P2P,
             {{true, peer, int_at(ins, 1), bytes}, {false, peer, int_at(ins, 1), bytes}},
             -1, 0, i, mb});
        break;
      }
      default:
        if (const int g = native_collective_group(ins); g >= 0 && spans_stages(g))
          events.push_back({CommEvent::COLLECTIVE, {}, g, 0, i, mb});
        break;
      }
    }
  }
}

bool has_other_events(const pl::Rank &rank, const pl::Instruction &ins) {
  std::vector<CommEvent> events;
  other_events(rank, ins, 0, -1, events);
  return !events.empty();
}

// Events in stream order: a run of adjacent SENDs and RECVs is one group
// (GpuExecutor::run_steps).
struct EventStream {
  const pl::Rank &rank;
  const pl::Program &program;
  std::vector<CommEvent> events;
  bool in_group = false;

  void p2p(const pl::Instruction &ins, uint32_t i, int32_t mb, int64_t tag_add) {
    if (!in_group)
      events.push_back({CommEvent::P2P, {}, -1, 0, i, mb});
    in_group = true;
    const bool send = ins.op() == pl::Opcode::SEND;
    const uint32_t v = send ? ins.in()->Get(0) : ins.out()->Get(0);
    events.back().ops.push_back({send, int(int_at(ins, 0)), int_at(ins, 1) + tag_add,
                                 plan_bytes(*program.values()->Get(v))});
  }
  void other(const pl::Instruction &ins, uint32_t i, int32_t mb) {
    in_group = false;
    other_events(rank, ins, i, mb, events);
  }
};

} // namespace

std::vector<CommEvent> comm_events(const pl::Rank &rank, const pl::Program &program) {
  EventStream out{rank, program, {}, false};
  const auto *insts = program.instructions();
  const pl::PipelineSchedule *ps = program.pipeline();
  if (!ps) {
    for (uint32_t i = 0; insts && i < insts->size(); ++i) {
      const pl::Instruction &ins = *insts->Get(i);
      if (issued_as_p2p(ins))
        out.p2p(ins, i, ins.micro_batch(), 0);
      else
        out.other(ins, i, ins.micro_batch());
    }
    return std::move(out.events);
  }

  // A compact step: per segment, the instructions that communicate, and
  // those between them that end an NCCL group (a run of them as one entry
  // when every micro-batch runs them).
  std::vector<ScheduledSegment> order;
  if (!check_pipeline_schedule(program, &order).empty())
    return {};
  enum Kind : uint8_t { P2P, OTHER, BREAK };
  struct Entry {
    uint32_t instruction;
    Kind kind;
    pl::MicroBatches runs_in;
  };
  const auto *segs = ps->segments();
  std::vector<std::vector<Entry>> entries(segs ? segs->size() : 0);
  for (size_t k = 0; k < entries.size(); ++k) {
    const pl::Segment &seg = *segs->Get(uint32_t(k));
    std::vector<Entry> &list = entries[k];
    for (uint32_t i = seg.begin(); i < seg.end(); ++i) {
      const pl::Instruction &ins = *insts->Get(i);
      const Kind kind = issued_as_p2p(ins) ? P2P : has_other_events(rank, ins) ? OTHER : BREAK;
      if (kind == BREAK && ins.runs_in() == pl::MicroBatches::ALL && !list.empty() &&
          list.back().kind == BREAK && list.back().runs_in == pl::MicroBatches::ALL)
        continue;
      list.push_back({i, kind, ins.runs_in()});
    }
  }
  const int64_t last = ps->micro_batches() - 1, stride = ps->tag_stride();
  for (const ScheduledSegment &s : order) {
    const int64_t mb = s.micro_batch;
    for (const Entry &e : entries[size_t(s.segment)]) {
      if (e.runs_in != pl::MicroBatches::ALL &&
          !(e.runs_in == pl::MicroBatches::FIRST && mb == 0) &&
          !(e.runs_in == pl::MicroBatches::LAST && mb == last))
        continue;
      const pl::Instruction &ins = *insts->Get(e.instruction);
      if (e.kind == P2P)
        out.p2p(ins, e.instruction, int32_t(mb), mb * stride);
      else if (e.kind == OTHER)
        out.other(ins, e.instruction, int32_t(mb));
      else
        out.in_group = false;
    }
  }
  return std::move(out.events);
}

std::string check_comm_events(const std::vector<std::vector<CommEvent>> &events,
                              const std::function<std::string(int, const CommEvent &)> &where) {
  const int stages = int(events.size());
  struct At {
    int stage;
    size_t event, op;
  };
  auto at_text = [&](const At &a) {
    return stage_name(a.stage) + "'s " + where(a.stage, events[a.stage][a.event]);
  };

  // Messages pair by order between each ordered pair of stages.
  std::map<std::pair<int, int>, std::vector<At>> sends, receives;
  for (int s = 0; s < stages; ++s)
    for (size_t e = 0; e < events[s].size(); ++e)
      for (size_t o = 0; o < events[s][e].ops.size(); ++o) {
        const CommOp &op = events[s][e].ops[o];
        if (op.peer < 0 || op.peer >= stages || op.peer == s)
          return at_text({s, e, o}) + " exchanges with " + stage_name(op.peer) + " of " +
                 std::to_string(stages);
        (op.send ? sends[{s, op.peer}] : receives[{op.peer, s}]).push_back({s, e, o});
      }
  std::vector<std::vector<std::vector<At>>> partner(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    partner[s].resize(events[s].size());
    for (size_t e = 0; e < events[s].size(); ++e)
      partner[s][e].resize(events[s][e].ops.size());
  }
  std::set<std::pair<int, int>> pairs;
  for (const auto *m : {&sends, &receives})
    for (const auto &kv : *m)
      pairs.insert(kv.first);
  for (const std::pair<int, int> &pair : pairs) {
    const auto [from, to] = pair;
    const std::vector<At> &out = sends[pair], &in = receives[pair];
    if (out.size() != in.size())
      return stage_name(from) + " sends " + std::to_string(out.size()) + " messages to " +
             stage_name(to) + ", which receives " + std::to_string(in.size()) + " from it";
    for (size_t k = 0; k < out.size(); ++k) {
      const CommOp &a = events[from][out[k].event].ops[out[k].op];
      const CommOp &b = events[to][in[k].event].ops[in[k].op];
      if (a.tag != b.tag || a.bytes != b.bytes)
        return "message " + std::to_string(k + 1) + " from " + stage_name(from) + " to " +
               stage_name(to) + ": " + at_text(out[k]) + " sends tag " + std::to_string(a.tag) +
               " (" + std::to_string(a.bytes) + " bytes) where " + at_text(in[k]) +
               " receives tag " + std::to_string(b.tag) + " (" + std::to_string(b.bytes) +
               " bytes); NCCL pairs messages by order";
      partner[from][out[k].event][out[k].op] = in[k];
      partner[to][in[k].event][in[k].op] = out[k];
    }
  }

  // Collectives pair by order within their group; every stage is a member.
  std::vector<std::vector<size_t>> ordinal(static_cast<size_t>(stages));
  std::map<int, std::vector<std::vector<size_t>>> byGroup; // group -> stage -> events
  for (int s = 0; s < stages; ++s) {
    ordinal[s].assign(events[s].size(), 0);
    for (size_t e = 0; e < events[s].size(); ++e)
      if (events[s][e].kind == CommEvent::COLLECTIVE) {
        auto &list = byGroup[events[s][e].group];
        list.resize(size_t(stages));
        ordinal[s][e] = list[s].size();
        list[s].push_back(e);
      }
  }
  for (const auto &[group, list] : byGroup)
    for (int s = 1; s < stages; ++s) {
      if (list[s].size() != list[0].size())
        return stage_name(0) + " takes part in " + std::to_string(list[0].size()) +
               " collectives over the " + group_text(group) + " group and " + stage_name(s) +
               " in " + std::to_string(list[s].size());
      for (size_t k = 0; k < list[0].size(); ++k) {
        const uint64_t a = events[0][list[0][k]].bytes, b = events[s][list[s][k]].bytes;
        if (a != b)
          return "collective " + std::to_string(k + 1) + " over the " + group_text(group) +
                 " group: " + at_text({0, list[0][k], 0}) + " reduces " + std::to_string(a) +
                 " bytes and " + at_text({s, list[s][k], 0}) + " " + std::to_string(b);
      }
    }

  // The replay: each stage at its next event; an operation completes when
  // its partner is posted, an event when all its operations have.
  std::vector<size_t> pos(static_cast<size_t>(stages), 0);
  std::vector<std::vector<std::vector<char>>> done(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    done[s].resize(events[s].size());
    for (size_t e = 0; e < events[s].size(); ++e)
      done[s][e].assign(events[s][e].ops.size(), 0);
  }
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < stages; ++s) {
      if (pos[s] >= events[s].size())
        continue;
      const size_t e = pos[s];
      const CommEvent &ev = events[s][e];
      if (ev.kind == CommEvent::P2P) {
        bool all = true;
        for (size_t o = 0; o < ev.ops.size(); ++o) {
          if (done[s][e][o])
            continue;
          const At &p = partner[s][e][o];
          if (pos[p.stage] == p.event)
            done[s][e][o] = done[p.stage][p.event][p.op] = 1;
          else
            all = false;
        }
        if (all) {
          ++pos[s];
          progress = true;
        }
        continue;
      }
      bool all = true;
      const auto &list = byGroup[ev.group];
      for (int t = 0; t < stages && all; ++t)
        all = pos[t] < events[t].size() && events[t][pos[t]].kind == CommEvent::COLLECTIVE &&
              events[t][pos[t]].group == ev.group && list[t][ordinal[s][e]] == pos[t];
      if (all) {
        for (int t = 0; t < stages; ++t)
          ++pos[t];
        progress = true;
      }
    }
  }
  std::string waits;
  for (int s = 0; s < stages; ++s) {
    if (pos[s] >= events[s].size())
      continue;
    const CommEvent &ev = events[s][pos[s]];
    waits += waits.empty() ? "" : "; ";
    waits += at_text({s, pos[s], 0}) + " waits to ";
    if (ev.kind == CommEvent::COLLECTIVE) {
      waits += std::string("reduce over the ") + group_text(ev.group) + " group";
      continue;
    }
    std::string pending;
    for (size_t o = 0; o < ev.ops.size(); ++o)
      if (!done[s][pos[s]][o])
        pending += (pending.empty() ? "" : " and ") + op_text(ev.ops[o]);
    waits += pending;
  }
  if (waits.empty())
    return "";
  return "the stages would wait on each other for ever: " + waits +
         " (each stage's GPU stream runs its communication in program order, and NCCL "
         "completes a message only while both ends are posted)";
}

std::string check_comm_order(const pl::Plan &plan) {
  const int pp = plan.pipeline_parallel();
  if (pp <= 1 || !plan.ranks())
    return "";
  std::vector<const pl::Rank *> stage(size_t(pp), nullptr);
  for (const pl::Rank *r : *plan.ranks())
    if (r->tp_rank() == 0 && r->dp_rank() == 0 && r->pp_rank() >= 0 && r->pp_rank() < pp)
      stage[size_t(r->pp_rank())] = r;
  for (int s = 0; s < pp; ++s)
    if (!stage[s] || !stage[s]->programs())
      return "the plan has no rank for pipeline stage " + std::to_string(s);
  const auto &first = *stage[0]->programs();
  for (uint32_t p = 0; p < first.size(); ++p) {
    const std::string name = first.Get(p)->name() ? first.Get(p)->name()->str() : "";
    std::vector<const pl::Program *> progs;
    std::vector<std::vector<CommEvent>> events;
    for (int s = 0; s < pp; ++s) {
      const pl::Program *prog = nullptr;
      for (const pl::Program *q : *stage[s]->programs())
        if (q->name() && q->name()->str() == name)
          prog = q;
      if (!prog)
        return "program " + name + " is missing from pipeline stage " + std::to_string(s);
      std::vector<ScheduledSegment> order;
      if (prog->pipeline())
        if (std::string e = check_pipeline_schedule(*prog, &order); !e.empty())
          return "program " + name + " of pipeline stage " + std::to_string(s) + ": " + e;
      progs.push_back(prog);
      events.push_back(comm_events(*stage[s], *prog));
    }
    auto where = [&](int s, const CommEvent &e) {
      std::string at = instruction_label(*progs[s]->instructions()->Get(e.instruction),
                                         e.instruction);
      return e.micro_batch >= 0 ? at + " of micro-batch " + std::to_string(e.micro_batch) : at;
    };
    if (std::string e = check_comm_events(events, where); !e.empty())
      return "program " + name + ": " + e;
  }
  return "";
}

} // namespace mt::rt
