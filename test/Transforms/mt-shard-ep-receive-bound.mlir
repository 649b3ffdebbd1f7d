// mt-shard-ep with mt.parallel's moe_dispatch_buffer_factor f: the received
// rows R are bounded at ceil(f x T x k), f times the balanced load, when
// that is below the worst case ep x T x min(k, L) (here T = 8 tokens, k = 2,
// ep 2, L = 2: worst 32 rows, balanced 16); the dispatch keeps the worst
// case in mt.worst_case_rows for the memory report.
// RUN: mtc-opt %s -split-input-file -mt-shard-ep -verify-diagnostics | FileCheck %s

// 1.25 x 16 = 20 rows.
// CHECK-LABEL: module attributes
// CHECK: mt.moe_dispatch {{.*}} {ep_size = 2 : i64, mt.layer = 0 : i64, mt.worst_case_rows = 32 : i64, num_local_experts = 2 : i64} : (tensor<16x8xf32>, tensor<4xi32>) -> (tensor<20x8xf32>, tensor<2xi32>, tensor<2x2xi32>)
// CHECK: mt.moe_grouped_matmul {{.*}} -> tensor<20x32xf32>
// CHECK: mt.moe_combine {{.*}} : (tensor<20x8xf32>, tensor<2x2xi32>, tensor<4xi32>) -> tensor<16x8xf32>
module attributes {mt.parallel = {data_parallel_size = 2 : i64, expert_model_parallel_size = 2 : i64, expert_tensor_parallel_size = 1 : i64, moe_dispatch_buffer_factor = 1.25 : f64, moe_token_dispatcher_type = "alltoall", pipeline_model_parallel_size = 1 : i64, sequence_parallel = false, tensor_model_parallel_size = 1 : i64}} {
  mt.param @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<4x32x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<4x8x16xf32>, normal(1.000000e-02)
  func.func @forward(%x: tensor<2x4x8xf32> {mt.name = "x"}) -> (tensor<2x4x8xf32>, tensor<f32>) {
    %xf = mt.reshape %x : (tensor<2x4x8xf32>) -> tensor<8x8xf32>
    %wr = mt.param_ref @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>
    %logits = mt.matmul %xf, %wr : (tensor<8x8xf32>, tensor<4x8xf32>) -> tensor<8x4xf32>
    %p, %m, %aux, %z = mt.moe_router %logits softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 4 : i64, topk = 2 : i64, z_loss_coeff = 1.0e-03 : f64} : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x4xi32>, tensor<f32>, tensor<f32>)
    %y, %rows, %n = mt.moe_permute %xf, %m {capacity = 0 : i64, mt.layer = 0 : i64} : (tensor<8x8xf32>, tensor<8x4xi32>) -> (tensor<16x8xf32>, tensor<16xi32>, tensor<4xi32>)
    %w1 = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<4x32x8xf32>
    %h = mt.moe_grouped_matmul %y, %w1, %n : (tensor<16x8xf32>, tensor<4x32x8xf32>, tensor<4xi32>) -> tensor<16x32xf32>
    %a = mt.swiglu %h : (tensor<16x32xf32>) -> tensor<16x16xf32>
    %w2 = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<4x8x16xf32>
    %h2 = mt.moe_grouped_matmul %a, %w2, %n : (tensor<16x16xf32>, tensor<4x8x16xf32>, tensor<4xi32>) -> tensor<16x8xf32>
    %o = mt.moe_unpermute %h2, %p, %rows, %n {mt.layer = 0 : i64} : (tensor<16x8xf32>, tensor<8x4xf32>, tensor<16xi32>, tensor<4xi32>) -> tensor<8x8xf32>
    %o3 = mt.reshape %o : (tensor<8x8xf32>) -> tensor<2x4x8xf32>
    return %o3, %aux : tensor<2x4x8xf32>, tensor<f32>
  }
}

// -----

// 3 x 16 = 48 rows is more than the worst case: R stays 32, unmarked.
// CHECK-LABEL: module attributes
// CHECK: mt.moe_dispatch {{.*}} {ep_size = 2 : i64, mt.layer = 0 : i64, num_local_experts = 2 : i64} : (tensor<16x8xf32>, tensor<4xi32>) -> (tensor<32x8xf32>, tensor<2xi32>, tensor<2x2xi32>)
module attributes {mt.parallel = {data_parallel_size = 2 : i64, expert_model_parallel_size = 2 : i64, expert_tensor_parallel_size = 1 : i64, moe_dispatch_buffer_factor = 3.0 : f64, moe_token_dispatcher_type = "alltoall", pipeline_model_parallel_size = 1 : i64, sequence_parallel = false, tensor_model_parallel_size = 1 : i64}} {
  mt.param @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<4x32x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<4x8x16xf32>, normal(1.000000e-02)
  func.func @forward(%x: tensor<2x4x8xf32> {mt.name = "x"}) -> (tensor<2x4x8xf32>, tensor<f32>) {
    %xf = mt.reshape %x : (tensor<2x4x8xf32>) -> tensor<8x8xf32>
    %wr = mt.param_ref @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>
    %logits = mt.matmul %xf, %wr : (tensor<8x8xf32>, tensor<4x8xf32>) -> tensor<8x4xf32>
    %p, %m, %aux, %z = mt.moe_router %logits softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 4 : i64, topk = 2 : i64, z_loss_coeff = 1.0e-03 : f64} : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x4xi32>, tensor<f32>, tensor<f32>)
    %y, %rows, %n = mt.moe_permute %xf, %m {capacity = 0 : i64, mt.layer = 0 : i64} : (tensor<8x8xf32>, tensor<8x4xi32>) -> (tensor<16x8xf32>, tensor<16xi32>, tensor<4xi32>)
    %w1 = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<4x32x8xf32>
    %h = mt.moe_grouped_matmul %y, %w1, %n : (tensor<16x8xf32>, tensor<4x32x8xf32>, tensor<4xi32>) -> tensor<16x32xf32>
    %a = mt.swiglu %h : (tensor<16x32xf32>) -> tensor<16x16xf32>
    %w2 = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<4x8x16xf32>
    %h2 = mt.moe_grouped_matmul %a, %w2, %n : (tensor<16x16xf32>, tensor<4x8x16xf32>, tensor<4xi32>) -> tensor<16x8xf32>
    %o = mt.moe_unpermute %h2, %p, %rows, %n {mt.layer = 0 : i64} : (tensor<16x8xf32>, tensor<8x4xf32>, tensor<16xi32>, tensor<4xi32>) -> tensor<8x8xf32>
    %o3 = mt.reshape %o : (tensor<8x8xf32>) -> tensor<2x4x8xf32>
    return %o3, %aux : tensor<2x4x8xf32>, tensor<f32>
  }
}

// -----

// Below the balanced load every uneven routing would overflow.
// expected-error @+1 {{mt-shard-ep: mt.parallel.moe_dispatch_buffer_factor must be at least 1 (the balanced load)}}
module attributes {mt.parallel = {data_parallel_size = 2 : i64, expert_model_parallel_size = 2 : i64, expert_tensor_parallel_size = 1 : i64, moe_dispatch_buffer_factor = 0.5 : f64, moe_token_dispatcher_type = "alltoall", pipeline_model_parallel_size = 1 : i64, sequence_parallel = false, tensor_model_parallel_size = 1 : i64}} {
  mt.param @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<4x32x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<4x8x16xf32>, normal(1.000000e-02)
  func.func @forward(%x: tensor<2x4x8xf32> {mt.name = "x"}) -> (tensor<2x4x8xf32>, tensor<f32>) {
    %xf = mt.reshape %x : (tensor<2x4x8xf32>) -> tensor<8x8xf32>
    %wr = mt.param_ref @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>
    %logits = mt.matmul %xf, %wr : (tensor<8x8xf32>, tensor<4x8xf32>) -> tensor<8x4xf32>
    %p, %m, %aux, %z = mt.moe_router %logits softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 4 : i64, topk = 2 : i64, z_loss_coeff = 1.0e-03 : f64} : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x4xi32>, tensor<f32>, tensor<f32>)
    %y, %rows, %n = mt.moe_permute %xf, %m {capacity = 0 : i64, mt.layer = 0 : i64} : (tensor<8x8xf32>, tensor<8x4xi32>) -> (tensor<16x8xf32>, tensor<16xi32>, tensor<4xi32>)
    %w1 = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<4x32x8xf32>
    %h = mt.moe_grouped_matmul %y, %w1, %n : (tensor<16x8xf32>, tensor<4x32x8xf32>, tensor<4xi32>) -> tensor<16x32xf32>
    %a = mt.swiglu %h : (tensor<16x32xf32>) -> tensor<16x16xf32>
    %w2 = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<4x8x16xf32>
    %h2 = mt.moe_grouped_matmul %a, %w2, %n : (tensor<16x16xf32>, tensor<4x8x16xf32>, tensor<4xi32>) -> tensor<16x8xf32>
    %o = mt.moe_unpermute %h2, %p, %rows, %n {mt.layer = 0 : i64} : (tensor<16x8xf32>, tensor<8x4xf32>, tensor<16xi32>, tensor<4xi32>) -> tensor<8x8xf32>
    %o3 = mt.reshape %o : (tensor<8x8xf32>) -> tensor<2x4x8xf32>
    return %o3, %aux : tensor<2x4x8xf32>, tensor<f32>
  }
}
