// mt-shard-tp errors: each names the op or parameter and what to change.
// RUN: mtc-opt %s -split-input-file -mt-shard-tp -verify-diagnostics

// expected-error @+1 {{mt-shard-tp: sequence_parallel needs tensor_model_parallel_size >= 2}}
module attributes {mt.parallel = {sequence_parallel = true, tensor_model_parallel_size = 1 : i64}} {
}

// -----

module attributes {mt.parallel = {sequence_parallel = false, tensor_model_parallel_size = 3 : i64}} {
  // expected-error @+1 {{mt-shard-tp: dimension 0 of decoder.layers.0.mlp.linear_fc1.weight is not divisible by tensor_model_parallel_size 3; choose sizes it divides}}
  mt.param @decoder.layers.0.mlp.linear_fc1.weight : tensor<32x8xf32>, normal(2.000000e-02)
  func.func @forward(%x: tensor<2x4x8xf32>) -> tensor<2x4x32xf32> {
    %w = mt.param_ref @decoder.layers.0.mlp.linear_fc1.weight : tensor<32x8xf32>
    %h = mt.matmul %x, %w : (tensor<2x4x8xf32>, tensor<32x8xf32>) -> tensor<2x4x32xf32>
    return %h : tensor<2x4x32xf32>
  }
}

// -----

module attributes {mt.parallel = {sequence_parallel = true, tensor_model_parallel_size = 2 : i64}} {
  mt.param @embedding.word_embeddings.weight : tensor<16x8xf32>, normal(2.000000e-02)
  func.func @forward(%tokens: tensor<2x3xi32>) -> tensor<2x3x8xf32> {
    %wt = mt.param_ref @embedding.word_embeddings.weight : tensor<16x8xf32>
    // expected-error @+1 {{mt-shard-tp: sequence parallelism splits dimension 1 over 2 ranks, but this value is 'tensor<2x3x8xf32>'}}
    %e = mt.embedding %wt, %tokens : (tensor<16x8xf32>, tensor<2x3xi32>) -> tensor<2x3x8xf32>
    return %e : tensor<2x3x8xf32>
  }
}

// -----

module attributes {mt.parallel = {sequence_parallel = false, tensor_model_parallel_size = 2 : i64}} {
  mt.param @decoder.layers.0.mlp.linear_fc2.weight : tensor<8x32xf32>, normal(2.000000e-02)
  func.func @forward(%x: tensor<2x4x32xf32>) -> tensor<2x4x8xf32> {
    %w = mt.param_ref @decoder.layers.0.mlp.linear_fc2.weight : tensor<8x32xf32>
    // expected-error @+1 {{mt-shard-tp: a row-parallel layer reads an activation that is not split by features}}
    %y = mt.matmul %x, %w : (tensor<2x4x32xf32>, tensor<8x32xf32>) -> tensor<2x4x8xf32>
    return %y : tensor<2x4x8xf32>
  }
}

// -----

// expected-error @+1 {{mt-shard-tp: the module has no func.func @forward; run it before mt-autodiff}}
module attributes {mt.parallel = {sequence_parallel = false, tensor_model_parallel_size = 2 : i64}} {
}

// -----

// Mixture-of-experts layers run tensor-parallel only on sequence shards (the
// spec refuses tensor_model_parallel_size > 1 with num_experts and without
// sequence_parallel before this).
module attributes {mt.parallel = {sequence_parallel = false, tensor_model_parallel_size = 2 : i64}} {
  mt.param @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>, normal(2.000000e-02)
  func.func @forward(%x: tensor<8x8xf32>) -> tensor<8x4xf32> {
    %w = mt.param_ref @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>
    %l = mt.matmul %x, %w : (tensor<8x8xf32>, tensor<4x8xf32>) -> tensor<8x4xf32>
    // expected-error @+1 {{mt-shard-tp: mixture-of-experts layers run tensor-parallel only on sequence shards; set sequence_parallel with tensor_model_parallel_size > 1 (Megatron refuses it too)}}
    %p, %m, %a, %z = mt.moe_router %l softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 4 : i64, topk = 2 : i64, z_loss_coeff = 0.0 : f64} : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x4xi32>, tensor<f32>, tensor<f32>)
    return %p : tensor<8x4xf32>
  }
}

