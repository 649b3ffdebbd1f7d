// mt-schedule-pp, interleaved: each step is cut into its receives, its
// computation and its sends, since Megatron-LM's interleaved schedule
// exchanges once per unit of steps (a warm-up forward, a steady forward and
// backward, a cool-down backward): the unit's computation, then its
// outputs sent and the next unit's inputs received as one group.
// (Receiving each input just before its step lets two stages each wait to
// send to the other under NCCL; runtime/comm/comm_order.h.) The order of
// the segments over the micro-batches is runtime/base/pipeline_order's
// (tested in test/unit/runtime/base).
// RUN: mtc-opt %s -mt-partition-pp -mt-autodiff -mt-schedule-pp | FileCheck %s

// Stage 0 of 2, two chunks (layers 0 and 2), 4 micro-batches. The first
// chunk's forward receives nothing and its backward sends nothing.
// CHECK-LABEL: module @stage0
// CHECK:      func.func @train_step
// CHECK-SAME: mt.pipeline_schedule = {chunks = 2 : i64, micro_batches = 4 : i64, rank = 0 : i64, stages = 2 : i64, tag_stride = 6 : i64}
// CHECK-SAME: mt.schedule = "interleaved 1F1B"
// CHECK-SAME: mt.segments = [{chunk = 0 : i64, forward = true, ops = 2 : i64, part = 2 : i64}, {chunk = 0 : i64, forward = true, ops = 1 : i64, part = 3 : i64}, {chunk = 1 : i64, forward = true, ops = 1 : i64, part = 1 : i64}, {chunk = 1 : i64, forward = true, ops = 1 : i64, part = 2 : i64}, {chunk = 1 : i64, forward = true, ops = 1 : i64, part = 3 : i64}, {chunk = 1 : i64, forward = false, ops = 1 : i64, part = 1 : i64}, {chunk = 1 : i64, forward = false, ops = 2 : i64, part = 2 : i64}, {chunk = 1 : i64, forward = false, ops = 1 : i64, part = 3 : i64}, {chunk = 0 : i64, forward = false, ops = 1 : i64, part = 1 : i64}, {chunk = 0 : i64, forward = false, ops = 3 : i64, part = 2 : i64}]
// CHECK:      mt.embedding
// CHECK-NEXT: mt.matmul {{.*}}mt.chunk = 0 : i64, mt.layer = 0 : i64
// CHECK-NEXT: mt.send {{.*}} to 1 {mt.chunk = 0 : i64, tag = 0 : i64}
// CHECK-NEXT: mt.recv from 1 {mt.chunk = 1 : i64, tag = 2 : i64}
// CHECK-NEXT: mt.matmul {{.*}}mt.chunk = 1 : i64, mt.layer = 2 : i64
// CHECK-NEXT: mt.send {{.*}} to 1 {mt.chunk = 1 : i64, tag = 4 : i64}
// CHECK-NEXT: mt.recv from 1 {mt.chunk = 1 : i64, tag = 5 : i64}
// CHECK-NEXT: mt.matmul_input_grad {{.*}}mt.chunk = 1 : i64
// CHECK-NEXT: mt.matmul_weight_grad {{.*}} into @l2.weight
// CHECK-NEXT: mt.send {{.*}} to 1 {mt.chunk = 1 : i64, tag = 3 : i64}
// CHECK-NEXT: mt.recv from 1 {mt.chunk = 0 : i64, tag = 1 : i64}
// CHECK-NEXT: mt.matmul_input_grad {{.*}}mt.chunk = 0 : i64
// CHECK-NEXT: mt.matmul_weight_grad {{.*}} into @l0.weight
// CHECK-NEXT: mt.embedding_grad
// CHECK-NEXT: return

// Stage 1 (last): the loss in chunk 1's forward computation, whose
// backward starts at once, so it receives nothing.
// CHECK-LABEL: module @stage1
// CHECK:      func.func @train_step
// CHECK-SAME: mt.segments = [{chunk = 0 : i64, forward = true, ops = 1 : i64, part = 1 : i64}, {chunk = 0 : i64, forward = true, ops = 1 : i64, part = 2 : i64}, {chunk = 0 : i64, forward = true, ops = 1 : i64, part = 3 : i64}, {chunk = 1 : i64, forward = true, ops = 1 : i64, part = 1 : i64}, {chunk = 1 : i64, forward = true, ops = 3 : i64, part = 2 : i64}, {chunk = 1 : i64, forward = false, ops = 6 : i64, part = 2 : i64}, {chunk = 1 : i64, forward = false, ops = 1 : i64, part = 3 : i64}, {chunk = 0 : i64, forward = false, ops = 1 : i64, part = 1 : i64}, {chunk = 0 : i64, forward = false, ops = 2 : i64, part = 2 : i64}, {chunk = 0 : i64, forward = false, ops = 1 : i64, part = 3 : i64}]
// CHECK:      mt.cross_entropy
// CHECK-NEXT: mt.grad_seed {mt.chunk = 1 : i64, scale = 2.500000e-01 : f64}

module attributes {mt.parallel = {pipeline_model_parallel_size = 2 : i64, virtual_pipeline_model_parallel_size = 2 : i64}, mt.training = {num_micro_batches = 4 : i64}} {
  mt.param @emb : tensor<32x8xf32>, normal(2.000000e-02)
  mt.param @l0.weight : tensor<8x8xf32>, normal(2.000000e-02)
  mt.param @l1.weight : tensor<8x8xf32>, normal(2.000000e-02)
  mt.param @l2.weight : tensor<8x8xf32>, normal(2.000000e-02)
  mt.param @l3.weight : tensor<8x8xf32>, normal(2.000000e-02)
  func.func @forward(%tokens: tensor<2x4xi32> {mt.name = "tokens"}, %labels: tensor<2x4xi32> {mt.name = "labels"}) -> tensor<f32> {
    %e = mt.param_ref @emb : tensor<32x8xf32>
    %x = mt.embedding %e, %tokens : (tensor<32x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
    %w0 = mt.param_ref @l0.weight : tensor<8x8xf32>
    %y0 = mt.matmul %x, %w0 {mt.layer = 0 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %w1 = mt.param_ref @l1.weight : tensor<8x8xf32>
    %y1 = mt.matmul %y0, %w1 {mt.layer = 1 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %w2 = mt.param_ref @l2.weight : tensor<8x8xf32>
    %y2 = mt.matmul %y1, %w2 {mt.layer = 2 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %w3 = mt.param_ref @l3.weight : tensor<8x8xf32>
    %y3 = mt.matmul %y2, %w3 {mt.layer = 3 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %logits = mt.matmul %y3, %e : (tensor<2x4x8xf32>, tensor<32x8xf32>) -> tensor<2x4x32xf32>
    %loss = mt.cross_entropy %logits, %labels : (tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}
