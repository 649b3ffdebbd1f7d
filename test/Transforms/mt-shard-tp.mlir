// mt-shard-tp: one tensor-parallel rank's program. Column-parallel FC1 and
// the vocabulary (embedding, tied output layer) split by rows, row-parallel
// FC2 by columns; tp_copy / tp_all_reduce where Megatron's mappings put them,
// a vocab-parallel embedding and cross-entropy.
// RUN: mtc-opt %s -split-input-file -mt-shard-tp | FileCheck %s --enable-var-scope

// CHECK-LABEL: module attributes
// CHECK-SAME: mt.tensor_parallel = 2 : i64
// CHECK: mt.param @embedding.word_embeddings.weight : tensor<8x8xf32>, normal(2.000000e-02) {tp_blocks = 1 : i64, tp_dim = 0 : i64, tp_size = 2 : i64}
// CHECK: mt.param @embedding.position_embeddings.weight : tensor<4x8xf32>, normal(2.000000e-02){{$}}
// CHECK: mt.param @decoder.layers.0.mlp.linear_fc1.weight : tensor<16x8xf32>, {{.*}}tp_dim = 0
// CHECK: mt.param @decoder.layers.0.mlp.linear_fc1.bias : tensor<16xf32>, zeros {{.*}}tp_dim = 0
// CHECK: mt.param @decoder.layers.0.mlp.linear_fc2.weight : tensor<8x16xf32>, {{.*}}tp_dim = 1
// CHECK: mt.param @decoder.layers.0.mlp.linear_fc2.bias : tensor<8xf32>, zeros{{$}}
// CHECK: %[[E:.*]] = mt.embedding %{{.*}}, %{{.*}} {vocab_parallel} : (tensor<8x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
// CHECK-NEXT: %[[ER:.*]] = mt.tp_all_reduce %[[E]] {tp_size = 2 : i64}
// CHECK: mt.add %[[ER]], %{{.*}} : tensor<2x4x8xf32>
// CHECK: %[[X:.*]] = mt.dropout %{{.*}} {rate = 1.000000e-01 : f64, stream = 0 : i64} : tensor<2x4x8xf32>
// CHECK: %[[C:.*]] = mt.tp_copy %[[X]] {tp_size = 2 : i64}
// CHECK-NEXT: mt.matmul %[[C]], %{{.*}} : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
// CHECK: mt.gelu %{{.*}} tanh : tensor<2x4x16xf32>
// CHECK: %[[P:.*]] = mt.matmul %{{.*}}, %{{.*}} : (tensor<2x4x16xf32>, tensor<8x16xf32>) -> tensor<2x4x8xf32>
// CHECK-NEXT: %[[R:.*]] = mt.tp_all_reduce %[[P]]
// CHECK: mt.bias_add %[[R]], %{{.*}} : tensor<2x4x8xf32>, tensor<8xf32>
// CHECK: mt.tp_copy
// CHECK-NEXT: mt.matmul %{{.*}} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
// CHECK-NEXT: mt.cross_entropy %{{.*}} {vocab_parallel} : (tensor<2x4x8xf32>, tensor<2x4xi32>) -> tensor<f32>
module attributes {mt.parallel = {data_parallel_size = 1 : i64, pipeline_model_parallel_size = 1 : i64, sequence_parallel = false, tensor_model_parallel_size = 2 : i64, use_distributed_optimizer = false}} {
  mt.param @embedding.word_embeddings.weight : tensor<16x8xf32>, normal(2.000000e-02)
  mt.param @embedding.position_embeddings.weight : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.linear_fc1.weight : tensor<32x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.linear_fc1.bias : tensor<32xf32>, zeros
  mt.param @decoder.layers.0.mlp.linear_fc2.weight : tensor<8x32xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.linear_fc2.bias : tensor<8xf32>, zeros
  mt.param @decoder.final_layernorm.weight : tensor<8xf32>, ones
  mt.param @decoder.final_layernorm.bias : tensor<8xf32>, zeros
  func.func @forward(%tokens: tensor<2x4xi32> {mt.name = "tokens"}, %labels: tensor<2x4xi32> {mt.name = "labels"}) -> tensor<f32> {
    %wt = mt.param_ref @embedding.word_embeddings.weight : tensor<16x8xf32>
    %e = mt.embedding %wt, %tokens : (tensor<16x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
    %wp = mt.param_ref @embedding.position_embeddings.weight : tensor<4x8xf32>
    %pos = mt.position_ids : tensor<2x4xi32>
    %pe = mt.embedding %wp, %pos : (tensor<4x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
    %x = mt.add %e, %pe : tensor<2x4x8xf32>
    %x0 = mt.dropout %x {rate = 1.000000e-01 : f64, stream = 0 : i64} : tensor<2x4x8xf32>
    %w1 = mt.param_ref @decoder.layers.0.mlp.linear_fc1.weight : tensor<32x8xf32>
    %h = mt.matmul %x0, %w1 : (tensor<2x4x8xf32>, tensor<32x8xf32>) -> tensor<2x4x32xf32>
    %b1 = mt.param_ref @decoder.layers.0.mlp.linear_fc1.bias : tensor<32xf32>
    %hb = mt.bias_add %h, %b1 : tensor<2x4x32xf32>, tensor<32xf32>
    %g = mt.gelu %hb tanh : tensor<2x4x32xf32>
    %w2 = mt.param_ref @decoder.layers.0.mlp.linear_fc2.weight : tensor<8x32xf32>
    %y = mt.matmul %g, %w2 : (tensor<2x4x32xf32>, tensor<8x32xf32>) -> tensor<2x4x8xf32>
    %b2 = mt.param_ref @decoder.layers.0.mlp.linear_fc2.bias : tensor<8xf32>
    %yb = mt.bias_add %y, %b2 : tensor<2x4x8xf32>, tensor<8xf32>
    %yd = mt.dropout %yb {rate = 1.000000e-01 : f64, stream = 1 : i64} : tensor<2x4x8xf32>
    %r = mt.add %x0, %yd : tensor<2x4x8xf32>
    %nw = mt.param_ref @decoder.final_layernorm.weight : tensor<8xf32>
    %nb = mt.param_ref @decoder.final_layernorm.bias : tensor<8xf32>
    %n = mt.layer_norm %r, %nw, %nb {epsilon = 1.000000e-05 : f64} : tensor<2x4x8xf32>, tensor<8xf32>
    %logits = mt.matmul %n, %wt : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
    %loss = mt.cross_entropy %logits, %labels : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// -----

// Sequence parallelism: the residual stream holds 2 of the 4 positions.
// The embedding ends in sp_split after the (replicated) position embedding;
// sp_gather before column-parallel layers, sp_reduce_scatter after
// row-parallel ones; dropout draws its slice of the whole mask; parameters
// read on sequence shards get partial gradients.
// CHECK-LABEL: module attributes
// CHECK-SAME: mt.sequence_parallel
// CHECK: mt.param @decoder.layers.0.mlp.linear_fc1.bias : tensor<16xf32>, zeros {tp_blocks
// CHECK: mt.param @decoder.layers.0.mlp.linear_fc2.bias : tensor<8xf32>, zeros {mt.tp_partial_grad}
// CHECK: mt.param @decoder.final_layernorm.weight : tensor<8xf32>, ones {mt.tp_partial_grad}
// CHECK: %[[S:.*]] = mt.sp_split %{{.*}} {tp_size = 2 : i64} : (tensor<2x4x8xf32>) -> tensor<2x2x8xf32>
// CHECK-NEXT: %[[X:.*]] = mt.dropout %[[S]] {rate = 1.000000e-01 : f64, stream = 0 : i64, tp_shard_dim = 1 : i64} : tensor<2x2x8xf32>
// CHECK: %[[G:.*]] = mt.sp_gather %[[X]] {tp_size = 2 : i64} : (tensor<2x2x8xf32>) -> tensor<2x4x8xf32>
// CHECK-NEXT: mt.matmul %[[G]]
// CHECK: %[[P:.*]] = mt.matmul %{{.*}} -> tensor<2x4x8xf32>
// CHECK-NEXT: %[[RS:.*]] = mt.sp_reduce_scatter %[[P]] {tp_size = 2 : i64} : (tensor<2x4x8xf32>) -> tensor<2x2x8xf32>
// CHECK: mt.layer_norm %{{.*}} : tensor<2x2x8xf32>, tensor<8xf32>
// CHECK-NEXT: mt.sp_gather
// CHECK-NEXT: mt.matmul
// CHECK-NEXT: mt.cross_entropy %{{.*}} {vocab_parallel}
module attributes {mt.parallel = {data_parallel_size = 1 : i64, pipeline_model_parallel_size = 1 : i64, sequence_parallel = true, tensor_model_parallel_size = 2 : i64, use_distributed_optimizer = false}} {
  mt.param @embedding.word_embeddings.weight : tensor<16x8xf32>, normal(2.000000e-02)
  mt.param @embedding.position_embeddings.weight : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.linear_fc1.weight : tensor<32x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.linear_fc1.bias : tensor<32xf32>, zeros
  mt.param @decoder.layers.0.mlp.linear_fc2.weight : tensor<8x32xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.linear_fc2.bias : tensor<8xf32>, zeros
  mt.param @decoder.final_layernorm.weight : tensor<8xf32>, ones
  mt.param @decoder.final_layernorm.bias : tensor<8xf32>, zeros
  func.func @forward(%tokens: tensor<2x4xi32> {mt.name = "tokens"}, %labels: tensor<2x4xi32> {mt.name = "labels"}) -> tensor<f32> {
    %wt = mt.param_ref @embedding.word_embeddings.weight : tensor<16x8xf32>
    %e = mt.embedding %wt, %tokens : (tensor<16x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
    %wp = mt.param_ref @embedding.position_embeddings.weight : tensor<4x8xf32>
    %pos = mt.position_ids : tensor<2x4xi32>
    %pe = mt.embedding %wp, %pos : (tensor<4x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
    %x = mt.add %e, %pe : tensor<2x4x8xf32>
    %x0 = mt.dropout %x {rate = 1.000000e-01 : f64, stream = 0 : i64} : tensor<2x4x8xf32>
    %w1 = mt.param_ref @decoder.layers.0.mlp.linear_fc1.weight : tensor<32x8xf32>
    %h = mt.matmul %x0, %w1 : (tensor<2x4x8xf32>, tensor<32x8xf32>) -> tensor<2x4x32xf32>
    %b1 = mt.param_ref @decoder.layers.0.mlp.linear_fc1.bias : tensor<32xf32>
    %hb = mt.bias_add %h, %b1 : tensor<2x4x32xf32>, tensor<32xf32>
    %g = mt.gelu %hb tanh : tensor<2x4x32xf32>
    %w2 = mt.param_ref @decoder.layers.0.mlp.linear_fc2.weight : tensor<8x32xf32>
    %y = mt.matmul %g, %w2 : (tensor<2x4x32xf32>, tensor<8x32xf32>) -> tensor<2x4x8xf32>
    %b2 = mt.param_ref @decoder.layers.0.mlp.linear_fc2.bias : tensor<8xf32>
    %yb = mt.bias_add %y, %b2 : tensor<2x4x8xf32>, tensor<8xf32>
    %yd = mt.dropout %yb {rate = 1.000000e-01 : f64, stream = 1 : i64} : tensor<2x4x8xf32>
    %r = mt.add %x0, %yd : tensor<2x4x8xf32>
    %nw = mt.param_ref @decoder.final_layernorm.weight : tensor<8xf32>
    %nb = mt.param_ref @decoder.final_layernorm.bias : tensor<8xf32>
    %n = mt.layer_norm %r, %nw, %nb {epsilon = 1.000000e-05 : f64} : tensor<2x4x8xf32>, tensor<8xf32>
    %logits = mt.matmul %n, %wt : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
    %loss = mt.cross_entropy %logits, %labels : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// -----

// tensor_model_parallel_size = 1 leaves the module unchanged.
// CHECK-LABEL: module attributes
// CHECK-NOT: mt.tensor_parallel
// CHECK: mt.param @embedding.word_embeddings.weight : tensor<16x8xf32>, normal(2.000000e-02){{$}}
module attributes {mt.parallel = {data_parallel_size = 1 : i64, pipeline_model_parallel_size = 1 : i64, sequence_parallel = false, tensor_model_parallel_size = 1 : i64, use_distributed_optimizer = false}} {
  mt.param @embedding.word_embeddings.weight : tensor<16x8xf32>, normal(2.000000e-02)
  mt.param @embedding.position_embeddings.weight : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.linear_fc1.weight : tensor<32x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.linear_fc1.bias : tensor<32xf32>, zeros
  mt.param @decoder.layers.0.mlp.linear_fc2.weight : tensor<8x32xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.linear_fc2.bias : tensor<8xf32>, zeros
  mt.param @decoder.final_layernorm.weight : tensor<8xf32>, ones
  mt.param @decoder.final_layernorm.bias : tensor<8xf32>, zeros
  func.func @forward(%tokens: tensor<2x4xi32> {mt.name = "tokens"}, %labels: tensor<2x4xi32> {mt.name = "labels"}) -> tensor<f32> {
    %wt = mt.param_ref @embedding.word_embeddings.weight : tensor<16x8xf32>
    %e = mt.embedding %wt, %tokens : (tensor<16x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
    %wp = mt.param_ref @embedding.position_embeddings.weight : tensor<4x8xf32>
    %pos = mt.position_ids : tensor<2x4xi32>
    %pe = mt.embedding %wp, %pos : (tensor<4x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
    %x = mt.add %e, %pe : tensor<2x4x8xf32>
    %x0 = mt.dropout %x {rate = 1.000000e-01 : f64, stream = 0 : i64} : tensor<2x4x8xf32>
    %w1 = mt.param_ref @decoder.layers.0.mlp.linear_fc1.weight : tensor<32x8xf32>
    %h = mt.matmul %x0, %w1 : (tensor<2x4x8xf32>, tensor<32x8xf32>) -> tensor<2x4x32xf32>
    %b1 = mt.param_ref @decoder.layers.0.mlp.linear_fc1.bias : tensor<32xf32>
    %hb = mt.bias_add %h, %b1 : tensor<2x4x32xf32>, tensor<32xf32>
    %g = mt.gelu %hb tanh : tensor<2x4x32xf32>
    %w2 = mt.param_ref @decoder.layers.0.mlp.linear_fc2.weight : tensor<8x32xf32>
    %y = mt.matmul %g, %w2 : (tensor<2x4x32xf32>, tensor<8x32xf32>) -> tensor<2x4x8xf32>
    %b2 = mt.param_ref @decoder.layers.0.mlp.linear_fc2.bias : tensor<8xf32>
    %yb = mt.bias_add %y, %b2 : tensor<2x4x8xf32>, tensor<8xf32>
    %yd = mt.dropout %yb {rate = 1.000000e-01 : f64, stream = 1 : i64} : tensor<2x4x8xf32>
    %r = mt.add %x0, %yd : tensor<2x4x8xf32>
    %nw = mt.param_ref @decoder.final_layernorm.weight : tensor<8xf32>
    %nb = mt.param_ref @decoder.final_layernorm.bias : tensor<8xf32>
    %n = mt.layer_norm %r, %nw, %nb {epsilon = 1.000000e-05 : f64} : tensor<2x4x8xf32>, tensor<8xf32>
    %logits = mt.matmul %n, %wt : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
    %loss = mt.cross_entropy %logits, %labels : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}
