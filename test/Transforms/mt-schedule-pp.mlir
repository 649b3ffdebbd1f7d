// mt-schedule-pp: each stage's step unrolled over the micro-batches in
// Megatron's 1F1B order, per-micro-batch inputs, outputs and message tags;
// evaluation stays one micro-batch's forward, which the runtime repeats.
// RUN: mtc-opt %s -mt-partition-pp -mt-autodiff -mt-schedule-pp | FileCheck %s --enable-var-scope

// Stage 0 of 2, 2 micro-batches: one warm-up forward, then F1 B0, then B1.
// CHECK: module @stage0
// CHECK: func.func @train_step(%{{.*}}: tensor<2x4xi32> {mt.name = "tokens.0"}, %{{.*}}: tensor<2x4xi32> {mt.name = "tokens.1"})
// CHECK-SAME: mt.micro_batches = 2 : i64
// CHECK-SAME: mt.schedule = "1F1B"
// CHECK:      mt.embedding {{.*}}mt.micro_batch = 0 : i64
// CHECK:      mt.send {{.*}} to 1 {mt.chunk = 0 : i64, mt.micro_batch = 0 : i64, tag = 0 : i64}
// CHECK:      mt.embedding {{.*}}mt.micro_batch = 1 : i64
// CHECK:      mt.send {{.*}} to 1 {mt.chunk = 0 : i64, mt.micro_batch = 1 : i64, tag = 2 : i64}
// CHECK:      mt.recv from 1 {mt.chunk = 0 : i64, mt.micro_batch = 0 : i64, tag = 1 : i64}
// CHECK:      mt.embedding_grad {{.*}}mt.micro_batch = 0 : i64
// CHECK:      mt.recv from 1 {mt.chunk = 0 : i64, mt.micro_batch = 1 : i64, tag = 3 : i64}
// CHECK:      mt.embedding_grad {{.*}}mt.micro_batch = 1 : i64
// CHECK:      return
// CHECK: func.func @eval_step(%{{.*}}: tensor<2x4xi32> {mt.name = "tokens"})
// CHECK-SAME: mt.schedule = "forward, once per micro-batch"
// CHECK-NOT:  mt.micro_batch
// CHECK:      mt.embedding
// CHECK-NEXT: mt.matmul
// CHECK-NEXT: mt.send {{.*}} to 1 {mt.chunk = 0 : i64, tag = 0 : i64}
// CHECK-NEXT: return

// Stage 1 (last): F0 B0 F1 B1, a loss per micro-batch.
// CHECK: module @stage1
// CHECK: func.func @train_step(%{{.*}}: tensor<2x4xi32> {mt.name = "labels.0"}, %{{.*}}: tensor<2x4xi32> {mt.name = "labels.1"}) -> (tensor<f32> {mt.name = "loss.0"}, tensor<f32> {mt.name = "loss.1"})
// CHECK:      mt.recv from 0 {mt.chunk = 0 : i64, mt.micro_batch = 0 : i64, tag = 0 : i64}
// CHECK:      mt.grad_seed {mt.chunk = 0 : i64, mt.micro_batch = 0 : i64, scale = 5.000000e-01 : f64}
// CHECK:      mt.send {{.*}} to 0 {mt.chunk = 0 : i64, mt.micro_batch = 0 : i64, tag = 1 : i64}
// CHECK:      mt.recv from 0 {mt.chunk = 0 : i64, mt.micro_batch = 1 : i64, tag = 2 : i64}
// CHECK:      mt.send {{.*}} to 0 {mt.chunk = 0 : i64, mt.micro_batch = 1 : i64, tag = 3 : i64}
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
