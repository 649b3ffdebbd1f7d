// mt-schedule-pp keeps mt-data-parallel's marked ops in the one
// micro-batch program with their marks, which the plan writer turns into
// Instruction.runs_in: overlapped weight gathers (mt.first_micro_batch) run
// in micro-batch 0's forward, before anything of the step, overlapped
// bucket reductions (mt.last_micro_batch) in the last micro-batch's
// backward. (The parameter reads come first: they are not instructions.)
// RUN: mtc-opt %s -mt-partition-pp -mt-autodiff -mt-optimizer -mt-data-parallel -mt-schedule-pp | FileCheck %s --enable-var-scope

// Stage 0 of 2, 3 micro-batches; one bucket per stage.
// CHECK-LABEL: module @stage0
// CHECK:       func.func @train_step(
// CHECK-NOT:   mt.embedding
// CHECK:       mt.all_gather_params {bucket = 0 : i64, group = "dp", mt.chunk = 0 : i64, mt.first_micro_batch}
// CHECK-NEXT:  mt.embedding
// CHECK-NOT:   mt.all_gather_params
// CHECK-NOT:   mt.reduce_grads
// CHECK:       mt.embedding_grad
// CHECK-NEXT:  mt.reduce_grads {bucket = 0 : i64, group = "dp", mt.chunk = 0 : i64, mt.last_micro_batch, scale = 5.000000e-01 : f64, scatter = true}
// CHECK-NEXT:  return
// CHECK:       func.func @eval_step(
// CHECK-NOT:   mt.all_gather_params
// CHECK:       func.func @optimizer_step(
// CHECK-NOT:   mt.all_gather_params
// CHECK:       return
// CHECK:       func.func @gather_params() {
// CHECK-NEXT:  mt.all_gather_params {bucket = 0 : i64, group = "dp"}
// CHECK-NEXT:  return
// CHECK-LABEL: module @stage1
// CHECK:       func.func @train_step(
// CHECK-NOT:   mt.recv
// CHECK:       mt.all_gather_params {bucket = 0 : i64, group = "dp", mt.chunk = 0 : i64, mt.first_micro_batch}
// CHECK-NOT:   mt.all_gather_params
// CHECK:       func.func @eval_step(
module attributes {mt.parallel = {pipeline_model_parallel_size = 2 : i64, data_parallel_size = 2 : i64, use_distributed_optimizer = true, overlap_grad_reduce = true, overlap_param_gather = true}, mt.training = {num_micro_batches = 3 : i64, lr = 6.0e-04 : f64, min_lr = 6.0e-05 : f64, lr_decay_style = "cosine", lr_warmup_iters = 20 : i64, lr_decay_iters = 200 : i64, weight_decay = 1.0e-01 : f64, adam_beta1 = 9.0e-01 : f64, adam_beta2 = 9.5e-01 : f64, adam_eps = 1.0e-08 : f64, clip_grad = 1.0 : f64}} {
  mt.param @emb : tensor<32x8xf32>, normal(2.000000e-02)
  mt.param @l0.weight : tensor<8x8xf32>, normal(2.000000e-02)
  mt.param @l1.weight : tensor<8x8xf32>, normal(2.000000e-02)
  mt.param @out.weight : tensor<32x8xf32>, normal(2.000000e-02)
  func.func @forward(%tokens: tensor<2x4xi32> {mt.name = "tokens"}, %labels: tensor<2x4xi32> {mt.name = "labels"}) -> tensor<f32> {
    %e = mt.param_ref @emb : tensor<32x8xf32>
    %x = mt.embedding %e, %tokens : (tensor<32x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
    %w0 = mt.param_ref @l0.weight : tensor<8x8xf32>
    %y0 = mt.matmul %x, %w0 {mt.layer = 0 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %w1 = mt.param_ref @l1.weight : tensor<8x8xf32>
    %y1 = mt.matmul %y0, %w1 {mt.layer = 1 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %o = mt.param_ref @out.weight : tensor<32x8xf32>
    %logits = mt.matmul %y1, %o : (tensor<2x4x8xf32>, tensor<32x8xf32>) -> tensor<2x4x32xf32>
    %loss = mt.cross_entropy %logits, %labels : (tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}
