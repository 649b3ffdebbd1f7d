// mt-shard-ep refuses what it cannot split, naming the setting to change.
// RUN: mtc-opt %s -split-input-file -mt-shard-ep -verify-diagnostics

// Each expert's FC1 halves split evenly over expert-tensor-parallel ranks.
module attributes {mt.parallel = {data_parallel_size = 6 : i64, expert_model_parallel_size = 2 : i64, expert_tensor_parallel_size = 3 : i64, moe_token_dispatcher_type = "alltoall", pipeline_model_parallel_size = 1 : i64, sequence_parallel = false, tensor_model_parallel_size = 1 : i64}} {
  mt.param @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>, normal(2.000000e-02)
  // expected-error @+1 {{mt-shard-ep: dimension 1 of decoder.layers.0.mlp.experts.linear_fc1.weight (32, gate and up halves) is not divisible by 2 x expert_tensor_parallel_size 3; use an expert_tensor_parallel_size dividing moe_ffn_hidden_size}}
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

// Expert tensor parallelism splits a two-matmul expert; a third matmul has no
// place in it.
module attributes {mt.parallel = {data_parallel_size = 4 : i64, expert_model_parallel_size = 2 : i64, expert_tensor_parallel_size = 2 : i64, moe_token_dispatcher_type = "alltoall", pipeline_model_parallel_size = 1 : i64, sequence_parallel = false, tensor_model_parallel_size = 1 : i64}} {
  mt.param @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<4x32x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.experts.linear_mid.weight : tensor<4x16x16xf32>, normal(1.000000e-02)
  mt.param @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<4x8x16xf32>, normal(1.000000e-02)
  func.func @forward(%x: tensor<2x4x8xf32> {mt.name = "x"}) -> (tensor<2x4x8xf32>, tensor<f32>) {
    %xf = mt.reshape %x : (tensor<2x4x8xf32>) -> tensor<8x8xf32>
    %wr = mt.param_ref @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>
    %logits = mt.matmul %xf, %wr : (tensor<8x8xf32>, tensor<4x8xf32>) -> tensor<8x4xf32>
    %p, %m, %aux, %z = mt.moe_router %logits softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 4 : i64, topk = 2 : i64, z_loss_coeff = 1.0e-03 : f64} : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x4xi32>, tensor<f32>, tensor<f32>)
    %y, %rows, %n = mt.moe_permute %xf, %m {capacity = 0 : i64, mt.layer = 0 : i64} : (tensor<8x8xf32>, tensor<8x4xi32>) -> (tensor<16x8xf32>, tensor<16xi32>, tensor<4xi32>)
    %w1 = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<4x32x8xf32>
    %h = mt.moe_grouped_matmul %y, %w1, %n : (tensor<16x8xf32>, tensor<4x32x8xf32>, tensor<4xi32>) -> tensor<16x32xf32>
    %a0 = mt.swiglu %h : (tensor<16x32xf32>) -> tensor<16x16xf32>
    %wm = mt.param_ref @decoder.layers.0.mlp.experts.linear_mid.weight : tensor<4x16x16xf32>
    // expected-error @+1 {{mt-shard-ep: expert_tensor_parallel_size 2 splits an expert's first matmul (on the permuted rows) and its second (read by mt.moe_unpermute); this one is neither; set expert_tensor_parallel_size = 1}}
    %hm = mt.moe_grouped_matmul %a0, %wm, %n : (tensor<16x16xf32>, tensor<4x16x16xf32>, tensor<4xi32>) -> tensor<16x16xf32>
    %a = mt.gelu %hm tanh : tensor<16x16xf32>
    %w2 = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<4x8x16xf32>
    %h2 = mt.moe_grouped_matmul %a, %w2, %n : (tensor<16x16xf32>, tensor<4x8x16xf32>, tensor<4xi32>) -> tensor<16x8xf32>
    %o = mt.moe_unpermute %h2, %p, %rows, %n {mt.layer = 0 : i64} : (tensor<16x8xf32>, tensor<8x4xf32>, tensor<16xi32>, tensor<4xi32>) -> tensor<8x8xf32>
    %o3 = mt.reshape %o : (tensor<8x8xf32>) -> tensor<2x4x8xf32>
    return %o3, %aux : tensor<2x4x8xf32>, tensor<f32>
  }
}

// -----

// expected-error @+1 {{mt-shard-ep: mt.parallel.moe_token_dispatcher_type is "flex"; expected "alltoall" or "allgather"}}
module attributes {mt.parallel = {data_parallel_size = 2 : i64, expert_model_parallel_size = 2 : i64, expert_tensor_parallel_size = 1 : i64, moe_token_dispatcher_type = "flex", pipeline_model_parallel_size = 1 : i64, sequence_parallel = false, tensor_model_parallel_size = 1 : i64}} {
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

module attributes {mt.parallel = {data_parallel_size = 2 : i64, expert_model_parallel_size = 4 : i64, expert_tensor_parallel_size = 1 : i64, moe_token_dispatcher_type = "alltoall", pipeline_model_parallel_size = 1 : i64, sequence_parallel = false, tensor_model_parallel_size = 1 : i64}} {
  mt.param @decoder.layers.0.mlp.router.weight : tensor<6x8xf32>, normal(2.000000e-02)
  // expected-error @+1 {{mt-shard-ep: decoder.layers.0.mlp.experts.linear_fc1.weight stacks 6 experts, not divisible by expert_model_parallel_size 4}}
  mt.param @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<6x32x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<6x8x16xf32>, normal(1.000000e-02)
  func.func @forward(%x: tensor<2x4x8xf32> {mt.name = "x"}) -> (tensor<2x4x8xf32>, tensor<f32>) {
    %xf = mt.reshape %x : (tensor<2x4x8xf32>) -> tensor<8x8xf32>
    %wr = mt.param_ref @decoder.layers.0.mlp.router.weight : tensor<6x8xf32>
    %logits = mt.matmul %xf, %wr : (tensor<8x8xf32>, tensor<6x8xf32>) -> tensor<8x6xf32>
    %p, %m, %aux, %z = mt.moe_router %logits softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 4 : i64, topk = 2 : i64, z_loss_coeff = 1.0e-03 : f64} : (tensor<8x6xf32>) -> (tensor<8x6xf32>, tensor<8x6xi32>, tensor<f32>, tensor<f32>)
    %y, %rows, %n = mt.moe_permute %xf, %m {capacity = 0 : i64, mt.layer = 0 : i64} : (tensor<8x8xf32>, tensor<8x6xi32>) -> (tensor<16x8xf32>, tensor<16xi32>, tensor<6xi32>)
    %w1 = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<6x32x8xf32>
    %h = mt.moe_grouped_matmul %y, %w1, %n : (tensor<16x8xf32>, tensor<6x32x8xf32>, tensor<6xi32>) -> tensor<16x32xf32>
    %a = mt.swiglu %h : (tensor<16x32xf32>) -> tensor<16x16xf32>
    %w2 = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<6x8x16xf32>
    %h2 = mt.moe_grouped_matmul %a, %w2, %n : (tensor<16x16xf32>, tensor<6x8x16xf32>, tensor<6xi32>) -> tensor<16x8xf32>
    %o = mt.moe_unpermute %h2, %p, %rows, %n {mt.layer = 0 : i64} : (tensor<16x8xf32>, tensor<8x6xf32>, tensor<16xi32>, tensor<6xi32>) -> tensor<8x8xf32>
    %o3 = mt.reshape %o : (tensor<8x8xf32>) -> tensor<2x4x8xf32>
    return %o3, %aux : tensor<2x4x8xf32>, tensor<f32>
  }
}

// -----

module attributes {mt.parallel = {data_parallel_size = 2 : i64, expert_model_parallel_size = 2 : i64, expert_tensor_parallel_size = 1 : i64, moe_token_dispatcher_type = "alltoall", pipeline_model_parallel_size = 1 : i64, sequence_parallel = false, tensor_model_parallel_size = 1 : i64}} {
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
    // expected-error @+1 {{mt-shard-ep: does not know how to run 'mt.dropout' on the rows of other expert-parallel ranks}}
    %ln = mt.dropout %h {rate = 1.000000e-01 : f64, stream = 0 : i64} : tensor<16x32xf32>
    %a = mt.swiglu %ln : (tensor<16x32xf32>) -> tensor<16x16xf32>
    %w2 = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<4x8x16xf32>
    %h2 = mt.moe_grouped_matmul %a, %w2, %n : (tensor<16x16xf32>, tensor<4x8x16xf32>, tensor<4xi32>) -> tensor<16x8xf32>
    %o = mt.moe_unpermute %h2, %p, %rows, %n {mt.layer = 0 : i64} : (tensor<16x8xf32>, tensor<8x4xf32>, tensor<16xi32>, tensor<4xi32>) -> tensor<8x8xf32>
    %o3 = mt.reshape %o : (tensor<8x8xf32>) -> tensor<2x4x8xf32>
    return %o3, %aux : tensor<2x4x8xf32>, tensor<f32>
  }
}