// The replay of inter-stage communication under NCCL's rules (comm_order.h):
// hand-made schedules that must pass or fail, then the pipeline schedules
// mtc compiles, which must pass, and must fail once their send/receive
// groups are taken apart (so the replay really sees them); the events of
// their compact train_steps equal those of the expanded steps. Last, how
// the expansion stores each micro-batch's copies: each distinct part once.
#include "compiler/import/ImportSpec.h"
#include "compiler/plan/PlanWriter.h"
#include "dialects/mt/MtOps.h"
#include "passes/Passes.h"
#include "runtime/comm/comm_order.h"
#include "runtime/plan/pipeline_expand.h"
#include "runtime/plan/plan_reader.h"
#include "spec/Spec.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace {

using mt::rt::CommEvent;
using mt::rt::CommOp;
namespace pl = mt::plan;

CommEvent p2p(std::vector<CommOp> ops, uint32_t instruction = 0) {
  CommEvent e;
  e.kind = CommEvent::P2P;
  e.ops = std::move(ops);
  e.instruction = instruction;
  return e;
}
CommEvent collective(int group, uint64_t bytes, uint32_t instruction = 0) {
  CommEvent e;
  e.kind = CommEvent::COLLECTIVE;
  e.group = group;
  e.bytes = bytes;
  e.instruction = instruction;
  return e;
}
CommOp send(int peer, int64_t tag, uint64_t bytes = 64) { return {true, peer, tag, bytes}; }
CommOp recv(int peer, int64_t tag, uint64_t bytes = 64) { return {false, peer, tag, bytes}; }

std::string check(const std::vector<std::vector<CommEvent>> &events) {
  return mt::rt::check_comm_events(
      events, [](int, const CommEvent &e) { return "#" + std::to_string(e.instruction); });
}

TEST(CommOrder, ExchangeNeedsOneGroup) {
  // Each stage sends first, then receives: with buffered sends (the CPU
  // executor) this works, under NCCL both sends wait for ever.
  std::string e = check({{p2p({send(1, 0)}, 3), p2p({recv(1, 1)}, 4)},
                         {p2p({send(0, 1)}, 7), p2p({recv(0, 0)}, 8)}});
  EXPECT_EQ(e, "the stages would wait on each other for ever: stage 0's #3 waits to send to "
               "stage 1 (tag 0, 64 bytes); stage 1's #7 waits to send to stage 0 (tag 1, 64 "
               "bytes) (each stage's GPU stream runs its communication in program order, and "
               "NCCL completes a message only while both ends are posted)");
  // The same messages, each stage's pair issued as one group.
  EXPECT_EQ(check({{p2p({send(1, 0), recv(1, 1)})}, {p2p({send(0, 1), recv(0, 0)})}}), "");
  // Or ordered so that one side receives first.
  EXPECT_EQ(check({{p2p({send(1, 0)}), p2p({recv(1, 1)})}, {p2p({recv(0, 0)}), p2p({send(0, 1)})}}),
            "");
}

TEST(CommOrder, ChainsCompleteThroughStages) {
  // A forward wave down four stages, then a backward wave up.
  std::vector<std::vector<CommEvent>> ev(4);
  for (int s = 0; s < 4; ++s) {
    if (s > 0)
      ev[s].push_back(p2p({recv(s - 1, s)}));
    if (s < 3)
      ev[s].push_back(p2p({send(s + 1, s + 1)}));
  }
  for (int s = 3; s >= 0; --s) {
    if (s < 3)
      ev[s].push_back(p2p({recv(s + 1, 10 + s)}));
    if (s > 0)
      ev[s].push_back(p2p({send(s - 1, 10 + s - 1)}));
  }
  EXPECT_EQ(check(ev), "");
  // A stage that waits on the backward before sending the forward on.
  std::swap(ev[1][1], ev[1][2]);
  std::string e = check(ev);
  EXPECT_NE(e.find("stage 1's #0 waits to receive from stage 2 (tag 11"), std::string::npos) << e;
  EXPECT_NE(e.find("stage 2's #0 waits to receive from stage 1 (tag 2"), std::string::npos) << e;
}

TEST(CommOrder, MessagesPairByOrderNotByTag) {
  // Two messages from stage 0 to 1, received in the other order.
  std::string e = check({{p2p({send(1, 0, 64)}), p2p({send(1, 1, 128)})},
                         {p2p({recv(0, 1, 128)}, 5), p2p({recv(0, 0, 64)}, 6)}});
  EXPECT_EQ(e, "message 1 from stage 0 to stage 1: stage 0's #0 sends tag 0 (64 bytes) where "
               "stage 1's #5 receives tag 1 (128 bytes); NCCL pairs messages by order");
  e = check({{p2p({send(1, 0)}), p2p({send(1, 1)})}, {p2p({recv(0, 0)})}});
  EXPECT_EQ(e, "stage 0 sends 2 messages to stage 1, which receives 1 from it");
  e = check({{p2p({send(0, 0)})}, {}});
  EXPECT_EQ(e, "stage 0's #0 exchanges with stage 0 of 2");
}

TEST(CommOrder, CollectivesNeedEveryStage) {
  // The model-parallel norm after the exchanges: fine.
  EXPECT_EQ(check({{p2p({send(1, 0)}), collective(3, 4)}, {p2p({recv(0, 0)}), collective(3, 4)}}),
            "");
  // Stage 1 reduces before it receives what stage 0 sends first.
  std::string e =
      check({{p2p({send(1, 0)}), collective(3, 4)}, {collective(3, 4, 2), p2p({recv(0, 0)})}});
  EXPECT_NE(e.find("stage 0's #0 waits to send to stage 1"), std::string::npos) << e;
  EXPECT_NE(e.find("stage 1's #2 waits to reduce over the model-parallel group"),
            std::string::npos)
      << e;
  EXPECT_EQ(check({{collective(2, 4)}, {}}),
            "stage 0 takes part in 1 collectives over the pipeline group and stage 1 in 0");
  EXPECT_EQ(check({{collective(3, 4, 1)}, {collective(3, 8, 2)}}),
            "collective 1 over the model-parallel group: stage 0's #1 reduces 4 bytes and stage "
            "1's #2 8");
}

// The plans mtc writes: every program of every stage.
struct Compiled {
  std::string payload;
  const pl::Plan *plan() const {
    return pl::GetPlan(reinterpret_cast<const uint8_t *>(payload.data()));
  }
};

Compiled compile(const std::vector<mt::spec::Override> &overrides) {
  absl::StatusOr<mt::spec::Spec> spec =
      mt::spec::parseSpecFile(std::string(MT_SOURCE_DIR) + "/models/tiny.toml", overrides);
  EXPECT_TRUE(spec.ok()) << spec.status().message();
  mlir::MLIRContext context;
  context.loadDialect<mt::MtDialect, mlir::func::FuncDialect>();
  mlir::OwningOpRef<mlir::ModuleOp> module = mt::importSpec(context, *spec);
  EXPECT_TRUE(module);
  mlir::PassManager pm(&context);
  mt::buildTrainPipeline(pm);
  EXPECT_TRUE(mlir::succeeded(pm.run(*module)));
  mlir::FailureOr<std::string> payload = mt::buildPlanPayload(*module, *spec);
  EXPECT_TRUE(mlir::succeeded(payload));
  return {mlir::succeeded(payload) ? *payload : std::string()};
}

// Each stage's events for `program`, from the ranks with tp and dp rank 0.
std::vector<std::vector<CommEvent>> eventsOf(const pl::Plan &plan, const std::string &program) {
  std::vector<std::vector<CommEvent>> events(size_t(plan.pipeline_parallel()));
  for (const pl::Rank *r : *plan.ranks())
    if (r->tp_rank() == 0 && r->dp_rank() == 0)
      for (const pl::Program *p : *r->programs())
        if (p->name()->str() == program)
          events[size_t(r->pp_rank())] = mt::rt::comm_events(*r, *p);
  return events;
}

void expectSchedulesComplete(const std::vector<mt::spec::Override> &overrides, int stages,
                             int microBatches) {
  SCOPED_TRACE(std::to_string(stages) + " stages, " + std::to_string(microBatches) +
               " micro-batches");
  Compiled c = compile(overrides);
  ASSERT_FALSE(c.payload.empty());
  const pl::Plan &plan = *c.plan();
  ASSERT_EQ(plan.pipeline_parallel(), stages);
  EXPECT_EQ(mt::rt::check_comm_order(plan), "");

  // Every boundary carries each micro-batch's activation one way and its
  // gradient back (interleaved: once per model chunk and boundary crossing).
  std::vector<std::vector<CommEvent>> train = eventsOf(plan, "train_step");
  int64_t messages = 0;
  for (const auto &stage : train)
    for (const CommEvent &e : stage)
      for (const CommOp &op : e.ops)
        messages += op.send ? 1 : 0;
  EXPECT_GE(messages, int64_t(2 * (stages - 1) * microBatches));

  // mtc writes each stage's train_step compact; its events, walked over
  // the schedule, are those of the step mtrun expands.
  for (const pl::Rank *r : *plan.ranks()) {
    if (r->tp_rank() != 0 || r->dp_rank() != 0)
      continue;
    mt::rt::RankPrograms programs;
    ASSERT_EQ(programs.load(*r), "");
    const pl::Program *compact = nullptr;
    for (const pl::Program *p : *r->programs())
      if (p->name()->str() == "train_step")
        compact = p;
    ASSERT_NE(compact, nullptr);
    ASSERT_NE(compact->pipeline(), nullptr) << "stage " << r->pp_rank();
    const pl::Program *expanded = programs.find("train_step");
    ASSERT_EQ(expanded->unrolled_micro_batches(), microBatches);
    std::vector<CommEvent> a = mt::rt::comm_events(*r, *compact),
                           b = mt::rt::comm_events(*r, *expanded);
    ASSERT_EQ(a.size(), b.size()) << "stage " << r->pp_rank();
    for (size_t e = 0; e < a.size(); ++e) {
      SCOPED_TRACE("stage " + std::to_string(r->pp_rank()) + " event " + std::to_string(e));
      EXPECT_EQ(a[e].kind, b[e].kind);
      EXPECT_EQ(a[e].group, b[e].group);
      EXPECT_EQ(a[e].bytes, b[e].bytes);
      EXPECT_EQ(a[e].micro_batch, b[e].micro_batch);
      EXPECT_EQ(compact->instructions()->Get(a[e].instruction)->where()->str(),
                expanded->instructions()->Get(b[e].instruction)->where()->str());
      ASSERT_EQ(a[e].ops.size(), b[e].ops.size());
      for (size_t o = 0; o < a[e].ops.size(); ++o) {
        EXPECT_EQ(a[e].ops[o].send, b[e].ops[o].send);
        EXPECT_EQ(a[e].ops[o].peer, b[e].ops[o].peer);
        EXPECT_EQ(a[e].ops[o].tag, b[e].ops[o].tag);
        EXPECT_EQ(a[e].ops[o].bytes, b[e].ops[o].bytes);
      }
    }
  }

  // Issued one message at a time, the steady state's paired exchanges
  // deadlock: the replay sees the groups the executor forms.
  if (microBatches >= stages && stages > 1) {
    std::vector<std::vector<CommEvent>> split(train.size());
    for (size_t s = 0; s < train.size(); ++s)
      for (const CommEvent &e : train[s])
        for (const CommOp &op : e.ops)
          split[s].push_back(p2p({op}, e.instruction));
    EXPECT_NE(check(split).find("would wait on each other for ever"), std::string::npos);
  }
}

TEST(CommOrder, CompiledPipelineSchedulesComplete) {
  for (int pp : {2, 4})
    for (int mb : {1, 2, 4, 8}) {
      if (pp == 4 && mb == 1)
        continue;
      expectSchedulesComplete({{"model.num_layers=4"},
                               {"parallel.pipeline_model_parallel_size=" + std::to_string(pp)},
                               {"training.global_batch_size=" + std::to_string(4 * mb)}},
                              pp, mb);
    }
}

TEST(CommOrder, CompiledInterleavedAndParallelSchedulesComplete) {
  // Interleaved 1F1B (two chunks per stage).
  expectSchedulesComplete({{"model.num_layers=8"},
                           {"parallel.pipeline_model_parallel_size=2"},
                           {"parallel.virtual_pipeline_model_parallel_size=2"},
                           {"training.global_batch_size=16"}},
                          2, 4);
  // With tensor and sequence parallelism, data-parallel buckets and the
  // distributed optimizer, in bf16.
  expectSchedulesComplete({{"model.num_layers=4"},
                           {"parallel.pipeline_model_parallel_size=2"},
                           {"parallel.tensor_model_parallel_size=2"},
                           {"parallel.sequence_parallel=true"},
                           {"parallel.data_parallel_size=2"},
                           {"parallel.use_distributed_optimizer=true"},
                           {"training.precision=\"bf16\""},
                           {"training.global_batch_size=24"}},
                          2, 3);
}

// A stage's micro-batches repeat each layer's instructions; the expansion
// of its compact train_step stores their equal parts once: the `where`
// strings, ints, GEMM descriptors, steps on parameters only, and value
// shapes point at one object, while operand lists and values of the
// activations kept across segments stay per micro-batch.
TEST(PipelineExpand, MicroBatchCopiesShareTheirParts) {
  Compiled c = compile({{"model.num_layers=4"},
                        {"parallel.pipeline_model_parallel_size=2"},
                        {"training.global_batch_size=16"}});
  ASSERT_FALSE(c.payload.empty());
  const pl::Rank &rank = *c.plan()->ranks()->Get(0);
  mt::rt::RankPrograms programs;
  ASSERT_EQ(programs.load(rank), "");
  const pl::Program *train = programs.find("train_step");
  ASSERT_NE(train, nullptr);
  // Micro-batch 0's first instruction with a GEMM, and its copy in
  // micro-batch 1.
  const auto &insts = *train->instructions();
  const pl::Instruction *first = nullptr, *copy = nullptr;
  auto has_gemm = [](const pl::Instruction *ins) {
    for (const pl::GpuStep *s : *ins->gpu())
      if (s->kind() == pl::GpuStepKind::GEMM)
        return true;
    return false;
  };
  for (const pl::Instruction *ins : insts)
    if (!first && ins->micro_batch() == 0 && has_gemm(ins))
      first = ins;
  ASSERT_NE(first, nullptr);
  for (const pl::Instruction *ins : insts)
    if (!copy && ins->micro_batch() == 1 && ins->op() == first->op() &&
        ins->where()->str() == first->where()->str())
      copy = ins;
  ASSERT_NE(copy, nullptr) << first->where()->str();
  EXPECT_EQ(first->where(), copy->where()) << "one string";
  EXPECT_EQ(first->where()->str().find('#'), std::string::npos) << first->where()->str();
  EXPECT_EQ(first->ints(), copy->ints());
  EXPECT_NE(first->in(), copy->in()) << "each micro-batch's own operands";
  EXPECT_NE(first->in()->Get(0), copy->in()->Get(0));
  ASSERT_EQ(first->gpu()->size(), copy->gpu()->size());
  for (uint32_t k = 0; k < first->gpu()->size(); ++k) {
    const pl::GpuStep &a = *first->gpu()->Get(k), &b = *copy->gpu()->Get(k);
    if (a.kind() == pl::GpuStepKind::GEMM) {
      EXPECT_EQ(a.gemm(), b.gemm()) << "one descriptor";
    }
  }
  // The values of the two micro-batches: distinct tables, shared shapes.
  const pl::Value &x = *train->values()->Get(first->in()->Get(0));
  const pl::Value &y = *train->values()->Get(copy->in()->Get(0));
  EXPECT_NE(x.offset(), y.offset());
  EXPECT_EQ(x.shape(), y.shape());
  // Steps on parameters only (the optimizer's, the gradient zeroing of a
  // stage) are shared wherever they are equal: no two equal ones in the file.
  size_t steps = 0, distinct = 0;
  std::set<const pl::GpuStep *> seen;
  for (const pl::Instruction *ins : insts)
    for (const pl::GpuStep *s : *ins->gpu()) {
      ++steps;
      distinct += seen.insert(s).second;
    }
  EXPECT_LT(distinct, steps);
}

} // namespace
