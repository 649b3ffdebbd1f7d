// mt-schedule-pp: each stage's step stays one micro-batch's program, cut
// into the segments Megatron's 1F1B order runs (a forward, a backward),
// which mtrun runs for every micro-batch; evaluation stays one
// micro-batch's forward, which the runtime repeats.
// RUN: mtc-opt %s -mt-partition-pp -mt-autodiff -mt-schedule-pp | FileCheck %s --enable-var-scope

// Stage 0 of 2, 2 micro-batches (mtrun: F0 F1 B0 B1): a forward segment of
// 3 ops ending in its send, a backward of 4 starting with its receive.
// CHECK: module @stage0
// CHECK: func.func @train_step(%{{.*}}: tensor<2x4xi32> {mt.name = "tokens"})
// CHECK-SAME: mt.pipeline_schedule = {chunks = 1 : i64, micro_batches = 2 : i64, rank = 0 : i64, stages = 2 : i64, tag_stride = 2 : i64}
// CHECK-SAME: mt.schedule = "1F1B"
// CHECK-SAME: mt.segments = [{chunk = 0 : i64, forward = true, ops = 3 : i64, part = 0 : i64}, {chunk = 0 : i64, forward = false, ops = 4 : i64, part = 0 : i64}]
// CHECK-NOT:  mt.micro_batch
// CHECK:      mt.param_ref @emb
// CHECK-NEXT: mt.param_ref @l0.weight
// CHECK-NEXT: mt.embedding
// CHECK-NEXT: mt.matmul
// CHECK-NEXT: mt.send {{.*}} to 1 {mt.chunk = 0 : i64, tag = 0 : i64}
// CHECK-NEXT: mt.recv from 1 {mt.chunk = 0 : i64, tag = 1 : i64}
// CHECK-NEXT: mt.matmul_input_grad
// CHECK-NEXT: mt.matmul_weight_grad
// CHECK-NEXT: mt.embedding_grad
// CHECK-NEXT: return
// CHECK: func.func @eval_step(%{{.*}}: tensor<2x4xi32> {mt.name = "tokens"})
// CHECK-SAME: mt.schedule = "forward, once per micro-batch"
// CHECK-NOT:  mt.micro_batch
// CHECK:      mt.embedding
// CHECK-NEXT: mt.matmul
// CHECK-NEXT: mt.send {{.*}} to 1 {mt.chunk = 0 : i64, tag = 0 : i64}
// CHECK-NEXT: return

// Stage 1 (last, mtrun: F0 B0 F1 B1): the loss is the step's output; the
// seed scales each micro-batch's loss by 1/2.
// CHECK: module @stage1
// CHECK: func.func @train_step(%{{.*}}: tensor<2x4xi32> {mt.name = "labels"}) -> tensor<f32>
// CHECK-SAME: rank = 1 : i64
// CHECK-SAME: mt.segments = [{chunk = 0 : i64, forward = true, ops = 4 : i64, part = 0 : i64}, {chunk = 0 : i64, forward = false, ops = 7 : i64, part = 0 : i64}]
// CHECK:      mt.recv from 0 {mt.chunk = 0 : i64, tag = 0 : i64}
// CHECK:      mt.cross_entropy
// CHECK-NEXT: mt.grad_seed {mt.chunk = 0 : i64, scale = 5.000000e-01 : f64}
// CHECK:      mt.send {{.*}} to 0 {mt.chunk = 0 : i64, tag = 1 : i64}
// CHECK-NEXT: return
// CHECK: func.func @eval_step(%{{.*}}: tensor<2x4xi32> {mt.name = "labels"}) -> tensor<f32>
// CHECK:      mt.param_ref @emb
// CHECK-NEXT: mt.recv from 0 {mt.chunk = 0 : i64, tag = 0 : i64}
// CHECK-NOT:  mt.recv
// CHECK:      mt.cross_entropy
// CHECK-NEXT: return
module attributes {mt.parallel = {pipeline_model_parallel_size = 2 : i64}, mt.training = {num_micro_batches = 2 : i64}} {
  mt.param @emb : tensor<32x8xf32>, normal(2.000000e-02)
  mt.param @l0.weight : tensor<8x8xf32>, normal(2.000000e-02)
  mt.param @l1.weight : tensor<8x8xf32>, normal(2.000000e-02)
  func.func @forward(%tokens: tensor<2x4xi32> {mt.name = "tokens"}, %labels: tensor<2x4xi32> {mt.name = "labels"}) -> tensor<f32> {
    %e = mt.param_ref @emb : tensor<32x8xf32>
    %x = mt.embedding %e, %tokens : (tensor<32x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
    %w0 = mt.param_ref @l0.weight : tensor<8x8xf32>
    %y0 = mt.matmul %x, %w0 {mt.layer = 0 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %w1 = mt.param_ref @l1.weight : tensor<8x8xf32>
    %y1 = mt.matmul %y0, %w1 {mt.layer = 1 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %logits = mt.matmul %y1, %e : (tensor<2x4x8xf32>, tensor<32x8xf32>) -> tensor<2x4x32xf32>
    %loss = mt.cross_entropy %logits, %labels : (tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}
