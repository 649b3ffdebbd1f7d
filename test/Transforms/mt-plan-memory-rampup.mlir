// mt-plan-memory with a batch ramp-up (mt.training.ramp_micro_batches, the
// smaller micro-batch counts the run reaches): each smaller step runs inside
// the plan of the full one, with each value's slots of its first
// micro-batches, which holds because the smaller step is the full one with
// the later micro-batches' segments left out (runtime/base/pipeline_order.h,
// check_restriction). The plan is the full batch's, byte for byte.
// RUN: mtc-opt %S/mt-schedule-pp-interleaved.mlir -mt-partition-pp -mt-autodiff -mt-schedule-pp -mt-plan-memory -o %t.full.mlir
// RUN: sed 's/num_micro_batches = 4 : i64/num_micro_batches = 4 : i64, ramp_micro_batches = array<i64: 2>/' %S/mt-schedule-pp-interleaved.mlir | mtc-opt -mt-partition-pp -mt-autodiff -mt-schedule-pp -mt-plan-memory -o %t.ramp.mlir
// RUN: FileCheck %s < %t.ramp.mlir
// RUN: sed "s/, ramp_micro_batches = array<i64: 2>//" %t.ramp.mlir | diff %t.full.mlir -
// 1F1B alike.
// RUN: sed 's/num_micro_batches = 2 : i64/num_micro_batches = 2 : i64, ramp_micro_batches = array<i64: 1>/' %S/mt-schedule-pp.mlir | mtc-opt -mt-partition-pp -mt-autodiff -mt-schedule-pp -mt-plan-memory | FileCheck %s --check-prefix=ONE

// CHECK-LABEL: module @stage0 attributes {mt.arena_bytes = 3072 : i64
// CHECK-LABEL: module @stage1 attributes {mt.arena_bytes = 4352 : i64
// ONE-LABEL: module @stage0 attributes {mt.arena_bytes = 1536 : i64

// Counts the interleaved schedule does not take (it runs multiples of the
// stages), or beyond the planned batch, are refused by name.
// RUN: sed 's/num_micro_batches = 4 : i64/num_micro_batches = 4 : i64, ramp_micro_batches = array<i64: 3>/' %S/mt-schedule-pp-interleaved.mlir | not mtc-opt -mt-partition-pp -mt-autodiff -mt-schedule-pp -mt-plan-memory 2>&1 | FileCheck %s --check-prefix=ODD
// ODD: error: mt-plan-memory: the batch ramp-up's step of 3 micro-batches cannot run in the memory planned for 4: the interleaved schedule needs the micro-batch count (3) to be a multiple of the stage count (2)
// RUN: sed 's/num_micro_batches = 4 : i64/num_micro_batches = 4 : i64, ramp_micro_batches = array<i64: 8>/' %S/mt-schedule-pp-interleaved.mlir | not mtc-opt -mt-partition-pp -mt-autodiff -mt-schedule-pp -mt-plan-memory 2>&1 | FileCheck %s --check-prefix=MORE
// MORE: error: mt-plan-memory: the batch ramp-up's step of 8 micro-batches cannot run in the memory planned for 4: the step plans only 4 micro-batches
