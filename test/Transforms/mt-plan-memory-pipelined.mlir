// mt-plan-memory on a pipelined step (mt-schedule-pp's segments): a value
// used only inside its segment has one place; one that outlives it gets a
// slot per micro-batch in flight; inputs and outputs one per micro-batch.
// RUN: mtc-opt %S/mt-schedule-pp.mlir -mt-partition-pp -mt-autodiff -mt-schedule-pp -mt-plan-memory | FileCheck %s
// A long step is planned over a shorter one with the same warm-up and
// cool-down (the arena does not grow with the micro-batch count):
// RUN: sed 's/num_micro_batches = 2 : i64/num_micro_batches = 64 : i64/' %S/mt-schedule-pp.mlir | mtc-opt -mt-partition-pp -mt-autodiff -mt-schedule-pp -mt-plan-memory | FileCheck %s --check-prefix=LONG

// Stage 0 of 2 holds two micro-batches at once (F0 F1 B0 B1): the
// embedding's output, read by the backward, has two slots; the tokens one
// per micro-batch, below everything else; what is sent or received is
// used inside its segment only.
// CHECK-LABEL: module @stage0 attributes {mt.arena_bytes = 1536 : i64
// CHECK:      func.func @train_step({{.*}}mt.name = "tokens", mt.offset = 0 : i64, mt.slot_offsets = array<i64: 0, 256>}
// CHECK-SAME: mt.planned_micro_batches = 2 : i64
// CHECK:      mt.embedding {{.*}}mt.offsets = array<i64: [[E0:[0-9]+]]>, mt.slot_offsets = [array<i64: [[E0]], {{[0-9]+}}>]
// CHECK-NEXT: mt.matmul {{.*}}mt.offsets = array<i64: {{[0-9]+}}>} :
// CHECK-NEXT: mt.send
// CHECK-NEXT: mt.recv {{.*}}mt.offsets = array<i64: {{[0-9]+}}>, tag
// Stage 1 runs each backward right after its forward: one slot; the loss
// and the labels one per micro-batch.
// CHECK-LABEL: module @stage1
// CHECK:      func.func @train_step({{.*}}mt.name = "labels", mt.offset = 0 : i64, mt.slot_offsets = array<i64: 0, 256>}
// CHECK:      mt.recv {{.*}}mt.offsets = array<i64: {{[0-9]+}}>, tag
// CHECK:      mt.cross_entropy {{.*}}mt.slot_offsets = [array<i64: 512, 768>]

// LONG-LABEL: module @stage0 attributes {mt.arena_bytes = 17408 : i64
// LONG:       mt.planned_micro_batches = 10 : i64
// LONG:       mt.embedding {{.*}}mt.slot_offsets = [array<i64: {{[0-9]+}}, {{[0-9]+}}>]
// LONG-LABEL: module @stage1 attributes {mt.arena_bytes = 34560 : i64
// LONG:       mt.planned_micro_batches = 6 : i64
