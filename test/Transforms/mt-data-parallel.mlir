// mt-data-parallel: buckets of gradients reduced over the dp group, scaled
// by 1/dp; the distributed optimizer's sharded norm, AdamW and all-gather.
// RUN: mtc-opt %s -split-input-file -mt-data-parallel | FileCheck %s --enable-var-scope

// Without overlap: one bucket (Megatron's rule), reduced at the start of
// @grad_norm; parameters listed last first.
// CHECK-LABEL: module attributes
// CHECK-SAME: mt.data_parallel = 4 : i64
// CHECK-SAME: mt.grad_buckets = [{group = "dp", params = [@b, @a]}]
// CHECK-NOT: train_step_last
// CHECK: func.func @grad_norm() -> tensor<f32> {
// CHECK-NEXT: mt.reduce_grads {bucket = 0 : i64, group = "dp", scale = 2.500000e-01 : f64, scatter = false}
// CHECK-NEXT: mt.grad_norm
module attributes {mt.parallel = {data_parallel_size = 4 : i64, pipeline_model_parallel_size = 1 : i64, tensor_model_parallel_size = 1 : i64, use_distributed_optimizer = false}} {
  mt.param @a : tensor<8x4xf32>, normal(2.000000e-02)
  mt.param @b : tensor<4x4xf32>, normal(2.000000e-02)
  func.func @grad_norm() -> tensor<f32> {
    %0 = mt.grad_norm : tensor<f32>
    return %0 : tensor<f32>
  }
}

// -----

// One rank: nothing to reduce.
// CHECK-LABEL: module attributes
// CHECK-NOT: mt.data_parallel
// CHECK-NOT: mt.reduce_grads
module attributes {mt.parallel = {data_parallel_size = 1 : i64, pipeline_model_parallel_size = 1 : i64, tensor_model_parallel_size = 1 : i64, use_distributed_optimizer = false}} {
  func.func @grad_norm() -> tensor<f32> {
    %0 = mt.grad_norm : tensor<f32>
    return %0 : tensor<f32>
  }
}

// -----

// Overlap with buckets of at least 16 elements: @b (16) alone, then @a.
// @train_step_last reduces each bucket right after the op that completes
// its gradients; @train_step stays as it was.
// CHECK-LABEL: module attributes
// CHECK-SAME: mt.grad_buckets = [{group = "dp", params = [@b]}, {group = "dp", params = [@a]}]
// CHECK: func.func @train_step(
// CHECK-NOT: mt.reduce_grads
// CHECK: return
// CHECK: func.func @train_step_last(
// CHECK: mt.matmul_weight_grad {{.*}} into @b
// CHECK-NEXT: mt.reduce_grads {bucket = 0 : i64, group = "dp", scale = 5.000000e-01 : f64, scatter = false}
// CHECK-NEXT: mt.matmul_input_grad
// CHECK-NEXT: mt.matmul_weight_grad {{.*}} into @a
// CHECK-NEXT: mt.reduce_grads {bucket = 1 : i64, group = "dp", scale = 5.000000e-01 : f64, scatter = false}
// CHECK-NEXT: mt.grad_seed
// CHECK: func.func @grad_norm
// CHECK-NEXT: mt.grad_norm
module attributes {mt.parallel = {data_parallel_size = 2 : i64, pipeline_model_parallel_size = 1 : i64, tensor_model_parallel_size = 1 : i64, use_distributed_optimizer = false, overlap_grad_reduce = true, ddp_bucket_size = 16 : i64}} {
  mt.param @a : tensor<8x4xf32>, normal(2.000000e-02)
  mt.param @b : tensor<4x4xf32>, normal(2.000000e-02)
  func.func @train_step(%x: tensor<2x4xf32>, %dy: tensor<2x4xf32>, %dh: tensor<2x8xf32>) -> tensor<f32> {
    %wb = mt.param_ref @b : tensor<4x4xf32>
    mt.matmul_weight_grad %dy, %x into @b : tensor<2x4xf32>, tensor<2x4xf32>
    %dx = mt.matmul_input_grad %dy, %wb : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
    mt.matmul_weight_grad %dh, %dx into @a : tensor<2x8xf32>, tensor<2x4xf32>
    %s = mt.grad_seed {scale = 1.000000e+00 : f64} : tensor<f32>
    return %s : tensor<f32>
  }
  func.func @grad_norm() -> tensor<f32> {
    %0 = mt.grad_norm : tensor<f32>
    return %0 : tensor<f32>
  }
  func.func @optimizer_step() {
    return
  }
}

// -----

// The distributed optimizer: reduce-scatters, the sharded norm, one
// sharded AdamW and all-gather per bucket; decay recorded per parameter.
// CHECK-LABEL: module attributes
// CHECK-SAME: mt.distributed_optimizer
// CHECK: mt.param @a {{.*}}mt.weight_decay = true
// CHECK: mt.param @b {{.*}}mt.weight_decay = false
// CHECK: func.func @grad_norm() -> tensor<f32> {
// CHECK-NEXT: mt.reduce_grads {bucket = 0 : i64, group = "dp", scale = 2.500000e-01 : f64, scatter = true}
// CHECK-NEXT: %[[N:.*]] = mt.sharded_grad_norm {group = "dp"} : tensor<f32>
// CHECK-NEXT: return %[[N]]
// CHECK: func.func @optimizer_step(%[[LR:[a-z0-9]+]]: tensor<f32>, %[[CLIP:[a-z0-9]+]]: tensor<f32>, %[[STEP:[a-z0-9]+]]: tensor<i64>)
// CHECK-NEXT: mt.sharded_adamw %[[LR]], %[[CLIP]], %[[STEP]] {beta1 = 9.000000e-01 : f64, beta2 = 0.94999999999999996 : f64, bucket = 0 : i64, epsilon = 1.000000e-08 : f64, weight_decay = 1.000000e-01 : f64}
// CHECK-NEXT: mt.all_gather_params {bucket = 0 : i64, group = "dp"}
// CHECK-NEXT: return
module attributes {mt.parallel = {data_parallel_size = 4 : i64, pipeline_model_parallel_size = 1 : i64, tensor_model_parallel_size = 1 : i64, use_distributed_optimizer = true}} {
  mt.param @a : tensor<8x4xf32>, normal(2.000000e-02)
  mt.param @b : tensor<4xf32>, zeros
  func.func @grad_norm() -> tensor<f32> {
    %0 = mt.grad_norm : tensor<f32>
    return %0 : tensor<f32>
  }
  func.func @optimizer_step(%lr: tensor<f32>, %clip: tensor<f32>, %step: tensor<i64>) {
    mt.adamw @a, %lr, %clip, %step {beta1 = 9.000000e-01 : f64, beta2 = 9.500000e-01 : f64, epsilon = 1.000000e-08 : f64, weight_decay = 1.000000e-01 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
    mt.adamw @b, %lr, %clip, %step {beta1 = 9.000000e-01 : f64, beta2 = 9.500000e-01 : f64, epsilon = 1.000000e-08 : f64, weight_decay = 0.000000e+00 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
    return
  }
}

// -----

// SGD (--optimizer sgd): one sharded SGD per bucket with the momentum.
// CHECK-LABEL: module attributes
// CHECK-SAME: mt.distributed_optimizer
// CHECK: mt.param @a {{.*}}mt.weight_decay = true
// CHECK: mt.param @b {{.*}}mt.weight_decay = false
// CHECK: func.func @optimizer_step(%[[LR:[a-z0-9]+]]: tensor<f32>, %[[CLIP:[a-z0-9]+]]: tensor<f32>)
// CHECK-NEXT: mt.sharded_sgd %[[LR]], %[[CLIP]] {bucket = 0 : i64, momentum = 8.000000e-01 : f64, weight_decay = 1.000000e-01 : f64} : tensor<f32>, tensor<f32>
// CHECK-NEXT: mt.all_gather_params {bucket = 0 : i64, group = "dp"}
// CHECK-NEXT: return
module attributes {mt.parallel = {data_parallel_size = 4 : i64, pipeline_model_parallel_size = 1 : i64, tensor_model_parallel_size = 1 : i64, use_distributed_optimizer = true}} {
  mt.param @a : tensor<8x4xf32>, normal(2.000000e-02)
  mt.param @b : tensor<4xf32>, zeros
  func.func @grad_norm() -> tensor<f32> {
    %0 = mt.grad_norm : tensor<f32>
    return %0 : tensor<f32>
  }
  func.func @optimizer_step(%lr: tensor<f32>, %clip: tensor<f32>) {
    mt.sgd @a, %lr, %clip {momentum = 8.000000e-01 : f64, weight_decay = 1.000000e-01 : f64} : tensor<f32>, tensor<f32>
    mt.sgd @b, %lr, %clip {momentum = 8.000000e-01 : f64, weight_decay = 0.000000e+00 : f64} : tensor<f32>, tensor<f32>
    return
  }
}

// -----

// overlap_param_gather: the optimizer step gathers nothing; the first
// micro-batch's copy of the step opens with every bucket's gather in the
// order the step first reads the bucket's weights (@a's bucket 1, then
// @b's bucket 0); @gather_params holds them all for evaluation and saves.
// CHECK-LABEL: module attributes
// CHECK-SAME: mt.grad_buckets = [{group = "dp", params = [@b]}, {group = "dp", params = [@a]}]
// CHECK: func.func @train_step_first(
// CHECK-NEXT: mt.all_gather_params {bucket = 1 : i64, group = "dp"}
// CHECK-NEXT: mt.all_gather_params {bucket = 0 : i64, group = "dp"}
// CHECK-NEXT: mt.param_ref @a
// CHECK-NOT: mt.reduce_grads
// CHECK: func.func @train_step(
// CHECK-NOT: mt.all_gather_params
// CHECK-NOT: mt.reduce_grads
// CHECK: func.func @train_step_last(
// CHECK-NOT: mt.all_gather_params
// CHECK: mt.reduce_grads {bucket = 0
// CHECK: mt.reduce_grads {bucket = 1
// CHECK: func.func @optimizer_step(
// CHECK-NEXT: mt.sharded_adamw {{.*}}bucket = 0
// CHECK-NEXT: mt.sharded_adamw {{.*}}bucket = 1
// CHECK-NEXT: return
// CHECK: func.func @gather_params() {
// CHECK-NEXT: mt.all_gather_params {bucket = 0 : i64, group = "dp"}
// CHECK-NEXT: mt.all_gather_params {bucket = 1 : i64, group = "dp"}
// CHECK-NEXT: return
module attributes {mt.parallel = {data_parallel_size = 2 : i64, pipeline_model_parallel_size = 1 : i64, tensor_model_parallel_size = 1 : i64, use_distributed_optimizer = true, overlap_grad_reduce = true, overlap_param_gather = true, ddp_bucket_size = 16 : i64}, mt.training = {num_micro_batches = 2 : i64}} {
  mt.param @a : tensor<8x4xf32>, normal(2.000000e-02)
  mt.param @b : tensor<4x4xf32>, normal(2.000000e-02)
  func.func @train_step(%x: tensor<2x4xf32>, %dy: tensor<2x4xf32>, %dh: tensor<2x8xf32>) -> tensor<f32> {
    %wa = mt.param_ref @a : tensor<8x4xf32>
    %wb = mt.param_ref @b : tensor<4x4xf32>
    %t = mt.matmul_input_grad %dh, %wa : (tensor<2x8xf32>, tensor<8x4xf32>) -> tensor<2x4xf32>
    mt.matmul_weight_grad %dy, %t into @b : tensor<2x4xf32>, tensor<2x4xf32>
    %dx = mt.matmul_input_grad %dy, %wb : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
    mt.matmul_weight_grad %dh, %dx into @a : tensor<2x8xf32>, tensor<2x4xf32>
    %s = mt.grad_seed {scale = 1.000000e+00 : f64} : tensor<f32>
    return %s : tensor<f32>
  }
  func.func @grad_norm() -> tensor<f32> {
    %0 = mt.grad_norm : tensor<f32>
    return %0 : tensor<f32>
  }
  func.func @optimizer_step(%lr: tensor<f32>, %clip: tensor<f32>, %step: tensor<i64>) {
    mt.adamw @a, %lr, %clip, %step {beta1 = 9.000000e-01 : f64, beta2 = 9.500000e-01 : f64, epsilon = 1.000000e-08 : f64, weight_decay = 1.000000e-01 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
    mt.adamw @b, %lr, %clip, %step {beta1 = 9.000000e-01 : f64, beta2 = 9.500000e-01 : f64, epsilon = 1.000000e-08 : f64, weight_decay = 1.000000e-01 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
    return
  }
}

// -----

// overlap_param_gather with one micro-batch: it is the first and the last,
// so @train_step_last opens with the gathers and reduces as it goes.
// CHECK-LABEL: module attributes
// CHECK-NOT: func.func @train_step_first
// CHECK: func.func @train_step(
// CHECK-NOT: mt.all_gather_params
// CHECK: func.func @train_step_last(
// CHECK-NEXT: mt.all_gather_params {bucket = 0 : i64, group = "dp"}
// CHECK-NEXT: mt.param_ref @a
// CHECK: mt.reduce_grads {bucket = 0
// CHECK: func.func @optimizer_step(
// CHECK-NOT: mt.all_gather_params
// CHECK: func.func @gather_params() {
// CHECK-NEXT: mt.all_gather_params {bucket = 0 : i64, group = "dp"}
// CHECK-NEXT: return
module attributes {mt.parallel = {data_parallel_size = 2 : i64, pipeline_model_parallel_size = 1 : i64, tensor_model_parallel_size = 1 : i64, use_distributed_optimizer = true, overlap_grad_reduce = true, overlap_param_gather = true}, mt.training = {num_micro_batches = 1 : i64}} {
  mt.param @a : tensor<8x4xf32>, normal(2.000000e-02)
  func.func @train_step(%dy: tensor<2x4xf32>, %dh: tensor<2x8xf32>) -> tensor<f32> {
    %wa = mt.param_ref @a : tensor<8x4xf32>
    %t = mt.matmul_input_grad %dh, %wa : (tensor<2x8xf32>, tensor<8x4xf32>) -> tensor<2x4xf32>
    mt.matmul_weight_grad %dh, %t into @a : tensor<2x8xf32>, tensor<2x4xf32>
    %s = mt.grad_seed {scale = 1.000000e+00 : f64} : tensor<f32>
    return %s : tensor<f32>
  }
  func.func @grad_norm() -> tensor<f32> {
    %0 = mt.grad_norm : tensor<f32>
    return %0 : tensor<f32>
  }
  func.func @optimizer_step(%lr: tensor<f32>, %clip: tensor<f32>, %step: tensor<i64>) {
    mt.adamw @a, %lr, %clip, %step {beta1 = 9.000000e-01 : f64, beta2 = 9.500000e-01 : f64, epsilon = 1.000000e-08 : f64, weight_decay = 1.000000e-01 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
    return
  }
}

// -----

// A stacked weight [E, out, in] not marked mt.expert (mt-shard-ep marks the
// routed experts'; mt-data-parallel-experts.mlir) is one parameter like any other: its
// bucket (of at least 16 elements, so alone) is reduced right after the
// grouped matmul's weight gradient completes it, the distributed optimizer
// shards its flat elements, and it decays as every parameter of rank > 1.
// CHECK-LABEL: module attributes
// CHECK-SAME: mt.grad_buckets = [{group = "dp", params = [@experts]}, {group = "dp", params = [@router]}]
// CHECK: mt.param @experts : tensor<4x16x8xf32>, normal(2.000000e-02) {mt.weight_decay = true}
// CHECK: func.func @train_step_last(
// CHECK: mt.moe_grouped_matmul_weight_grad {{.*}} into @experts
// CHECK-NEXT: mt.reduce_grads {bucket = 0 : i64, group = "dp", scale = 5.000000e-01 : f64, scatter = true}
// CHECK: mt.matmul_weight_grad {{.*}} into @router
// CHECK-NEXT: mt.reduce_grads {bucket = 1 : i64, group = "dp", scale = 5.000000e-01 : f64, scatter = true}
// CHECK: func.func @optimizer_step
// CHECK: mt.sharded_adamw {{.*}}bucket = 0 : i64
// CHECK: mt.sharded_adamw {{.*}}bucket = 1 : i64
module attributes {mt.parallel = {data_parallel_size = 2 : i64, pipeline_model_parallel_size = 1 : i64, tensor_model_parallel_size = 1 : i64, use_distributed_optimizer = true, overlap_grad_reduce = true, ddp_bucket_size = 16 : i64}} {
  mt.param @router : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @experts : tensor<4x16x8xf32>, normal(2.000000e-02)
  func.func @train_step(%x: tensor<8x8xf32>, %dl: tensor<8x4xf32>, %y: tensor<16x8xf32>, %dh: tensor<16x16xf32>, %n: tensor<4xi32>) -> tensor<f32> {
    %seed = mt.grad_seed {scale = 1.0 : f64} : tensor<f32>
    mt.moe_grouped_matmul_weight_grad %dh, %y, %n into @experts : tensor<16x16xf32>, tensor<16x8xf32>, tensor<4xi32>
    mt.matmul_weight_grad %dl, %x into @router : tensor<8x4xf32>, tensor<8x8xf32>
    return %seed : tensor<f32>
  }
  func.func @grad_norm() -> tensor<f32> {
    %0 = mt.grad_norm : tensor<f32>
    return %0 : tensor<f32>
  }
  func.func @optimizer_step(%steps: tensor<i64>, %step: tensor<i64>, %norm: tensor<f32>, %scale: tensor<f32>) -> (tensor<f32>, tensor<f32>) {
    %lr = mt.lr_schedule %steps constant {lr = 1.0e-03 : f64, min_lr = 0.0 : f64, warmup_iters = 0 : i64, decay_iters = 10 : i64} : tensor<i64> -> tensor<f32>
    %c = mt.clip_coeff %norm, %scale {max_norm = 1.0 : f64} : tensor<f32>
    mt.adamw @router, %lr, %c, %step {beta1 = 0.9 : f64, beta2 = 0.999 : f64, epsilon = 1.0e-08 : f64, weight_decay = 0.01 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
    mt.adamw @experts, %lr, %c, %step {beta1 = 0.9 : f64, beta2 = 0.999 : f64, epsilon = 1.0e-08 : f64, weight_decay = 0.01 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
    return %lr, %lr : tensor<f32>, tensor<f32>
  }
}
