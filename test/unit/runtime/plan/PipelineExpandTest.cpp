// A pipelined train_step's compact form and its expansion
// (runtime/plan/pipeline_expand.h): Megatron-LM's orders written out by
// hand (schedules.py), compact programs built here expanded and compared
// with listings written out by hand, and the communication a compact
// program issues (comm_order.h) against that of its expansion.
#include "runtime/base/pipeline_order.h"
#include "runtime/comm/comm_order.h"
#include "runtime/plan/pipeline_expand.h"
#include "runtime/plan/plan_reader.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

namespace {

namespace pl = mt::plan;
namespace fb = flatbuffers;
using mt::rt::ScheduledSegment;
using mt::rt::SegmentKey;
using mt::rt::SegmentPart;

// ---------------------------------------------------------------------------
// Megatron's orders. A step is written F<micro-batch> / B<micro-batch>, with
// c<chunk> when there are several chunks; exchange segments get r (receive),
// c (compute) or s (send) in front.

std::string key_text(const SegmentKey &k, int64_t mb, int64_t vp) {
  const char *part[] = {"", "r", "c", "s"};
  return std::string(part[int(k.part)]) + (k.forward ? "F" : "B") + std::to_string(mb) +
         (vp > 1 ? "c" + std::to_string(k.chunk) : "");
}

std::string order_text(int64_t pp, int64_t vp, int64_t rank, int64_t m,
                       const std::vector<SegmentKey> &keys) {
  std::string error;
  std::vector<ScheduledSegment> order = mt::rt::expand_pipeline(pp, vp, rank, m, keys, &error);
  if (!error.empty())
    return "error: " + error;
  std::string s;
  for (const ScheduledSegment &x : order)
    s += (s.empty() ? "" : " ") + key_text(keys[size_t(x.segment)], x.micro_batch, vp);
  return s;
}

std::vector<SegmentKey> whole_steps() {
  return {{true, 0, SegmentPart::All}, {false, 0, SegmentPart::All}};
}

std::vector<SegmentKey> compute_only(int64_t vp) {
  std::vector<SegmentKey> keys;
  for (int64_t c = 0; c < vp; ++c)
    for (bool f : {true, false})
      keys.push_back({f, c, SegmentPart::Compute});
  return keys;
}

// forward_backward_pipelining_without_interleaving: pp - rank - 1 warm-up
// forwards (at most m), then forward and backward in turn, then the rest of
// the backwards.
TEST(PipelineOrder, OneFOneBIsMegatrons) {
  EXPECT_EQ(order_text(2, 1, 0, 4, whole_steps()), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(order_text(2, 1, 1, 4, whole_steps()), "F0 B0 F1 B1 F2 B2 F3 B3");
  EXPECT_EQ(order_text(4, 1, 1, 6, whole_steps()), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  EXPECT_EQ(order_text(4, 1, 0, 2, whole_steps()), "F0 F1 B0 B1");
  EXPECT_EQ(order_text(4, 1, 3, 1, whole_steps()), "F0 B0");
}

// forward_backward_pipelining_with_interleaving (microbatch_group_size_per_
// vp_stage = pp): virtual micro-batch k is micro-batch (k / (pp vp)) pp +
// k % pp on chunk (k % (pp vp)) / pp; (pp - rank - 1) 2 + (vp - 1) pp
// warm-up forwards, then forward k + warm-up with backward k (chunk
// reversed), then the remaining backwards.
TEST(PipelineOrder, InterleavedIsMegatrons) {
  EXPECT_EQ(order_text(2, 2, 0, 4, compute_only(2)),
            "cF0c0 cF1c0 cF0c1 cF1c1 "                 // warm-up: 4
            "cF2c0 cB0c1 cF3c0 cB1c1 cF2c1 cB0c0 cF3c1 cB1c0 " // steady
            "cB2c1 cB3c1 cB2c0 cB3c0");
  EXPECT_EQ(order_text(2, 2, 1, 4, compute_only(2)),
            "cF0c0 cF1c0 "                                        // warm-up: 2
            "cF0c1 cB0c1 cF1c1 cB1c1 cF2c0 cB0c0 cF3c0 cB1c0 cF2c1 cB2c1 cF3c1 cB3c1 "
            "cB2c0 cB3c0");
  // As many micro-batches as stages: Megatron-Core 0.16 warms up
  // (pp - rank - 1) * 2 + (vp - 1) * pp virtual steps, all of them only
  // when that reaches the end (rank 0), so the last rank runs two pairs.
  EXPECT_EQ(order_text(2, 2, 0, 2, compute_only(2)),
            "cF0c0 cF1c0 cF0c1 cF1c1 cB0c1 cB1c1 cB0c0 cB1c0");
  EXPECT_EQ(order_text(2, 2, 1, 2, compute_only(2)),
            "cF0c0 cF1c0 cF0c1 cB0c1 cF1c1 cB1c1 cB0c0 cB1c0");
  // pp 2, 3 chunks, 4 micro-batches, rank 0: warm-up 2 + 2 x 2 = 6.
  EXPECT_EQ(order_text(2, 3, 0, 4, compute_only(3)),
            "cF0c0 cF1c0 cF0c1 cF1c1 cF0c2 cF1c2 "
            "cF2c0 cB0c2 cF3c0 cB1c2 cF2c1 cB0c1 cF3c1 cB1c1 cF2c2 cB0c0 cF3c2 cB1c0 "
            "cB2c2 cB3c2 cB2c1 cB3c1 cB2c0 cB3c0");
}

// Megatron exchanges after each unit of the interleaved schedule: the
// unit's sends with the next unit's receives. A (forward or backward,
// chunk, part) without a segment is skipped: on the last stage, the last
// chunk's forward sends nothing and its backward receives nothing.
TEST(PipelineOrder, InterleavedExchangesAfterEachUnit) {
  std::vector<SegmentKey> keys;
  for (int64_t c : {0, 1})
    for (bool f : {true, false})
      for (SegmentPart p : {SegmentPart::Recv, SegmentPart::Compute, SegmentPart::Send})
        keys.push_back({f, c, p});
  EXPECT_EQ(order_text(2, 2, 1, 4, keys),
            "rF0c0 "
            "cF0c0 sF0c0 rF1c0 "
            "cF1c0 sF1c0 rF0c1 rB0c1 "
            "cF0c1 cB0c1 sF0c1 sB0c1 rF1c1 rB1c1 "
            "cF1c1 cB1c1 sF1c1 sB1c1 rF2c0 rB0c0 "
            "cF2c0 cB0c0 sF2c0 sB0c0 rF3c0 rB1c0 "
            "cF3c0 cB1c0 sF3c0 sB1c0 rF2c1 rB2c1 "
            "cF2c1 cB2c1 sF2c1 sB2c1 rF3c1 rB3c1 "
            "cF3c1 cB3c1 sF3c1 sB3c1 rB2c0 "
            "cB2c0 sB2c0 rB3c0 "
            "cB3c0 sB3c0");
}

TEST(PipelineOrder, Errors) {
  auto err = [](int64_t pp, int64_t vp, int64_t rank, int64_t m, std::vector<SegmentKey> keys) {
    std::string e = order_text(pp, vp, rank, m, keys);
    EXPECT_EQ(e.rfind("error: ", 0), 0u) << e;
    return e;
  };
  EXPECT_EQ(err(1, 1, 0, 4, whole_steps()),
            "error: a pipeline schedule needs stages >= 2, chunks >= 1, 0 <= rank < stages and "
            "micro-batches >= 1 (stages 1, chunks 1, rank 0, micro-batches 4)");
  EXPECT_NE(err(2, 1, 2, 4, whole_steps()).find("rank 2"), std::string::npos);
  EXPECT_NE(err(2, 1, 0, 0, whole_steps()).find("micro-batches 0"), std::string::npos);
  EXPECT_NE(err(2, 0, 0, 4, whole_steps()).find("chunks 0"), std::string::npos);
  EXPECT_EQ(err(2, 2, 0, 3, compute_only(2)),
            "error: the interleaved schedule needs the micro-batch count (3) to be a multiple "
            "of the stage count (2)");
  EXPECT_EQ(err(2, 1, 0, 4, {{true, 1, SegmentPart::All}}),
            "error: segment 0 names chunk 1 of 1");
  EXPECT_EQ(err(2, 1, 0, 4, {{true, 0, SegmentPart::Compute}}),
            "error: segment 0 splits a 1F1B step into exchanges");
  EXPECT_EQ(err(2, 2, 0, 4, {{true, 0, SegmentPart::All}}),
            "error: segment 0 is a whole step in an interleaved schedule");
  EXPECT_EQ(err(2, 1, 0, 4, {{true, 0, SegmentPart::All}, {true, 0, SegmentPart::All}}),
            "error: segments 0 and 1 are the same part of the same step");
}

// A batch ramp-up runs steps of fewer micro-batches inside the memory planned
// for the full count, which holds when the shorter step is the full one
// with the later micro-batches' segments left out, order kept. Megatron's
// schedules have that property for every count they accept (interleaved:
// multiples of pp): checked over every rank of small layouts, with the
// interleaved exchange segments.
TEST(PipelineOrder, ShorterStepsAreTheFullStepRestricted) {
  std::vector<SegmentKey> exchanges;
  for (int64_t c = 0; c < 3; ++c)
    for (bool f : {true, false})
      for (SegmentPart p : {SegmentPart::Recv, SegmentPart::Compute, SegmentPart::Send})
        exchanges.push_back({f, c, p});
  int checked = 0;
  for (int64_t pp = 2; pp <= 5; ++pp)
    for (int64_t vp = 1; vp <= 3; ++vp) {
      std::vector<SegmentKey> keys;
      if (vp == 1)
        keys = whole_steps();
      else
        for (const SegmentKey &k : exchanges)
          if (k.chunk < vp)
            keys.push_back(k);
      const int64_t unit = vp > 1 ? pp : 1;
      for (int64_t rank = 0; rank < pp; ++rank)
        for (int64_t m = unit; m <= 5 * unit; m += unit) {
          std::string error;
          const auto full = mt::rt::expand_pipeline(pp, vp, rank, m, keys, &error);
          ASSERT_EQ(error, "");
          for (int64_t fewer = unit; fewer < m; fewer += unit) {
            const auto part = mt::rt::expand_pipeline(pp, vp, rank, fewer, keys, &error);
            ASSERT_EQ(error, "");
            EXPECT_EQ(mt::rt::check_restriction(full, part, fewer), "")
                << "pp " << pp << " vp " << vp << " rank " << rank << " m " << m << " fewer "
                << fewer;
            ++checked;
          }
        }
    }
  // Per layout and rank, 0 + 1 + 2 + 3 + 4 shorter counts.
  EXPECT_EQ(checked, 10 * (2 + 3 + 4 + 5) * 3);
}

TEST(PipelineOrder, RestrictionMismatchesAreNamed) {
  using S = ScheduledSegment;
  const std::vector<S> full = {{0, 0}, {0, 1}, {1, 0}, {0, 2}, {1, 1}, {1, 2}};
  EXPECT_EQ(mt::rt::check_restriction(full, {{0, 0}, {0, 1}, {1, 0}, {1, 1}}, 2), "");
  EXPECT_EQ(mt::rt::check_restriction(full, {{0, 0}, {1, 0}, {0, 1}, {1, 1}}, 2),
            "the step of 2 micro-batches runs segment 1 of micro-batch 0 at its position 1, "
            "where the longer step runs segment 0 of micro-batch 1");
  EXPECT_EQ(mt::rt::check_restriction(full, {{0, 0}, {0, 1}, {1, 0}}, 2),
            "the step of 2 micro-batches ends after 3 segments, before the longer step's "
            "segment 1 of micro-batch 1");
  EXPECT_EQ(mt::rt::check_restriction(full, {{0, 0}, {0, 1}, {1, 0}, {1, 1}, {1, 1}}, 2),
            "the step of 2 micro-batches runs 5 segments, the longer step 4 for its "
            "micro-batches");
}

// ---------------------------------------------------------------------------
// Compact programs built here.

struct Val {
  std::string name;
  pl::Region region = pl::Region::ARENA;
  uint64_t offset = 0;
  std::vector<uint64_t> slots; // slot_offsets; empty: none
  std::vector<int64_t> shape = {2, 8};
};

struct Ins {
  pl::Opcode op;
  std::vector<uint32_t> in, out, params;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::string where;
  pl::MicroBatches runs_in = pl::MicroBatches::ALL;
  bool gemm = false; // a GEMM step over in[0], WEIGHT 0 and out[0]
  bool native = false; // one NATIVE step (SEND, RECV, collectives)
};

struct Seg {
  uint32_t begin, end;
  int chunk;
  bool forward;
  pl::SegmentPart part;
};

struct Compact {
  std::vector<Val> values;
  std::vector<Ins> code;
  std::vector<uint32_t> inputs, outputs;
  std::vector<std::string> input_names, output_names;
  int stages = 2, chunks = 1, rank = 0, micro_batches = 4;
  int64_t tag_stride = 100;
  std::vector<Seg> segments;
};

fb::Offset<pl::Program> build(fb::FlatBufferBuilder &b, const Compact &c) {
  std::vector<fb::Offset<pl::Value>> values;
  for (const Val &v : c.values)
    values.push_back(pl::CreateValueDirect(b, v.name.c_str(), v.region, v.offset, &v.shape,
                                           pl::DType::F32, v.slots.empty() ? nullptr : &v.slots));
  std::vector<fb::Offset<pl::Instruction>> code;
  for (const Ins &i : c.code) {
    std::vector<fb::Offset<pl::GpuStep>> gpu;
    if (i.gemm) {
      std::vector<pl::GpuArg> args = {{pl::GpuArgKind::VALUE, i.in[0]},
                                      {pl::GpuArgKind::WEIGHT, 0},
                                      {pl::GpuArgKind::VALUE, i.out[0]}};
      auto g = pl::CreateGemm(b, 8, 2, 8, true, false, 8, 8, 8, pl::DType::F32, pl::DType::BF16,
                              pl::DType::F32, true, pl::GemmEpilogue::BIAS, pl::DType::F16, 3, 5,
                              7, 9);
      gpu.push_back(pl::CreateGpuStepDirect(b, pl::GpuStepKind::GEMM, -1, &args, g));
    }
    if (i.native)
      gpu.push_back(pl::CreateGpuStep(b, pl::GpuStepKind::NATIVE));
    code.push_back(pl::CreateInstructionDirect(b, i.op, &i.in, &i.out, &i.params, &i.ints,
                                               &i.floats, i.where.c_str(), -1,
                                               gpu.empty() ? nullptr : &gpu, i.runs_in));
  }
  std::vector<pl::Segment> segs;
  for (const Seg &s : c.segments)
    segs.push_back(pl::Segment(s.begin, s.end, s.chunk, s.forward, s.part));
  auto schedule = pl::CreatePipelineScheduleDirect(b, c.stages, c.chunks, c.rank,
                                                   c.micro_batches, c.tag_stride, &segs);
  std::vector<fb::Offset<fb::String>> in_names, out_names;
  for (const std::string &s : c.input_names)
    in_names.push_back(b.CreateString(s));
  for (const std::string &s : c.output_names)
    out_names.push_back(b.CreateString(s));
  return pl::CreateProgramDirect(b, "train_step", &values, &c.inputs, &in_names, &c.outputs,
                                 &out_names, &code, 0, schedule);
}

struct Built {
  fb::DetachedBuffer compact;
  const pl::Program &program() const { return *fb::GetRoot<pl::Program>(compact.data()); }
};

Built built(const Compact &c) {
  fb::FlatBufferBuilder b;
  b.Finish(build(b, c));
  return {b.Release()};
}

// One line per instruction of an expanded program: "where/micro-batch",
// then its operands, its tag (SEND, RECV) and its GPU steps' VALUE args.
std::vector<std::string> listing(const pl::Program &p) {
  std::vector<std::string> out;
  for (const pl::Instruction *ins : *p.instructions()) {
    std::string s = ins->where()->str() + "/" + std::to_string(ins->micro_batch());
    auto list = [&](const char *what, const fb::Vector<uint32_t> *v) {
      if (!v || v->size() == 0)
        return;
      s += std::string(" ") + what + " ";
      for (uint32_t k = 0; k < v->size(); ++k)
        s += (k ? "," : "") + std::to_string(v->Get(k));
    };
    list("in", ins->in());
    list("out", ins->out());
    if (ins->op() == pl::Opcode::SEND || ins->op() == pl::Opcode::RECV)
      s += " tag " + std::to_string(ins->ints()->Get(1));
    for (size_t k = 0; ins->gpu() && k < ins->gpu()->size(); ++k)
      if (const pl::GpuStep *g = ins->gpu()->Get(uint32_t(k)); g->args())
        for (const pl::GpuArg *a : *g->args())
          if (a->kind() == pl::GpuArgKind::VALUE)
            s += " v" + std::to_string(a->index());
    out.push_back(s);
  }
  return out;
}

std::vector<std::string> split(const std::string &text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    out.push_back(text.substr(at, end - at));
    at = end == std::string::npos ? text.size() : end + 1;
  }
  return out;
}

// Stage 0 of two, 1F1B, 4 micro-batches: the forward gathers the weights
// (first micro-batch only), multiplies the tokens into x (saved for the
// backward: 2 slots) and sends x on; the backward receives x's gradient,
// computes with x and reduces the gradients (last micro-batch only).
Compact one_f_one_b() {
  Compact c;
  c.values = {
      {"tokens", pl::Region::ARENA, 0, {0, 64, 128, 192}}, // 0: 4 slots (values 6, 7, 8)
      {"x", pl::Region::ARENA, 256, {256, 320}},           // 1: 2 slots (value 9)
      {"w", pl::Region::WEIGHT, 0, {}},                    // 2
      {"", pl::Region::ARENA, 384, {}},                    // 3: unused
      {"dy", pl::Region::ARENA, 448, {}},                  // 4
      {"dx", pl::Region::ARENA, 512, {}},                  // 5
  };
  c.inputs = {0};
  c.input_names = {"tokens"};
  c.code = {
      {pl::Opcode::ALL_GATHER_PARAMS, {}, {}, {}, {0, 0}, {}, "gather", pl::MicroBatches::FIRST,
       false, true},
      {pl::Opcode::MATMUL, {0, 2}, {1}, {}, {}, {}, "fc", pl::MicroBatches::ALL, true},
      {pl::Opcode::SEND, {1}, {}, {}, {1, 10}, {}, "send", pl::MicroBatches::ALL, false, true},
      {pl::Opcode::RECV, {}, {4}, {}, {1, 20}, {}, "recv", pl::MicroBatches::ALL, false, true},
      {pl::Opcode::MATMUL_INPUT_GRAD, {4, 2}, {5}, {}, {}, {}, "dgrad"},
      {pl::Opcode::MATMUL_WEIGHT_GRAD, {4, 1}, {}, {0}, {}, {}, "wgrad"},
      {pl::Opcode::REDUCE_GRADS, {}, {}, {}, {0, 0, 0}, {0.5}, "reduce", pl::MicroBatches::LAST,
       false, true},
  };
  c.segments = {{0, 3, 0, true, pl::SegmentPart::ALL}, {3, 7, 0, false, pl::SegmentPart::ALL}};
  return c;
}

TEST(PipelineExpand, OneFOneBStage) {
  Built b = built(one_f_one_b());
  std::string error;
  fb::DetachedBuffer buf = mt::rt::expand_pipeline_program(b.program(), &error);
  ASSERT_EQ(error, "");
  fb::Verifier verifier(buf.data(), buf.size());
  EXPECT_TRUE(verifier.VerifyBuffer<pl::Program>(nullptr));
  const pl::Program &p = *fb::GetRoot<pl::Program>(buf.data());
  // Rank 0 of 2, 4 micro-batches: F0 F1 B0 F2 B1 F3 B2 B3. tokens of
  // micro-batch m: 0, 6, 7, 8; x: 1 (even m) or 9 (odd m). Tags: 10 and
  // 20, plus 100 m.
  EXPECT_EQ(listing(p), split("gather/0\n"
                              "fc/0 in 0,2 out 1 v0 v1\n"
                              "send/0 in 1 tag 10\n"
                              "fc/1 in 6,2 out 9 v6 v9\n"
                              "send/1 in 9 tag 110\n"
                              "recv/0 out 4 tag 20\n"
                              "dgrad/0 in 4,2 out 5\n"
                              "wgrad/0 in 4,1\n"
                              "fc/2 in 7,2 out 1 v7 v1\n"
                              "send/2 in 1 tag 210\n"
                              "recv/1 out 4 tag 120\n"
                              "dgrad/1 in 4,2 out 5\n"
                              "wgrad/1 in 4,9\n"
                              "fc/3 in 8,2 out 9 v8 v9\n"
                              "send/3 in 9 tag 310\n"
                              "recv/2 out 4 tag 220\n"
                              "dgrad/2 in 4,2 out 5\n"
                              "wgrad/2 in 4,1\n"
                              "recv/3 out 4 tag 320\n"
                              "dgrad/3 in 4,2 out 5\n"
                              "wgrad/3 in 4,9\n"
                              "reduce/3"));
  // The unrolled form: values of slots after the program's own, inputs
  // per micro-batch, no schedule left.
  EXPECT_EQ(p.name()->str(), "train_step");
  EXPECT_EQ(p.unrolled_micro_batches(), 4);
  EXPECT_EQ(p.pipeline(), nullptr);
  ASSERT_EQ(p.values()->size(), 10u);
  const uint64_t offsets[10] = {0, 256, 0, 384, 448, 512, 64, 128, 192, 320};
  const char *names[10] = {"tokens", "x", "w", "", "dy", "dx",
                           "tokens@1", "tokens@2", "tokens@3", "x@1"};
  for (uint32_t v = 0; v < 10; ++v) {
    const pl::Value &val = *p.values()->Get(v);
    EXPECT_EQ(val.offset(), offsets[v]) << v;
    EXPECT_EQ(val.name() ? val.name()->str() : "", names[v]) << v;
    EXPECT_EQ(val.slot_offsets(), nullptr) << v;
    EXPECT_EQ(val.region(), v == 2 ? pl::Region::WEIGHT : pl::Region::ARENA) << v;
    EXPECT_EQ(mt::rt::element_count(val), 16) << v;
  }
  ASSERT_EQ(p.inputs()->size(), 4u);
  const uint32_t tokens[4] = {0, 6, 7, 8};
  for (uint32_t m = 0; m < 4; ++m) {
    EXPECT_EQ(p.inputs()->Get(m), tokens[m]);
    EXPECT_EQ(p.input_names()->Get(m)->str(), "tokens." + std::to_string(m));
  }
  EXPECT_EQ(p.outputs()->size(), 0u);
  // Every field of the instructions travels: attributes, runs_in ALL, the
  // GEMM's description.
  for (const pl::Instruction *ins : *p.instructions())
    EXPECT_EQ(ins->runs_in(), pl::MicroBatches::ALL);
  const pl::Instruction &reduce = *p.instructions()->Get(p.instructions()->size() - 1);
  EXPECT_EQ(reduce.op(), pl::Opcode::REDUCE_GRADS);
  EXPECT_EQ(reduce.ints()->size(), 3u);
  EXPECT_EQ(reduce.floats()->Get(0), 0.5);
  EXPECT_EQ(reduce.gpu()->Get(0)->kind(), pl::GpuStepKind::NATIVE);
  const pl::Instruction &wgrad = *p.instructions()->Get(7);
  EXPECT_EQ(wgrad.params()->Get(0), 0u);
  const pl::Instruction &fc = *p.instructions()->Get(3);
  const pl::GpuStep &step = *fc.gpu()->Get(0);
  EXPECT_EQ(step.kind(), pl::GpuStepKind::GEMM);
  EXPECT_EQ(step.kernel(), -1);
  EXPECT_EQ(step.args()->Get(1)->kind(), pl::GpuArgKind::WEIGHT);
  EXPECT_EQ(step.args()->Get(1)->index(), 0u);
  const pl::Gemm &g = *step.gemm();
  EXPECT_EQ(std::vector<int64_t>({g.m(), g.n(), g.k(), g.lda(), g.ldb(), g.ldd(), g.batch(),
                                  g.stride_a(), g.stride_b(), g.stride_d()}),
            std::vector<int64_t>({8, 2, 8, 8, 8, 8, 3, 5, 7, 9}));
  EXPECT_TRUE(g.trans_a() && !g.trans_b() && g.accumulate());
  EXPECT_EQ(g.b_type(), pl::DType::BF16);
  EXPECT_EQ(g.epilogue(), pl::GemmEpilogue::BIAS);
  EXPECT_EQ(g.bias_type(), pl::DType::F16);
  // Shared parts are stored once.
  EXPECT_EQ(p.instructions()->Get(1)->where(), fc.where());
  EXPECT_EQ(p.instructions()->Get(1)->gpu()->Get(0)->gemm(), step.gemm());
}

// Stage 1 of two, interleaved with two chunks, 4 micro-batches: one
// instruction per exchange segment; chunk 1's forward ends in the loss
// (no send) and its backward starts from the seed (no receive). h, the
// saved activation of chunk 0, has 3 slots; loss one per micro-batch.
Compact interleaved() {
  Compact c;
  c.chunks = 2;
  c.rank = 1;
  c.tag_stride = 10;
  c.values = {
      {"a0", pl::Region::ARENA, 0, {}},                   // 0
      {"h", pl::Region::ARENA, 64, {64, 128, 192}},       // 1: slots 10, 11
      {"a1", pl::Region::ARENA, 256, {}},                 // 2
      {"loss", pl::Region::ARENA, 320, {320, 384, 448, 512}, {}}, // 3: slots 12, 13, 14
      {"g1", pl::Region::ARENA, 576, {}},                 // 4
      {"g0", pl::Region::ARENA, 640, {}},                 // 5
      {"d0", pl::Region::ARENA, 704, {}},                 // 6
      {"w", pl::Region::WEIGHT, 0, {}},                   // 7
      {"", pl::Region::ARENA, 768, {}},                   // 8
      {"", pl::Region::ARENA, 832, {}},                   // 9
  };
  c.outputs = {3};
  c.output_names = {"loss"};
  c.code = {
      {pl::Opcode::RECV, {}, {0}, {}, {0, 1}, {}, "rF0", pl::MicroBatches::ALL, false, true},
      {pl::Opcode::ALL_GATHER_PARAMS, {}, {}, {}, {0, 0}, {}, "gather", pl::MicroBatches::FIRST,
       false, true},
      {pl::Opcode::ADD, {0, 0}, {1}, {}, {}, {}, "cF0"},
      {pl::Opcode::SEND, {1}, {}, {}, {0, 2}, {}, "sF0", pl::MicroBatches::ALL, false, true},
      {pl::Opcode::RECV, {}, {2}, {}, {0, 3}, {}, "rF1", pl::MicroBatches::ALL, false, true},
      {pl::Opcode::CROSS_ENTROPY, {2, 2}, {3}, {}, {0}, {}, "cF1"},
      {pl::Opcode::GRAD_SEED, {}, {4}, {}, {}, {1.0}, "cB1"},
      {pl::Opcode::SEND, {4}, {}, {}, {0, 4}, {}, "sB1", pl::MicroBatches::ALL, false, true},
      {pl::Opcode::RECV, {}, {5}, {}, {0, 5}, {}, "rB0", pl::MicroBatches::ALL, false, true},
      {pl::Opcode::ADD, {5, 1}, {6}, {}, {}, {}, "cB0", pl::MicroBatches::ALL, true},
      {pl::Opcode::REDUCE_GRADS, {}, {}, {}, {0, 0, 0}, {1.0}, "reduce", pl::MicroBatches::LAST,
       false, true},
      {pl::Opcode::SEND, {6}, {}, {}, {0, 6}, {}, "sB0", pl::MicroBatches::ALL, false, true},
  };
  using P = pl::SegmentPart;
  c.segments = {{0, 1, 0, true, P::RECV},  {1, 3, 0, true, P::COMPUTE},
                {3, 4, 0, true, P::SEND},  {4, 5, 1, true, P::RECV},
                {5, 6, 1, true, P::COMPUTE}, {6, 7, 1, false, P::COMPUTE},
                {7, 8, 1, false, P::SEND}, {8, 9, 0, false, P::RECV},
                {9, 11, 0, false, P::COMPUTE}, {11, 12, 0, false, P::SEND}};
  return c;
}

TEST(PipelineExpand, InterleavedStage) {
  Built b = built(interleaved());
  std::string error;
  fb::DetachedBuffer buf = mt::rt::expand_pipeline_program(b.program(), &error);
  ASSERT_EQ(error, "");
  fb::Verifier verifier(buf.data(), buf.size());
  EXPECT_TRUE(verifier.VerifyBuffer<pl::Program>(nullptr));
  const pl::Program &p = *fb::GetRoot<pl::Program>(buf.data());
  // InterleavedExchangesAfterEachUnit's order without the forward send and
  // backward receive of chunk 1; h of micro-batch m is 1, 10, 11, 1; loss
  // 3, 12, 13, 14; tags + 10 m.
  EXPECT_EQ(listing(p),
            split("rF0/0 out 0 tag 1\n"
                  "gather/0\n"
                  "cF0/0 in 0,0 out 1\n"
                  "sF0/0 in 1 tag 2\n"
                  "rF0/1 out 0 tag 11\n"
                  "cF0/1 in 0,0 out 10\n"
                  "sF0/1 in 10 tag 12\n"
                  "rF1/0 out 2 tag 3\n"
                  "cF1/0 in 2,2 out 3\n"
                  "cB1/0 out 4\n"
                  "sB1/0 in 4 tag 4\n"
                  "rF1/1 out 2 tag 13\n"
                  "cF1/1 in 2,2 out 12\n"
                  "cB1/1 out 4\n"
                  "sB1/1 in 4 tag 14\n"
                  "rF0/2 out 0 tag 21\n"
                  "rB0/0 out 5 tag 5\n"
                  "cF0/2 in 0,0 out 11\n"
                  "cB0/0 in 5,1 out 6 v5 v6\n"
                  "sF0/2 in 11 tag 22\n"
                  "sB0/0 in 6 tag 6\n"
                  "rF0/3 out 0 tag 31\n"
                  "rB0/1 out 5 tag 15\n"
                  "cF0/3 in 0,0 out 1\n"
                  "cB0/1 in 5,10 out 6 v5 v6\n"
                  "sF0/3 in 1 tag 32\n"
                  "sB0/1 in 6 tag 16\n"
                  "rF1/2 out 2 tag 23\n"
                  "cF1/2 in 2,2 out 13\n"
                  "cB1/2 out 4\n"
                  "sB1/2 in 4 tag 24\n"
                  "rF1/3 out 2 tag 33\n"
                  "cF1/3 in 2,2 out 14\n"
                  "cB1/3 out 4\n"
                  "sB1/3 in 4 tag 34\n"
                  "rB0/2 out 5 tag 25\n"
                  "cB0/2 in 5,11 out 6 v5 v6\n"
                  "sB0/2 in 6 tag 26\n"
                  "rB0/3 out 5 tag 35\n"
                  "cB0/3 in 5,1 out 6 v5 v6\n"
                  "reduce/3\n"
                  "sB0/3 in 6 tag 36"));
  ASSERT_EQ(p.outputs()->size(), 4u);
  const uint32_t loss[4] = {3, 12, 13, 14};
  for (uint32_t m = 0; m < 4; ++m) {
    EXPECT_EQ(p.outputs()->Get(m), loss[m]);
    EXPECT_EQ(p.output_names()->Get(m)->str(), "loss." + std::to_string(m));
    EXPECT_EQ(p.values()->Get(loss[m])->offset(), 320u + 64u * m);
  }
  EXPECT_EQ(p.values()->Get(11)->name()->str(), "h@2");
  EXPECT_EQ(p.values()->Get(11)->offset(), 192u);
}

// A batch ramp-up's smaller step: 2 of the 4 planned micro-batches run in
// the planned order restricted to them (InterleavedStage's listing without
// micro-batches 2 and 3), in the planned slots and tags; the gradient
// reduction runs after the last micro-batch of the two.
TEST(PipelineExpand, InterleavedStageForFewerMicroBatches) {
  Built b = built(interleaved());
  std::string error;
  fb::DetachedBuffer buf = mt::rt::expand_pipeline_program(b.program(), &error, 2);
  ASSERT_EQ(error, "");
  fb::Verifier verifier(buf.data(), buf.size());
  EXPECT_TRUE(verifier.VerifyBuffer<pl::Program>(nullptr));
  const pl::Program &p = *fb::GetRoot<pl::Program>(buf.data());
  EXPECT_EQ(p.unrolled_micro_batches(), 2);
  EXPECT_EQ(listing(p), split("rF0/0 out 0 tag 1\n"
                              "gather/0\n"
                              "cF0/0 in 0,0 out 1\n"
                              "sF0/0 in 1 tag 2\n"
                              "rF0/1 out 0 tag 11\n"
                              "cF0/1 in 0,0 out 10\n"
                              "sF0/1 in 10 tag 12\n"
                              "rF1/0 out 2 tag 3\n"
                              "cF1/0 in 2,2 out 3\n"
                              "cB1/0 out 4\n"
                              "sB1/0 in 4 tag 4\n"
                              "rF1/1 out 2 tag 13\n"
                              "cF1/1 in 2,2 out 12\n"
                              "cB1/1 out 4\n"
                              "sB1/1 in 4 tag 14\n"
                              "rB0/0 out 5 tag 5\n"
                              "cB0/0 in 5,1 out 6 v5 v6\n"
                              "sB0/0 in 6 tag 6\n"
                              "rB0/1 out 5 tag 15\n"
                              "cB0/1 in 5,10 out 6 v5 v6\n"
                              "reduce/1\n"
                              "sB0/1 in 6 tag 16"));
  ASSERT_EQ(p.outputs()->size(), 2u);
  EXPECT_EQ(p.outputs()->Get(0), 3u);
  EXPECT_EQ(p.outputs()->Get(1), 12u);
  EXPECT_EQ(p.output_names()->Get(1)->str(), "loss.1");
  EXPECT_EQ(p.values()->Get(12)->offset(), 384u);

  // Counts the schedule does not take, or the plan does not hold.
  auto refused = [&](int64_t m) {
    std::string e;
    EXPECT_EQ(mt::rt::expand_pipeline_program(b.program(), &e, m).size(), 0u);
    return e;
  };
  EXPECT_EQ(refused(3), "program train_step: the interleaved schedule needs the micro-batch "
                        "count (3) to be a multiple of the stage count (2)");
  EXPECT_EQ(refused(6), "program train_step: a step of 6 micro-batches from a schedule planned "
                        "for 4; the arena holds at most those");
}

std::string expand_error(const Compact &c) {
  Built b = built(c);
  std::string error;
  fb::DetachedBuffer buf = mt::rt::expand_pipeline_program(b.program(), &error);
  EXPECT_EQ(buf.size(), 0u);
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  return error;
}

TEST(PipelineExpand, InconsistentProgramsAreRefused) {
  {
    Compact c = one_f_one_b();
    c.segments[1].begin = 4;
    EXPECT_EQ(expand_error(c), "program train_step: pipeline.segments[1] begins at instruction "
                               "4; it must begin where segments[0] ends (3)");
  }
  {
    Compact c = one_f_one_b();
    c.segments[1].end = 6;
    EXPECT_EQ(expand_error(c), "program train_step: pipeline.segments cover instructions 0 to "
                               "6, but the program has 7; every instruction needs its segment");
  }
  {
    Compact c = one_f_one_b();
    c.segments[1].end = 9;
    EXPECT_EQ(expand_error(c), "program train_step: pipeline.segments[1] ends at instruction 9, "
                               "outside 3 to the program's 7 instructions");
  }
  {
    Compact c = one_f_one_b();
    c.segments[1].forward = true;
    EXPECT_EQ(expand_error(c), "program train_step: pipeline: segments 0 and 1 are the same "
                               "part of the same step");
  }
  {
    Compact c = one_f_one_b();
    c.values[0].slots.pop_back();
    EXPECT_EQ(expand_error(c),
              "program train_step: input 0 (%tokens) has 3 slot_offsets; a pipelined "
              "train_step's inputs and outputs need one per micro-batch (pipeline.micro_batches "
              "4)");
  }
  {
    Compact c = interleaved();
    c.values[3].slots.clear();
    EXPECT_EQ(expand_error(c),
              "program train_step: output 0 (%loss) has 0 slot_offsets; a pipelined "
              "train_step's inputs and outputs need one per micro-batch (pipeline.micro_batches "
              "4)");
  }
  {
    Compact c = one_f_one_b();
    c.values[1].slots[0] = 64;
    EXPECT_EQ(expand_error(c),
              "program train_step: value 1 (%x) has slot_offsets[0] 64, not its offset 256");
  }
  {
    Compact c = one_f_one_b();
    c.values[2].slots = {0, 1};
    EXPECT_EQ(expand_error(c),
              "program train_step: value 2 (%w) has slot_offsets but is not an arena value");
  }
  {
    Compact c = one_f_one_b();
    c.code[4].in[0] = 17;
    EXPECT_EQ(expand_error(c), "program train_step: #4 (dgrad) MATMUL_INPUT_GRAD: in[0] is value "
                               "17, but the program has 6 values");
  }
  {
    Compact c = one_f_one_b();
    c.code[2].ints = {1};
    EXPECT_EQ(expand_error(c),
              "program train_step: #2 (send) SEND: has 1 ints; SEND and RECV take peer and tag");
  }
  {
    Compact c = one_f_one_b();
    c.micro_batches = 3;
    c.chunks = 2;
    c.segments = {{0, 3, 0, true, pl::SegmentPart::COMPUTE},
                  {3, 7, 0, false, pl::SegmentPart::COMPUTE}};
    c.values[0].slots.pop_back();
    EXPECT_EQ(expand_error(c), "program train_step: pipeline: the interleaved schedule needs the "
                               "micro-batch count (3) to be a multiple of the stage count (2)");
  }
  {
    Compact c = one_f_one_b();
    c.rank = 2;
    EXPECT_EQ(expand_error(c), "program train_step: pipeline.rank 2 is not one of the 2 stages");
  }
  {
    Compact c = one_f_one_b();
    c.tag_stride = int64_t(1) << 62;
    EXPECT_EQ(expand_error(c),
              "program train_step: #2 (send) SEND: tag 10 + 3 x pipeline.tag_stride "
              "4611686018427387904 overflows");
  }
}

// A step of about a million instructions expands in about a second.
TEST(PipelineExpand, LargeStepsExpandFast) {
  Compact c;
  c.micro_batches = 1024;
  c.values = {{"tokens", pl::Region::ARENA, 0, {}}, {"x", pl::Region::ARENA, 64, {64, 128}}};
  for (int m = 0; m < 1024; ++m)
    c.values[0].slots.push_back(uint64_t(4096 + 64 * m));
  c.values[0].offset = c.values[0].slots[0];
  c.inputs = {0};
  c.input_names = {"tokens"};
  for (int i = 0; i < 1000; ++i)
    c.code.push_back({pl::Opcode::MATMUL, {0, 1}, {1}, {}, {}, {}, "layer " + std::to_string(i),
                      pl::MicroBatches::ALL, true});
  c.segments = {{0, 600, 0, true, pl::SegmentPart::ALL}, {600, 1000, 0, false, pl::SegmentPart::ALL}};
  Built b = built(c);
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  fb::DetachedBuffer buf = mt::rt::expand_pipeline_program(b.program(), &error);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(error, "");
  const pl::Program &p = *fb::GetRoot<pl::Program>(buf.data());
  EXPECT_EQ(p.instructions()->size(), 1024000u);
  EXPECT_EQ(p.values()->size(), 2u + 1023u + 1u);
  // The last instruction: micro-batch 1023's last backward instruction.
  const pl::Instruction &last = *p.instructions()->Get(1023999);
  EXPECT_EQ(last.micro_batch(), 1023);
  EXPECT_EQ(last.in()->Get(0), 2u + 1022u);
  EXPECT_EQ(last.in()->Get(1), 1025u);
  EXPECT_LT(s, 10.0) << "expanding 1,024,000 instructions took " << s << " s";
  RecordProperty("expand_seconds", std::to_string(s));
}

// ---------------------------------------------------------------------------
// Communication of a compact program and of its expansion.

std::vector<std::string> events_text(const pl::Program &p, const std::vector<mt::rt::CommEvent> &ev) {
  std::vector<std::string> out;
  for (const mt::rt::CommEvent &e : ev) {
    std::string s = (e.kind == mt::rt::CommEvent::P2P ? "p2p " : "collective ") +
                    p.instructions()->Get(e.instruction)->where()->str() + "/" +
                    std::to_string(e.micro_batch) + " group " + std::to_string(e.group) + " " +
                    std::to_string(e.bytes);
    for (const mt::rt::CommOp &op : e.ops)
      s += std::string(op.send ? " send " : " recv ") + std::to_string(op.peer) + " tag " +
           std::to_string(op.tag) + " " + std::to_string(op.bytes);
    out.push_back(s);
  }
  return out;
}

// Stage 1 of two for one_f_one_b: receive x, compute, send its gradient.
Compact one_f_one_b_last() {
  Compact c;
  c.rank = 1;
  c.values = {{"x", pl::Region::ARENA, 0, {0, 64}},
              {"loss", pl::Region::ARENA, 128, {128, 192, 256, 320}, {}},
              {"dx", pl::Region::ARENA, 384, {}}};
  c.outputs = {1};
  c.output_names = {"loss"};
  c.code = {
      {pl::Opcode::RECV, {}, {0}, {}, {0, 10}, {}, "recv", pl::MicroBatches::ALL, false, true},
      {pl::Opcode::CROSS_ENTROPY, {0, 0}, {1}, {}, {0}, {}, "loss"},
      {pl::Opcode::GRAD_SEED, {}, {2}, {}, {}, {1.0}, "seed"},
      {pl::Opcode::SEND, {2}, {}, {}, {0, 20}, {}, "send", pl::MicroBatches::ALL, false, true},
  };
  c.segments = {{0, 2, 0, true, pl::SegmentPart::ALL}, {2, 4, 0, false, pl::SegmentPart::ALL}};
  return c;
}

// A plan of two stages (no instructions checked: check_comm_order reads
// the programs' communication only).
fb::DetachedBuffer two_stage_plan(const Compact &s0, const Compact &s1, bool expand) {
  fb::FlatBufferBuilder b;
  std::vector<fb::Offset<pl::Rank>> ranks;
  int r = 0;
  for (const Compact *c : {&s0, &s1}) {
    std::vector<fb::Offset<pl::Program>> progs;
    if (expand) {
      Built one = built(*c);
      std::string e;
      fb::DetachedBuffer x = mt::rt::expand_pipeline_program(one.program(), &e);
      EXPECT_EQ(e, "");
      // Rebuild the expanded program inside this buffer: its fields, copied.
      const pl::Program &p = *fb::GetRoot<pl::Program>(x.data());
      std::vector<fb::Offset<pl::Value>> values;
      for (const pl::Value *v : *p.values())
        values.push_back(pl::CreateValue(b, 0, v->region(), v->offset(),
                                         b.CreateVector(v->shape()->data(), v->shape()->size())));
      std::vector<fb::Offset<pl::Instruction>> code;
      for (const pl::Instruction *i : *p.instructions()) {
        std::vector<fb::Offset<pl::GpuStep>> gpu;
        for (size_t k = 0; i->gpu() && k < i->gpu()->size(); ++k)
          gpu.push_back(pl::CreateGpuStep(b, i->gpu()->Get(uint32_t(k))->kind()));
        auto vec = [&](const fb::Vector<uint32_t> *v) {
          return v ? b.CreateVector(v->data(), v->size()) : fb::Offset<fb::Vector<uint32_t>>();
        };
        code.push_back(pl::CreateInstruction(
            b, i->op(), vec(i->in()), vec(i->out()), 0,
            i->ints() ? b.CreateVector(i->ints()->data(), i->ints()->size())
                      : fb::Offset<fb::Vector<int64_t>>(),
            0,
            b.CreateString(i->where()->str()), i->micro_batch(), b.CreateVector(gpu)));
      }
      progs.push_back(pl::CreateProgram(b, b.CreateString("train_step"), b.CreateVector(values),
                                        0, 0, 0, 0, b.CreateVector(code), 4));
    } else {
      progs.push_back(build(b, *c));
    }
    ranks.push_back(pl::CreateRankDirect(b, r, 0, r, 0, nullptr, 0, 0, &progs));
    ++r;
  }
  auto plan = pl::CreatePlanDirect(b, "mtc test", "", "", 2, 1, 2, 1, 0, nullptr, &ranks);
  pl::FinishPlanBuffer(b, plan);
  return b.Release();
}

TEST(PipelineExpand, CompactProgramsCommunicateAsTheirExpansion) {
  for (const Compact &c : {one_f_one_b(), interleaved(), one_f_one_b_last()}) {
    Built b = built(c);
    std::string error;
    fb::DetachedBuffer buf = mt::rt::expand_pipeline_program(b.program(), &error);
    ASSERT_EQ(error, "");
    const pl::Program &x = *fb::GetRoot<pl::Program>(buf.data());
    fb::FlatBufferBuilder rb;
    rb.Finish(pl::CreateRank(rb));
    const pl::Rank &rank = *fb::GetRoot<pl::Rank>(rb.GetBufferPointer());
    const std::vector<std::string> compact = events_text(b.program(), mt::rt::comm_events(rank, b.program()));
    EXPECT_EQ(compact, events_text(x, mt::rt::comm_events(rank, x)));
    EXPECT_FALSE(compact.empty());
  }
  // The 1F1B stage's events, written out: its sends and receives adjacent
  // across segments (F1's send, B0's receive) form one NCCL group.
  Built b = built(one_f_one_b());
  fb::FlatBufferBuilder rb;
  rb.Finish(pl::CreateRank(rb));
  const pl::Rank &rank = *fb::GetRoot<pl::Rank>(rb.GetBufferPointer());
  EXPECT_EQ(events_text(b.program(), mt::rt::comm_events(rank, b.program())),
            split("p2p send/0 group -1 0 send 1 tag 10 64\n"
                  "p2p send/1 group -1 0 send 1 tag 110 64 recv 1 tag 20 64\n"
                  "p2p send/2 group -1 0 send 1 tag 210 64 recv 1 tag 120 64\n"
                  "p2p send/3 group -1 0 send 1 tag 310 64 recv 1 tag 220 64\n"
                  "p2p recv/3 group -1 0 recv 1 tag 320 64"));
}

TEST(PipelineExpand, CommOrderOfCompactPlans) {
  fb::DetachedBuffer compact = two_stage_plan(one_f_one_b(), one_f_one_b_last(), false);
  fb::DetachedBuffer expanded = two_stage_plan(one_f_one_b(), one_f_one_b_last(), true);
  EXPECT_EQ(mt::rt::check_comm_order(*pl::GetPlan(compact.data())), "");
  EXPECT_EQ(mt::rt::check_comm_order(*pl::GetPlan(expanded.data())), "");
  // Stage 1's tags advance by another stride: message 2 no longer matches.
  Compact last = one_f_one_b_last();
  last.tag_stride = 1000;
  compact = two_stage_plan(one_f_one_b(), last, false);
  expanded = two_stage_plan(one_f_one_b(), last, true);
  EXPECT_EQ(mt::rt::check_comm_order(*pl::GetPlan(compact.data())),
            "program train_step: message 2 from stage 0 to stage 1: stage 0's #2 (send) SEND of "
            "micro-batch 1 sends tag 110 (64 bytes) where stage 1's #3 (send) SEND of "
            "micro-batch 0 receives tag 1010 (64 bytes); NCCL pairs messages by order");
  EXPECT_EQ(mt::rt::check_comm_order(*pl::GetPlan(expanded.data())),
            "program train_step: message 2 from stage 0 to stage 1: stage 0's #4 (send) SEND of "
            "micro-batch 1 sends tag 110 (64 bytes) where stage 1's #3 (send) SEND of "
            "micro-batch 0 receives tag 1010 (64 bytes); NCCL pairs messages by order");
  // A schedule that does not expand is named.
  Compact bad = one_f_one_b_last();
  bad.segments[1].begin = 3;
  compact = two_stage_plan(one_f_one_b(), bad, false);
  EXPECT_EQ(mt::rt::check_comm_order(*pl::GetPlan(compact.data())),
            "program train_step of pipeline stage 1: pipeline.segments[1] begins at instruction "
            "3; it must begin where segments[0] ends (2)");
}

// A 16-stage step of 1,536 micro-batches (GPT-3 175B's layout): its
// communication is walked without expanding the step.
TEST(PipelineExpand, CommEventsOfLargeStepsAreFast) {
  Compact c = one_f_one_b();
  c.stages = 16;
  c.rank = 5;
  c.micro_batches = 1536;
  c.values[0].slots.clear();
  for (int m = 0; m < 1536; ++m)
    c.values[0].slots.push_back(uint64_t(4096 + 64 * m));
  c.values[0].offset = c.values[0].slots[0];
  // Many instructions without communication in each segment.
  std::vector<Ins> code;
  for (size_t i = 0; i < c.code.size(); ++i) {
    code.push_back(c.code[i]);
    if (i == 1 || i == 4)
      for (int k = 0; k < 2000; ++k)
        code.push_back({pl::Opcode::ADD, {3, 3}, {3}, {}, {}, {}, "add"});
  }
  c.code = code;
  c.segments = {{0, 2003, 0, true, pl::SegmentPart::ALL},
                {2003, uint32_t(code.size()), 0, false, pl::SegmentPart::ALL}};
  Built b = built(c);
  fb::FlatBufferBuilder rb;
  rb.Finish(pl::CreateRank(rb));
  const pl::Rank &rank = *fb::GetRoot<pl::Rank>(rb.GetBufferPointer());
  const auto start = std::chrono::steady_clock::now();
  std::vector<mt::rt::CommEvent> ev = mt::rt::comm_events(rank, b.program());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Warm-up 10 sends, then 1,526 send-receive groups, then 10 receives.
  ASSERT_EQ(ev.size(), 1546u);
  EXPECT_EQ(ev[10].ops.size(), 2u);
  EXPECT_EQ(ev.back().ops[0].tag, 20 + 1535 * 100);
  EXPECT_LT(s, 1.0);
}

} // namespace
