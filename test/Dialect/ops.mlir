// Round trip of every model-graph op: parse, print, parse again.
// RUN: mtc-opt %s -split-input-file | mtc-opt -split-input-file | FileCheck %s
// RUN: mtc-opt %s -split-input-file --mlir-print-op-generic | mtc-opt -split-input-file | FileCheck %s

// CHECK-LABEL: module @params
module @params {
  // CHECK: mt.param @embedding.word_embeddings.weight : tensor<128x16xf32>, normal(2.000000e-02)
  mt.param @"embedding.word_embeddings.weight" : tensor<128x16xf32>, normal(2.000000e-02)
  // CHECK: mt.param @decoder.final_layernorm.weight : tensor<16xbf16>, ones
  mt.param @"decoder.final_layernorm.weight" : tensor<16xbf16>, ones
  // CHECK: mt.param @decoder.final_layernorm.bias : tensor<16xf16>, zeros
  mt.param @"decoder.final_layernorm.bias" : tensor<16xf16>, zeros
  // CHECK: func.func @read
  func.func @read() -> tensor<128x16xf32> {
    // CHECK: mt.param_ref @embedding.word_embeddings.weight : tensor<128x16xf32>
    %w = mt.param_ref @"embedding.word_embeddings.weight" : tensor<128x16xf32>
    return %w : tensor<128x16xf32>
  }
}

// -----

// CHECK-LABEL: func.func @embedding
func.func @embedding(%table: tensor<128x16xf32>, %ids: tensor<2x8xi32>) -> tensor<2x8x16xf32> {
  // CHECK: %[[POS:.*]] = mt.position_ids : tensor<2x8xi32>
  %pos = mt.position_ids : tensor<2x8xi32>
  // CHECK: mt.embedding %{{.*}}, %[[POS]] : (tensor<128x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  %e = mt.embedding %table, %pos : (tensor<128x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  // CHECK: mt.add
  %s = mt.add %e, %e : tensor<2x8x16xf32>
  return %s : tensor<2x8x16xf32>
}

// -----

// CHECK-LABEL: func.func @norms
func.func @norms(%x: tensor<2x8x16xf32>, %w: tensor<16xf32>, %b: tensor<16xf32>) -> tensor<2x8x16xf32> {
  // CHECK: mt.layer_norm %{{.*}}, %{{.*}}, %{{.*}} {epsilon = 1.000000e-05 : f64} : tensor<2x8x16xf32>, tensor<16xf32>
  %y = mt.layer_norm %x, %w, %b {epsilon = 1.0e-5 : f64} : tensor<2x8x16xf32>, tensor<16xf32>
  // CHECK: mt.rms_norm %{{.*}}, %{{.*}} {epsilon = 1.000000e-05 : f64} : tensor<2x8x16xf32>, tensor<16xf32>
  %z = mt.rms_norm %y, %w {epsilon = 1.0e-5 : f64} : tensor<2x8x16xf32>, tensor<16xf32>
  // --apply-layernorm-1p: the weight is applied as 1 + w.
  // CHECK: mt.layer_norm %{{.*}}, %{{.*}}, %{{.*}} {epsilon = 1.000000e-05 : f64, zero_centered_gamma} : tensor<2x8x16xf32>, tensor<16xf32>
  %y1 = mt.layer_norm %z, %w, %b {epsilon = 1.0e-5 : f64, zero_centered_gamma} : tensor<2x8x16xf32>, tensor<16xf32>
  // CHECK: mt.rms_norm %{{.*}}, %{{.*}} {epsilon = 1.000000e-05 : f64, zero_centered_gamma} : tensor<2x8x16xf32>, tensor<16xf32>
  %z1 = mt.rms_norm %y1, %w {epsilon = 1.0e-5 : f64, zero_centered_gamma} : tensor<2x8x16xf32>, tensor<16xf32>
  return %z1 : tensor<2x8x16xf32>
}

// -----

// CHECK-LABEL: func.func @mlp
func.func @mlp(%x: tensor<2x8x16xbf16>, %w1: tensor<64x16xbf16>, %b1: tensor<64xbf16>,
               %w2: tensor<16x32xbf16>, %w3: tensor<16x64xbf16>) -> (tensor<2x8x16xbf16>, tensor<2x8x16xbf16>) {
  // CHECK: mt.matmul %{{.*}}, %{{.*}} : (tensor<2x8x16xbf16>, tensor<64x16xbf16>) -> tensor<2x8x64xbf16>
  %h = mt.matmul %x, %w1 : (tensor<2x8x16xbf16>, tensor<64x16xbf16>) -> tensor<2x8x64xbf16>
  // CHECK: mt.bias_add %{{.*}}, %{{.*}} : tensor<2x8x64xbf16>, tensor<64xbf16>
  %hb = mt.bias_add %h, %b1 : tensor<2x8x64xbf16>, tensor<64xbf16>
  // CHECK: mt.swiglu %{{.*}} : (tensor<2x8x64xbf16>) -> tensor<2x8x32xbf16>
  %a = mt.swiglu %hb : (tensor<2x8x64xbf16>) -> tensor<2x8x32xbf16>
  // CHECK: mt.gelu %{{.*}} tanh : tensor<2x8x64xbf16>
  %g = mt.gelu %hb tanh : tensor<2x8x64xbf16>
  // CHECK: mt.gelu %{{.*}} erf : tensor<2x8x64xbf16>
  %g2 = mt.gelu %g erf : tensor<2x8x64xbf16>
  %o = mt.matmul %a, %w2 : (tensor<2x8x32xbf16>, tensor<16x32xbf16>) -> tensor<2x8x16xbf16>
  %o2 = mt.matmul %g2, %w3 : (tensor<2x8x64xbf16>, tensor<16x64xbf16>) -> tensor<2x8x16xbf16>
  // CHECK: mt.dropout %{{.*}} {rate = 1.000000e-01 : f64, stream = 4 : i64} : tensor<2x8x16xbf16>
  %d = mt.dropout %o {rate = 0.1 : f64, stream = 4 : i64} : tensor<2x8x16xbf16>
  return %d, %o2 : tensor<2x8x16xbf16>, tensor<2x8x16xbf16>
}

// -----

// Grouped-query attention: 4 query heads share 2 key/value groups.
// CHECK-LABEL: func.func @attention
func.func @attention(%qkv: tensor<2x8x64xf32>) -> tensor<2x8x32xf32> {
  // CHECK: mt.split_qkv %{{.*}} : (tensor<2x8x64xf32>) -> (tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>)
  %q, %k, %v = mt.split_qkv %qkv : (tensor<2x8x64xf32>) -> (tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>)
  // CHECK: mt.rope %{{.*}} {base = 1.000000e+04 : f64} : tensor<2x8x4x8xf32>
  %qr = mt.rope %q {base = 10000.0 : f64} : tensor<2x8x4x8xf32>
  // Llama 3.1's frequency scaling.
  // CHECK: mt.rope %{{.*}} {base = 5.000000e+05 : f64, scaling_factor = 8.000000e+00 : f64} : tensor<2x8x2x8xf32>
  %kr = mt.rope %k {base = 500000.0 : f64, scaling_factor = 8.0 : f64} : tensor<2x8x2x8xf32>
  // The second result is the rows' log-sum-exp, f32 [batch, heads, seq].
  // CHECK: %[[O:.*]], %[[LSE:.*]] = mt.attention %{{.*}}, %{{.*}}, %{{.*}} {causal, dropout_rate = 0.000000e+00 : f64, scale = 3.535530e-01 : f64, stream = 0 : i64} : tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>
  %o, %lse = mt.attention %qr, %kr, %v {causal, scale = 0.353553 : f64, dropout_rate = 0.0 : f64, stream = 0 : i64} : tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>
  // CHECK: mt.split_qkv %{{.*}} {rope_base = 1.000000e+04 : f64} : (tensor<2x8x64xf32>) -> (tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>)
  %q2, %k2, %v2 = mt.split_qkv %qkv {rope_base = 10000.0 : f64} : (tensor<2x8x64xf32>) -> (tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>)
  // CHECK: mt.reshape %{{.*}} : (tensor<2x8x4x8xf32>) -> tensor<2x8x32xf32>
  %r = mt.reshape %o : (tensor<2x8x4x8xf32>) -> tensor<2x8x32xf32>
  return %r : tensor<2x8x32xf32>
}

// -----

// CHECK-LABEL: func.func @loss
func.func @loss(%logits: tensor<2x8x128xf16>, %labels: tensor<2x8xi64>) -> tensor<f32> {
  // CHECK: mt.cross_entropy %{{.*}}, %{{.*}} : (tensor<2x8x128xf16>, tensor<2x8xi64>) -> tensor<f32>
  %l = mt.cross_entropy %logits, %labels : (tensor<2x8x128xf16>, tensor<2x8xi64>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Tensor parallelism: a parameter's shard, vocab-parallel ops, sharded
// dropout and attention masks, and the communication ops.
// CHECK-LABEL: module @tensor_parallel
module @tensor_parallel {
  // CHECK: mt.param @fc1 : tensor<16x8xf32>, normal(2.000000e-02) {tp_blocks = 2 : i64, tp_dim = 0 : i64, tp_size = 2 : i64}
  mt.param @fc1 : tensor<16x8xf32>, normal(2.000000e-02) {tp_blocks = 2 : i64, tp_dim = 0 : i64, tp_size = 2 : i64}
  func.func @f(%table: tensor<8x8xf32>, %ids: tensor<2x4xi32>, %q: tensor<2x4x2x4xf32>, %kv: tensor<2x4x1x4xf32>) -> tensor<f32> {
    // CHECK: mt.embedding %{{.*}}, %{{.*}} {vocab_parallel}
    %e = mt.embedding %table, %ids {vocab_parallel} : (tensor<8x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
    // CHECK: mt.tp_all_reduce %{{.*}} {tp_size = 2 : i64} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
    %r = mt.tp_all_reduce %e {tp_size = 2 : i64} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
    // CHECK: mt.sp_split %{{.*}} {tp_size = 2 : i64} : (tensor<2x4x8xf32>) -> tensor<2x2x8xf32>
    %s = mt.sp_split %r {tp_size = 2 : i64} : (tensor<2x4x8xf32>) -> tensor<2x2x8xf32>
    // CHECK: mt.dropout %{{.*}} {rate = 1.000000e-01 : f64, stream = 0 : i64, tp_shard_dim = 1 : i64}
    %d = mt.dropout %s {rate = 0.1 : f64, stream = 0 : i64, tp_shard_dim = 1 : i64} : tensor<2x2x8xf32>
    // CHECK: mt.sp_gather %{{.*}} {tp_size = 2 : i64} : (tensor<2x2x8xf32>) -> tensor<2x4x8xf32>
    %g = mt.sp_gather %d {tp_size = 2 : i64} : (tensor<2x2x8xf32>) -> tensor<2x4x8xf32>
    // CHECK: mt.sp_reduce_scatter %{{.*}} {tp_size = 2 : i64} : (tensor<2x4x8xf32>) -> tensor<2x2x8xf32>
    %rs = mt.sp_reduce_scatter %g {tp_size = 2 : i64} : (tensor<2x4x8xf32>) -> tensor<2x2x8xf32>
    // CHECK: mt.tp_copy %{{.*}} {tp_size = 2 : i64} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
    %c = mt.tp_copy %g {tp_size = 2 : i64} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
    // CHECK: mt.attention {{.*}}tp_shard_dim = 2 : i64
    %o, %lse = mt.attention %q, %kv, %kv {causal, scale = 0.5 : f64, dropout_rate = 0.1 : f64, stream = 1 : i64, tp_shard_dim = 2 : i64} : tensor<2x4x2x4xf32>, tensor<2x4x1x4xf32>
    // CHECK: mt.cross_entropy %{{.*}}, %{{.*}} {vocab_parallel}
    %l = mt.cross_entropy %c, %ids {vocab_parallel} : (tensor<2x4x8xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %l : tensor<f32>
  }
}

// -----

// Mixture of experts: router, permutation, grouped matmuls with stacked
// expert weights, and the weighted combination.
// CHECK-LABEL: module @moe
module @moe {
  mt.param @router : tensor<4x16xf32>, normal(2.000000e-02)
  mt.param @fc1 : tensor<4x64x16xf32>, normal(2.000000e-02)
  mt.param @fc2 : tensor<4x16x32xf32>, normal(1.000000e-02)
  func.func @f(%x: tensor<64x16xf32>) -> (tensor<64x16xf32>, tensor<f32>, tensor<f32>) {
    %wr = mt.param_ref @router : tensor<4x16xf32>
    %logits = mt.matmul %x, %wr : (tensor<64x16xf32>, tensor<4x16xf32>) -> tensor<64x4xf32>
    // CHECK: %[[P:.*]], %[[M:.*]], %[[AUX:.*]], %[[Z:.*]] = mt.moe_router %{{.*}} softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.000000e-02 : f64, capacity = 0 : i64, scaling_factor = 0.000000e+00 : f64, seq_length = 32 : i64, topk = 2 : i64, z_loss_coeff = 1.000000e-03 : f64} : (tensor<64x4xf32>) -> (tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>, tensor<f32>)
    %p, %m, %aux, %z = mt.moe_router %logits softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.000000e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 32 : i64, topk = 2 : i64, z_loss_coeff = 1.000000e-03 : f64} : (tensor<64x4xf32>) -> (tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>, tensor<f32>)
    // CHECK: %[[Y:.*]], %[[ROWS:.*]], %[[N:.*]] = mt.moe_permute %{{.*}}, %[[M]] {capacity = 0 : i64} : (tensor<64x16xf32>, tensor<64x4xi32>) -> (tensor<128x16xf32>, tensor<128xi32>, tensor<4xi32>)
    %y, %rows, %n = mt.moe_permute %x, %m {capacity = 0 : i64} : (tensor<64x16xf32>, tensor<64x4xi32>) -> (tensor<128x16xf32>, tensor<128xi32>, tensor<4xi32>)
    %w1 = mt.param_ref @fc1 : tensor<4x64x16xf32>
    // CHECK: mt.moe_grouped_matmul %[[Y]], %{{.*}}, %[[N]] : (tensor<128x16xf32>, tensor<4x64x16xf32>, tensor<4xi32>) -> tensor<128x64xf32>
    %h = mt.moe_grouped_matmul %y, %w1, %n : (tensor<128x16xf32>, tensor<4x64x16xf32>, tensor<4xi32>) -> tensor<128x64xf32>
    %a = mt.swiglu %h : (tensor<128x64xf32>) -> tensor<128x32xf32>
    %w2 = mt.param_ref @fc2 : tensor<4x16x32xf32>
    %h2 = mt.moe_grouped_matmul %a, %w2, %n : (tensor<128x32xf32>, tensor<4x16x32xf32>, tensor<4xi32>) -> tensor<128x16xf32>
    // CHECK: mt.moe_unpermute %{{.*}}, %[[P]], %[[ROWS]], %[[N]] : (tensor<128x16xf32>, tensor<64x4xf32>, tensor<128xi32>, tensor<4xi32>) -> tensor<64x16xf32>
    %out = mt.moe_unpermute %h2, %p, %rows, %n : (tensor<128x16xf32>, tensor<64x4xf32>, tensor<128xi32>, tensor<4xi32>) -> tensor<64x16xf32>
    return %out, %aux, %z : tensor<64x16xf32>, tensor<f32>, tensor<f32>
  }

  // Sigmoid scores, the sequence-level loss, capacity with padding, and a
  // 16-bit model.
  // CHECK-LABEL: func.func @capacity
  func.func @capacity(%x: tensor<64x16xbf16>, %logits: tensor<64x4xbf16>) -> (tensor<64x4xf32>, tensor<96x16xbf16>, tensor<80x16xbf16>) {
    // CHECK: mt.moe_router %{{.*}} sigmoid seq_aux_loss drop position dtype fp32 {aux_loss_coeff = 1.000000e-02 : f64, capacity = 24 : i64, pad_to_capacity, pre_softmax, scaling_factor = 2.500000e+00 : f64, seq_length = 16 : i64, topk = 1 : i64, z_loss_coeff = 0.000000e+00 : f64}
    %p, %m, %aux, %z = mt.moe_router %logits sigmoid seq_aux_loss drop position dtype fp32 {aux_loss_coeff = 1.000000e-02 : f64, capacity = 24 : i64, pad_to_capacity, pre_softmax, scaling_factor = 2.5 : f64, seq_length = 16 : i64, topk = 1 : i64, z_loss_coeff = 0.0 : f64} : (tensor<64x4xbf16>) -> (tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>, tensor<f32>)
    // CHECK: mt.moe_permute %{{.*}}, %{{.*}} {capacity = 24 : i64, pad_to_capacity} : (tensor<64x16xbf16>, tensor<64x4xi32>) -> (tensor<96x16xbf16>, tensor<96xi32>, tensor<4xi32>)
    %y, %rows, %n = mt.moe_permute %x, %m {capacity = 24 : i64, pad_to_capacity} : (tensor<64x16xbf16>, tensor<64x4xi32>) -> (tensor<96x16xbf16>, tensor<96xi32>, tensor<4xi32>)
    // min(T * topk, E * C) = min(64 * 2, 4 * 20) rows with a capacity and no padding.
    // CHECK: mt.moe_permute %{{.*}}, %{{.*}} {capacity = 20 : i64} : (tensor<64x16xbf16>, tensor<64x4xi32>) -> (tensor<80x16xbf16>, tensor<80xi32>, tensor<4xi32>)
    %y2, %rows2, %n2 = mt.moe_permute %x, %m {capacity = 20 : i64} : (tensor<64x16xbf16>, tensor<64x4xi32>) -> (tensor<80x16xbf16>, tensor<80xi32>, tensor<4xi32>)
    return %p, %y, %y2 : tensor<64x4xf32>, tensor<96x16xbf16>, tensor<80x16xbf16>
  }
}

// -----

// Expert parallelism: a rank's share of the stacked experts, the exchange of
// rows with the other expert-parallel ranks, and the router's token counts
// summed over the tensor-parallel group.
// CHECK-LABEL: module @expert_parallel
module @expert_parallel {
  // CHECK: mt.param @fc1 : tensor<2x64x16xf32>, normal(2.000000e-02) {ep_dim = 0 : i64, ep_size = 2 : i64, mt.expert}
  mt.param @fc1 : tensor<2x64x16xf32>, normal(2.000000e-02) {ep_dim = 0 : i64, ep_size = 2 : i64, mt.expert}
  // An expert split over 2 expert-tensor-parallel ranks too (row-parallel fc2).
  // CHECK: mt.param @fc2 : tensor<2x16x16xf32>, normal(2.000000e-02) {ep_dim = 0 : i64, ep_size = 2 : i64, mt.expert, tp_blocks = 1 : i64, tp_dim = 2 : i64, tp_size = 2 : i64}
  mt.param @fc2 : tensor<2x16x16xf32>, normal(2.000000e-02) {ep_dim = 0 : i64, ep_size = 2 : i64, mt.expert, tp_blocks = 1 : i64, tp_dim = 2 : i64, tp_size = 2 : i64}
  // CHECK-LABEL: func.func @exchange
  func.func @exchange(%y: tensor<128x16xf32>, %n: tensor<4xi32>, %logits: tensor<64x4xf32>) -> (tensor<128x16xf32>, tensor<2xi32>, tensor<64x4xf32>) {
    // CHECK: %[[R:.*]], %[[L:.*]], %[[LAY:.*]] = mt.moe_dispatch %{{.*}}, %{{.*}} alltoall {ep_size = 2 : i64, num_local_experts = 2 : i64} : (tensor<128x16xf32>, tensor<4xi32>) -> (tensor<256x16xf32>, tensor<2xi32>, tensor<2x2xi32>)
    %rows, %local, %layout = mt.moe_dispatch %y, %n alltoall {ep_size = 2 : i64, num_local_experts = 2 : i64} : (tensor<128x16xf32>, tensor<4xi32>) -> (tensor<256x16xf32>, tensor<2xi32>, tensor<2x2xi32>)
    // CHECK: mt.moe_combine %[[R]], %[[LAY]], %{{.*}} allgather {ep_size = 2 : i64, num_local_experts = 2 : i64} : (tensor<256x16xf32>, tensor<2x2xi32>, tensor<4xi32>) -> tensor<128x16xf32>
    %back = mt.moe_combine %rows, %layout, %n allgather {ep_size = 2 : i64, num_local_experts = 2 : i64} : (tensor<256x16xf32>, tensor<2x2xi32>, tensor<4xi32>) -> tensor<128x16xf32>
    // Expert tensor parallelism: 2 ranks per expert-parallel rank, 4 sources.
    // CHECK: mt.moe_dispatch %{{.*}}, %{{.*}} alltoall {ep_size = 2 : i64, etp_size = 2 : i64, num_local_experts = 2 : i64} : (tensor<128x16xf32>, tensor<4xi32>) -> (tensor<512x16xf32>, tensor<2xi32>, tensor<4x2xi32>)
    %rows2, %local2, %layout2 = mt.moe_dispatch %y, %n alltoall {ep_size = 2 : i64, etp_size = 2 : i64, num_local_experts = 2 : i64} : (tensor<128x16xf32>, tensor<4xi32>) -> (tensor<512x16xf32>, tensor<2xi32>, tensor<4x2xi32>)
    // CHECK: mt.moe_combine %{{.*}} allgather {ep_size = 1 : i64, etp_size = 2 : i64, num_local_experts = 4 : i64} : (tensor<256x16xf32>, tensor<2x4xi32>, tensor<4xi32>) -> tensor<128x16xf32>
    %l1:3 = mt.moe_dispatch %y, %n allgather {ep_size = 1 : i64, etp_size = 2 : i64, num_local_experts = 4 : i64} : (tensor<128x16xf32>, tensor<4xi32>) -> (tensor<256x16xf32>, tensor<4xi32>, tensor<2x4xi32>)
    %back1 = mt.moe_combine %l1#0, %l1#2, %n allgather {ep_size = 1 : i64, etp_size = 2 : i64, num_local_experts = 4 : i64} : (tensor<256x16xf32>, tensor<2x4xi32>, tensor<4xi32>) -> tensor<128x16xf32>
    // CHECK: mt.moe_router %{{.*}} softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.000000e-02 : f64, capacity = 0 : i64, count_group = "tp", scaling_factor = 0.000000e+00 : f64, seq_length = 16 : i64, topk = 2 : i64, z_loss_coeff = 5.000000e-04 : f64}
    %p, %m, %aux, %z = mt.moe_router %logits softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, count_group = "tp", scaling_factor = 0.0 : f64, seq_length = 16 : i64, topk = 2 : i64, z_loss_coeff = 5.0e-04 : f64} : (tensor<64x4xf32>) -> (tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>, tensor<f32>)
    return %back, %local, %p : tensor<128x16xf32>, tensor<2xi32>, tensor<64x4xf32>
  }
}

// -----

// moe_router_dtype fp64: the router's linear layer gives f64 logits from
// 16-bit (or f32) operands, routed in double.
// CHECK-LABEL: module @router_fp64
module @router_fp64 {
  func.func @f(%x: tensor<64x16xbf16>, %w: tensor<4x16xbf16>) -> tensor<64x4xf32> {
    // CHECK: mt.matmul %{{.*}}, %{{.*}} : (tensor<64x16xbf16>, tensor<4x16xbf16>) -> tensor<64x4xf64>
    %logits = mt.matmul %x, %w : (tensor<64x16xbf16>, tensor<4x16xbf16>) -> tensor<64x4xf64>
    // CHECK: mt.moe_router %{{.*}} softmax aux_loss drop probs dtype fp64 {{.*}} : (tensor<64x4xf64>) -> (tensor<64x4xf32>
    %p, %m, %aux, %z = mt.moe_router %logits softmax aux_loss drop probs dtype fp64 {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 16 : i64, topk = 2 : i64, z_loss_coeff = 0.0 : f64} : (tensor<64x4xf64>) -> (tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>, tensor<f32>)
    return %p : tensor<64x4xf32>
  }
}
