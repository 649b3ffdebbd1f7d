// mt-data-parallel with expert parameters (mt.expert): buckets of their own
// after the dense ones, reduced over expt_dp (edp = tp * dp / (etp * ep)
// ranks) with the dense scale 1/dp; the distributed optimizer shards them
// over expt_dp; nothing is gathered over a group of one rank, and a bucket
// over a group of one is "reduced" only for its scale.
// RUN: mtc-opt %s -split-input-file -mt-data-parallel | FileCheck %s --enable-var-scope

// ep 1, tp 1, dp 2: edp = 2. Dense parameters last first, then the experts
// last first; each bucket reduced over its group with scale 1/2.
// CHECK-LABEL: module attributes
// CHECK-SAME: mt.data_parallel = 2 : i64
// CHECK-SAME: mt.expert_data_parallel = 2 : i64
// CHECK-SAME: mt.grad_buckets = [{group = "dp", params = [@router, @ln]}, {group = "expt_dp", params = [@fc2, @fc1]}]
// CHECK: func.func @grad_norm() -> tensor<f32> {
// CHECK-NEXT: mt.reduce_grads {bucket = 0 : i64, group = "dp", scale = 5.000000e-01 : f64, scatter = false}
// CHECK-NEXT: mt.reduce_grads {bucket = 1 : i64, group = "expt_dp", scale = 5.000000e-01 : f64, scatter = false}
// CHECK-NEXT: mt.grad_norm
module attributes {mt.parallel = {data_parallel_size = 2 : i64, tensor_model_parallel_size = 1 : i64, expert_model_parallel_size = 1 : i64, expert_tensor_parallel_size = 1 : i64, use_distributed_optimizer = false}} {
  mt.param @ln : tensor<8xf32>, ones
  mt.param @router : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @fc1 : tensor<4x16x8xf32>, normal(2.000000e-02) {mt.expert}
  mt.param @fc2 : tensor<4x8x8xf32>, normal(2.000000e-02) {mt.expert}
  func.func @grad_norm() -> tensor<f32> {
    %0 = mt.grad_norm : tensor<f32>
    return %0 : tensor<f32>
  }
}

// -----

// dp 2 x ep 2 on 2 ranks: edp = 1, each rank holds its own experts. The
// expert bucket has no peer to sum with or gather from, but its gradient,
// which already sums both ranks' tokens, still takes the dense scale 1/dp
// (a reduction over a group of one rank); the distributed optimizer updates
// it whole (its shard is the whole bucket).
// CHECK-LABEL: module attributes
// CHECK-SAME: mt.distributed_optimizer
// CHECK-SAME: mt.expert_data_parallel = 1 : i64
// CHECK-SAME: mt.grad_buckets = [{group = "dp", params = [@router]}, {group = "expt_dp", params = [@fc1]}]
// CHECK: mt.param @fc1 {{.*}}mt.weight_decay = true
// CHECK: func.func @grad_norm() -> tensor<f32> {
// CHECK-NEXT: mt.reduce_grads {bucket = 0 : i64, group = "dp", scale = 5.000000e-01 : f64, scatter = true}
// CHECK-NEXT: mt.reduce_grads {bucket = 1 : i64, group = "expt_dp", scale = 5.000000e-01 : f64, scatter = true}
// CHECK-NEXT: mt.sharded_grad_norm {group = "dp"}
// CHECK: func.func @optimizer_step(
// CHECK-NEXT: mt.sharded_adamw {{.*}}bucket = 0 : i64
// CHECK-NEXT: mt.sharded_adamw {{.*}}bucket = 1 : i64
// CHECK-NEXT: mt.all_gather_params {bucket = 0 : i64, group = "dp"}
// CHECK-NEXT: return
module attributes {mt.parallel = {data_parallel_size = 2 : i64, tensor_model_parallel_size = 1 : i64, expert_model_parallel_size = 2 : i64, expert_tensor_parallel_size = 1 : i64, use_distributed_optimizer = true}} {
  mt.param @router : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @fc1 : tensor<2x16x8xf32>, normal(2.000000e-02) {mt.expert}
  func.func @grad_norm() -> tensor<f32> {
    %0 = mt.grad_norm : tensor<f32>
    return %0 : tensor<f32>
  }
  func.func @optimizer_step(%lr: tensor<f32>, %clip: tensor<f32>, %step: tensor<i64>) {
    mt.adamw @router, %lr, %clip, %step {beta1 = 9.000000e-01 : f64, beta2 = 9.500000e-01 : f64, epsilon = 1.000000e-08 : f64, weight_decay = 1.000000e-01 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
    mt.adamw @fc1, %lr, %clip, %step {beta1 = 9.000000e-01 : f64, beta2 = 9.500000e-01 : f64, epsilon = 1.000000e-08 : f64, weight_decay = 1.000000e-01 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
    return
  }
}

// -----

// tp 2 (sequence parallel), dp 1, ep 1: edp = 2, the tensor-parallel ranks
// hold the same experts and each saw its own sequence shard. Nothing is
// reduced over dp; the expert bucket is reduce-scattered over expt_dp with
// scale 1 (1/dp) and gathered back over it.
// CHECK-LABEL: module attributes
// CHECK-SAME: mt.data_parallel = 1 : i64
// CHECK-SAME: mt.distributed_optimizer
// CHECK-SAME: mt.expert_data_parallel = 2 : i64
// CHECK: func.func @grad_norm() -> tensor<f32> {
// CHECK-NEXT: mt.reduce_grads {bucket = 1 : i64, group = "expt_dp", scale = 1.000000e+00 : f64, scatter = true}
// CHECK-NEXT: mt.sharded_grad_norm
// CHECK: func.func @optimizer_step(
// CHECK-NEXT: mt.sharded_sgd {{.*}}bucket = 0 : i64
// CHECK-NEXT: mt.sharded_sgd {{.*}}bucket = 1 : i64
// CHECK-NEXT: mt.all_gather_params {bucket = 1 : i64, group = "expt_dp"}
// CHECK-NEXT: return
module attributes {mt.parallel = {data_parallel_size = 1 : i64, tensor_model_parallel_size = 2 : i64, expert_model_parallel_size = 1 : i64, expert_tensor_parallel_size = 1 : i64, use_distributed_optimizer = true}} {
  mt.param @router : tensor<4x8xf32>, normal(2.000000e-02) {mt.tp_partial_grad}
  mt.param @fc1 : tensor<4x16x8xf32>, normal(2.000000e-02) {mt.expert}
  func.func @grad_norm() -> tensor<f32> {
    %0 = mt.grad_norm : tensor<f32>
    return %0 : tensor<f32>
  }
  func.func @optimizer_step(%lr: tensor<f32>, %clip: tensor<f32>) {
    mt.sgd @router, %lr, %clip {momentum = 8.000000e-01 : f64, weight_decay = 1.000000e-01 : f64} : tensor<f32>, tensor<f32>
    mt.sgd @fc1, %lr, %clip {momentum = 8.000000e-01 : f64, weight_decay = 1.000000e-01 : f64} : tensor<f32>, tensor<f32>
    return
  }
}

// -----

// tp 1, dp 1, ep 1: one rank, nothing to reduce.
// CHECK-LABEL: module attributes
// CHECK-NOT: mt.grad_buckets
// CHECK-NOT: mt.reduce_grads
module attributes {mt.parallel = {data_parallel_size = 1 : i64, tensor_model_parallel_size = 1 : i64, expert_model_parallel_size = 1 : i64, expert_tensor_parallel_size = 1 : i64, use_distributed_optimizer = true}} {
  mt.param @fc1 : tensor<4x16x8xf32>, normal(2.000000e-02) {mt.expert}
  func.func @grad_norm() -> tensor<f32> {
    %0 = mt.grad_norm : tensor<f32>
    return %0 : tensor<f32>
  }
}

// -----

// tp 2 x dp 2 x ep 2 with overlap and the distributed optimizer: edp = 2.
// Buckets of at least 64 elements, experts apart from the dense ones
// (@fc2 alone, then @fc1; the router's 32 elements and the norm's in one
// dense bucket). Each reduction follows the op completing its bucket in
// @train_step_last; the expert ones over expt_dp with scale 1/dp.
// CHECK-LABEL: module attributes
// CHECK-SAME: mt.expert_data_parallel = 2 : i64
// CHECK-SAME: mt.grad_buckets = [{group = "dp", params = [@router, @ln]}, {group = "expt_dp", params = [@fc2]}, {group = "expt_dp", params = [@fc1]}]
// CHECK: func.func @train_step_last(
// CHECK: mt.moe_grouped_matmul_weight_grad {{.*}} into @fc2
// CHECK-NEXT: mt.reduce_grads {bucket = 1 : i64, group = "expt_dp", scale = 5.000000e-01 : f64, scatter = true}
// CHECK-NEXT: mt.moe_grouped_matmul_weight_grad {{.*}} into @fc1
// CHECK-NEXT: mt.reduce_grads {bucket = 2 : i64, group = "expt_dp", scale = 5.000000e-01 : f64, scatter = true}
// CHECK-NEXT: mt.matmul_weight_grad {{.*}} into @router
// CHECK-NEXT: mt.reduce_grads {bucket = 0 : i64, group = "dp", scale = 5.000000e-01 : f64, scatter = true}
// CHECK-NEXT: return
// CHECK: func.func @grad_norm
// CHECK-NEXT: mt.sharded_grad_norm
// CHECK: func.func @optimizer_step
// CHECK: mt.sharded_adamw {{.*}}bucket = 0 : i64
// CHECK-NEXT: mt.sharded_adamw {{.*}}bucket = 1 : i64
// CHECK-NEXT: mt.sharded_adamw {{.*}}bucket = 2 : i64
// CHECK-NEXT: mt.all_gather_params {bucket = 0 : i64, group = "dp"}
// CHECK-NEXT: mt.all_gather_params {bucket = 1 : i64, group = "expt_dp"}
// CHECK-NEXT: mt.all_gather_params {bucket = 2 : i64, group = "expt_dp"}
module attributes {mt.parallel = {data_parallel_size = 2 : i64, tensor_model_parallel_size = 2 : i64, expert_model_parallel_size = 2 : i64, expert_tensor_parallel_size = 1 : i64, use_distributed_optimizer = true, overlap_grad_reduce = true, ddp_bucket_size = 64 : i64}} {
  mt.param @ln : tensor<8xf32>, ones
  mt.param @router : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @fc1 : tensor<2x16x8xf32>, normal(2.000000e-02) {mt.expert}
  mt.param @fc2 : tensor<2x8x8xf32>, normal(2.000000e-02) {mt.expert}
  func.func @train_step(%x: tensor<8x8xf32>, %dl: tensor<8x4xf32>, %y: tensor<16x8xf32>, %h: tensor<16x8xf32>, %dh: tensor<16x16xf32>, %dz: tensor<16x8xf32>, %n: tensor<2xi32>) -> tensor<f32> {
    %seed = mt.grad_seed {scale = 1.0 : f64} : tensor<f32>
    mt.moe_grouped_matmul_weight_grad %dz, %h, %n into @fc2 : tensor<16x8xf32>, tensor<16x8xf32>, tensor<2xi32>
    mt.moe_grouped_matmul_weight_grad %dh, %y, %n into @fc1 : tensor<16x16xf32>, tensor<16x8xf32>, tensor<2xi32>
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
    mt.adamw @ln, %lr, %c, %step {beta1 = 0.9 : f64, beta2 = 0.999 : f64, epsilon = 1.0e-08 : f64, weight_decay = 0.0 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
    mt.adamw @router, %lr, %c, %step {beta1 = 0.9 : f64, beta2 = 0.999 : f64, epsilon = 1.0e-08 : f64, weight_decay = 0.01 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
    mt.adamw @fc1, %lr, %c, %step {beta1 = 0.9 : f64, beta2 = 0.999 : f64, epsilon = 1.0e-08 : f64, weight_decay = 0.01 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
    mt.adamw @fc2, %lr, %c, %step {beta1 = 0.9 : f64, beta2 = 0.999 : f64, epsilon = 1.0e-08 : f64, weight_decay = 0.01 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
    return %lr, %lr : tensor<f32>, tensor<f32>
  }
}

// -----

// overlap_param_gather with edp = 1 (dp 2 x ep 2): the first micro-batch
// gathers the dense bucket only; so does @gather_params.
// CHECK-LABEL: module attributes
// CHECK: func.func @train_step_first(
// CHECK-NEXT: mt.all_gather_params {bucket = 0 : i64, group = "dp"}
// CHECK-NEXT: mt.param_ref
// CHECK-NOT: mt.all_gather_params
// CHECK: func.func @gather_params() {
// CHECK-NEXT: mt.all_gather_params {bucket = 0 : i64, group = "dp"}
// CHECK-NEXT: return
module attributes {mt.parallel = {data_parallel_size = 2 : i64, tensor_model_parallel_size = 1 : i64, expert_model_parallel_size = 2 : i64, expert_tensor_parallel_size = 1 : i64, use_distributed_optimizer = true, overlap_grad_reduce = true, overlap_param_gather = true}, mt.training = {num_micro_batches = 2 : i64}} {
  mt.param @router : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @fc1 : tensor<2x16x8xf32>, normal(2.000000e-02) {mt.expert}
  func.func @train_step(%x: tensor<8x8xf32>, %dl: tensor<8x4xf32>, %y: tensor<16x8xf32>, %dh: tensor<16x16xf32>, %n: tensor<2xi32>) -> tensor<f32> {
    %w = mt.param_ref @fc1 : tensor<2x16x8xf32>
    %r = mt.param_ref @router : tensor<4x8xf32>
    %seed = mt.grad_seed {scale = 1.0 : f64} : tensor<f32>
    mt.moe_grouped_matmul_weight_grad %dh, %y, %n into @fc1 : tensor<16x16xf32>, tensor<16x8xf32>, tensor<2xi32>
    mt.matmul_weight_grad %dl, %x into @router : tensor<8x4xf32>, tensor<8x8xf32>
    return %seed : tensor<f32>
  }
  func.func @grad_norm() -> tensor<f32> {
    %0 = mt.grad_norm : tensor<f32>
    return %0 : tensor<f32>
  }
  func.func @optimizer_step(%lr: tensor<f32>, %clip: tensor<f32>, %step: tensor<i64>) {
    mt.adamw @router, %lr, %clip, %step {beta1 = 9.000000e-01 : f64, beta2 = 9.500000e-01 : f64, epsilon = 1.000000e-08 : f64, weight_decay = 1.000000e-01 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
    mt.adamw @fc1, %lr, %clip, %step {beta1 = 9.000000e-01 : f64, beta2 = 9.500000e-01 : f64, epsilon = 1.000000e-08 : f64, weight_decay = 1.000000e-01 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
    return
  }
}
