// mt-schedule-pp, interleaved: the communication of each unit of steps (a
// warm-up forward, a steady forward and backward, a cool-down backward) is
// one group after the unit's compute: its outputs sent, then the inputs of
// the next unit's steps received, as Megatron-LM's interleaved schedule
// exchanges. (Receiving each input just before its step lets two stages
// each wait to send to the other under NCCL; runtime/comm/comm_order.h.)
// RUN: mtc-opt %s -mt-partition-pp -mt-autodiff -mt-schedule-pp | FileCheck %s

// Stage 0 of 2, two chunks (layers 0 and 2), 4 micro-batches: 4 warm-up
// forwards, 4 forward-backward pairs, 4 cool-down backwards.
// CHECK-LABEL: module @stage0
// CHECK:      func.func @train_step
// CHECK-SAME: mt.schedule = "interleaved 1F1B"
// The first chunk's forwards need no input from stage 1.
// CHECK:      mt.send {{.*}} to 1 {mt.chunk = 0 : i64, mt.micro_batch = 0 : i64, tag = 0 : i64}
// CHECK-NEXT: mt.embedding
// CHECK:      mt.send {{.*}} to 1 {mt.chunk = 0 : i64, mt.micro_batch = 1 : i64, tag = 6 : i64}
// CHECK-NEXT: mt.recv from 1 {mt.chunk = 1 : i64, mt.micro_batch = 0 : i64, tag = 2 : i64}
// CHECK-NEXT: mt.matmul {{.*}}mt.chunk = 1 : i64, mt.layer = 2 : i64, mt.micro_batch = 0 : i64
// CHECK-NEXT: mt.send {{.*}} to 1 {mt.chunk = 1 : i64, mt.micro_batch = 0 : i64, tag = 4 : i64}
// CHECK-NEXT: mt.recv from 1 {mt.chunk = 1 : i64, mt.micro_batch = 1 : i64, tag = 8 : i64}
// The last warm-up forward's group also receives the first backward's input.
// CHECK:      mt.send {{.*}} to 1 {mt.chunk = 1 : i64, mt.micro_batch = 1 : i64, tag = 10 : i64}
// CHECK-NEXT: mt.recv from 1 {mt.chunk = 1 : i64, mt.micro_batch = 0 : i64, tag = 5 : i64}
// A steady pair: both steps computed, both outputs sent, the next pair's
// inputs received.
// CHECK-NEXT: mt.embedding {{.*}}mt.micro_batch = 2 : i64
// CHECK:      mt.matmul_weight_grad {{.*}} into @l2.weight {mt.chunk = 1 : i64, mt.layer = 2 : i64, mt.micro_batch = 0 : i64}
// CHECK-NEXT: mt.send {{.*}} to 1 {mt.chunk = 0 : i64, mt.micro_batch = 2 : i64, tag = 12 : i64}
// CHECK-NEXT: mt.send {{.*}} to 1 {mt.chunk = 1 : i64, mt.micro_batch = 0 : i64, tag = 3 : i64}
// CHECK-NEXT: mt.recv from 1 {mt.chunk = 1 : i64, mt.micro_batch = 1 : i64, tag = 11 : i64}
// CHECK-NEXT: mt.embedding {{.*}}mt.micro_batch = 3 : i64
// CHECK:      mt.send {{.*}} to 1 {mt.chunk = 0 : i64, mt.micro_batch = 3 : i64, tag = 18 : i64}
// CHECK-NEXT: mt.send {{.*}} to 1 {mt.chunk = 1 : i64, mt.micro_batch = 1 : i64, tag = 9 : i64}
// CHECK-NEXT: mt.recv from 1 {mt.chunk = 1 : i64, mt.micro_batch = 2 : i64, tag = 14 : i64}
// CHECK-NEXT: mt.recv from 1 {mt.chunk = 0 : i64, mt.micro_batch = 0 : i64, tag = 1 : i64}
// The cool-down: the last backwards receive without sending (chunk 0 is
// the first virtual stage).
// CHECK:      mt.embedding_grad {{.*}}mt.micro_batch = 2 : i64
// CHECK-NEXT: mt.recv from 1 {mt.chunk = 0 : i64, mt.micro_batch = 3 : i64, tag = 19 : i64}
// CHECK:      return
// Evaluation is one micro-batch's forward, chunk by chunk, each chunk's
// receive at its start and its send at its end.
// CHECK:      func.func @eval_step
// CHECK-SAME: mt.schedule = "forward, once per micro-batch"
// CHECK-NOT:  mt.micro_batch
// CHECK:      mt.embedding
// CHECK:      mt.send {{.*}} to 1 {mt.chunk = 0 : i64, tag = 0 : i64}
// CHECK-NEXT: mt.recv from 1 {mt.chunk = 1 : i64, tag = 2 : i64}
// CHECK-NEXT: mt.matmul {{.*}}mt.chunk = 1 : i64, mt.layer = 2 : i64
// CHECK-NEXT: mt.send {{.*}} to 1 {mt.chunk = 1 : i64, tag = 4 : i64}
// CHECK-NEXT: return
// CHECK-LABEL: module @stage1
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
