// mt-shard-ep: one expert-parallel rank's program. The stacked expert
// weights become the rank's L = E / ep experts (ep_dim, mt.expert); the
// permuted rows go to their experts' ranks by mt.moe_dispatch, the grouped
// matmuls run on the received rows with the local counts, and mt.moe_combine
// brings them back before the unpermutation. R, the received rows, is the
// layout's worst case: ep * T * min(k, L) without capacity (here 2 * 8 * 2).
// RUN: mtc-opt %s -split-input-file -mt-shard-ep | FileCheck %s --enable-var-scope

// CHECK-LABEL: module attributes
// CHECK-SAME: mt.expert_parallel = 2 : i64
// CHECK: mt.param @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>, normal(2.000000e-02){{$}}
// CHECK: mt.param @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<2x32x8xf32>, normal(2.000000e-02) {ep_dim = 0 : i64, ep_size = 2 : i64, mt.expert}
// CHECK: mt.param @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<2x8x16xf32>, normal(1.000000e-02) {ep_dim = 0 : i64, ep_size = 2 : i64, mt.expert}
// CHECK: %[[Y:.*]], %[[IDS:.*]], %[[N:.*]] = mt.moe_permute {{.*}} -> (tensor<16x8xf32>, tensor<16xi32>, tensor<4xi32>)
// CHECK-NEXT: %[[R:.*]], %[[LC:.*]], %[[LAY:.*]] = mt.moe_dispatch %[[Y]], %[[N]] alltoall {ep_size = 2 : i64, mt.layer = 0 : i64, num_local_experts = 2 : i64} : (tensor<16x8xf32>, tensor<4xi32>) -> (tensor<32x8xf32>, tensor<2xi32>, tensor<2x2xi32>)
// CHECK: %[[W1:.*]] = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<2x32x8xf32>
// CHECK-NEXT: %[[H:.*]] = mt.moe_grouped_matmul %[[R]], %[[W1]], %[[LC]] : (tensor<32x8xf32>, tensor<2x32x8xf32>, tensor<2xi32>) -> tensor<32x32xf32>
// CHECK-NEXT: %[[A:.*]] = mt.swiglu %[[H]] : (tensor<32x32xf32>) -> tensor<32x16xf32>
// CHECK: %[[H2:.*]] = mt.moe_grouped_matmul %[[A]], %{{.*}}, %[[LC]] : (tensor<32x16xf32>, tensor<2x8x16xf32>, tensor<2xi32>) -> tensor<32x8xf32>
// CHECK-NEXT: %[[B:.*]] = mt.moe_combine %[[H2]], %[[LAY]], %[[N]] alltoall {ep_size = 2 : i64, mt.layer = 0 : i64, num_local_experts = 2 : i64} : (tensor<32x8xf32>, tensor<2x2xi32>, tensor<4xi32>) -> tensor<16x8xf32>
// CHECK-NEXT: mt.moe_unpermute %[[B]], %{{.*}}, %[[IDS]], %[[N]] {mt.layer = 0 : i64} : (tensor<16x8xf32>, tensor<8x4xf32>, tensor<16xi32>, tensor<4xi32>) -> tensor<8x8xf32>
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
    %a = mt.swiglu %h : (tensor<16x32xf32>) -> tensor<16x16xf32>
    %w2 = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<4x8x16xf32>
    %h2 = mt.moe_grouped_matmul %a, %w2, %n : (tensor<16x16xf32>, tensor<4x8x16xf32>, tensor<4xi32>) -> tensor<16x8xf32>
    %o = mt.moe_unpermute %h2, %p, %rows, %n {mt.layer = 0 : i64} : (tensor<16x8xf32>, tensor<8x4xf32>, tensor<16xi32>, tensor<4xi32>) -> tensor<8x8xf32>
    %o3 = mt.reshape %o : (tensor<8x8xf32>) -> tensor<2x4x8xf32>
    return %o3, %aux : tensor<2x4x8xf32>, tensor<f32>
  }
}

// -----

// At ep 1 the pass only marks the experts: nothing moves.
// CHECK-LABEL: module attributes
// CHECK-NOT: mt.expert_parallel
// CHECK: mt.param @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>, normal(2.000000e-02){{$}}
// CHECK: mt.param @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<4x32x8xf32>, normal(2.000000e-02) {mt.expert}
// CHECK: mt.param @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<4x8x16xf32>, normal(1.000000e-02) {mt.expert}
// CHECK-NOT: mt.moe_dispatch
// CHECK-NOT: mt.moe_combine
module attributes {mt.parallel = {data_parallel_size = 2 : i64, expert_model_parallel_size = 1 : i64, expert_tensor_parallel_size = 1 : i64, moe_token_dispatcher_type = "alltoall", pipeline_model_parallel_size = 1 : i64, sequence_parallel = false, tensor_model_parallel_size = 1 : i64}} {
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

// ep 4 (one expert a rank), the allgather dispatcher: each source sends at
// most T * min(k, L) = 8 rows to a rank, R = 4 * 8.
// CHECK-LABEL: module attributes
// CHECK: mt.param @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<1x32x8xf32>, {{.*}}ep_size = 4
// CHECK: mt.moe_dispatch %{{.*}}, %{{.*}} allgather {ep_size = 4 : i64, mt.layer = 0 : i64, num_local_experts = 1 : i64} : (tensor<16x8xf32>, tensor<4xi32>) -> (tensor<32x8xf32>, tensor<1xi32>, tensor<4x1xi32>)
// CHECK: mt.moe_combine %{{.*}} allgather {{.*}} : (tensor<32x8xf32>, tensor<4x1xi32>, tensor<4xi32>) -> tensor<16x8xf32>
module attributes {mt.parallel = {data_parallel_size = 2 : i64, expert_model_parallel_size = 4 : i64, expert_tensor_parallel_size = 1 : i64, moe_token_dispatcher_type = "allgather", pipeline_model_parallel_size = 1 : i64, sequence_parallel = false, tensor_model_parallel_size = 1 : i64}} {
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

// Capacity 3 padded: every expert has exactly C rows from each source,
// R = ep * L * C = 2 * 2 * 3.
// CHECK-LABEL: module attributes
// CHECK: mt.moe_dispatch {{.*}} -> (tensor<12x8xf32>, tensor<2xi32>, tensor<2x2xi32>)
// CHECK: mt.moe_combine {{.*}} -> tensor<12x8xf32>
module attributes {mt.parallel = {data_parallel_size = 2 : i64, expert_model_parallel_size = 2 : i64, expert_tensor_parallel_size = 1 : i64, moe_token_dispatcher_type = "alltoall", pipeline_model_parallel_size = 1 : i64, sequence_parallel = false, tensor_model_parallel_size = 1 : i64}} {
  mt.param @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<4x32x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<4x8x16xf32>, normal(1.000000e-02)
  func.func @forward(%x: tensor<2x4x8xf32> {mt.name = "x"}) -> (tensor<2x4x8xf32>, tensor<f32>) {
    %xf = mt.reshape %x : (tensor<2x4x8xf32>) -> tensor<8x8xf32>
    %wr = mt.param_ref @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>
    %logits = mt.matmul %xf, %wr : (tensor<8x8xf32>, tensor<4x8xf32>) -> tensor<8x4xf32>
    %p, %m, %aux, %z = mt.moe_router %logits softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 3 : i64, pad_to_capacity, scaling_factor = 0.0 : f64, seq_length = 4 : i64, topk = 2 : i64, z_loss_coeff = 1.0e-03 : f64} : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x4xi32>, tensor<f32>, tensor<f32>)
    %y, %rows, %n = mt.moe_permute %xf, %m {capacity = 3 : i64, pad_to_capacity, mt.layer = 0 : i64} : (tensor<8x8xf32>, tensor<8x4xi32>) -> (tensor<12x8xf32>, tensor<12xi32>, tensor<4xi32>)
    %w1 = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<4x32x8xf32>
    %h = mt.moe_grouped_matmul %y, %w1, %n : (tensor<12x8xf32>, tensor<4x32x8xf32>, tensor<4xi32>) -> tensor<12x32xf32>
    %a = mt.swiglu %h : (tensor<12x32xf32>) -> tensor<12x16xf32>
    %w2 = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<4x8x16xf32>
    %h2 = mt.moe_grouped_matmul %a, %w2, %n : (tensor<12x16xf32>, tensor<4x8x16xf32>, tensor<4xi32>) -> tensor<12x8xf32>
    %o = mt.moe_unpermute %h2, %p, %rows, %n {mt.layer = 0 : i64} : (tensor<12x8xf32>, tensor<8x4xf32>, tensor<12xi32>, tensor<4xi32>) -> tensor<8x8xf32>
    %o3 = mt.reshape %o : (tensor<8x8xf32>) -> tensor<2x4x8xf32>
    return %o3, %aux : tensor<2x4x8xf32>, tensor<f32>
  }
}

// -----

// Capacity 3 without padding: R = ep * min(T * min(k, L), L * C) = 2 * min(16, 6).
// CHECK-LABEL: module attributes
// CHECK: mt.moe_dispatch {{.*}} : (tensor<12x8xf32>, tensor<4xi32>) -> (tensor<12x8xf32>, tensor<2xi32>, tensor<2x2xi32>)
module attributes {mt.parallel = {data_parallel_size = 2 : i64, expert_model_parallel_size = 2 : i64, expert_tensor_parallel_size = 1 : i64, moe_token_dispatcher_type = "alltoall", pipeline_model_parallel_size = 1 : i64, sequence_parallel = false, tensor_model_parallel_size = 1 : i64}} {
  mt.param @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<4x32x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<4x8x16xf32>, normal(1.000000e-02)
  func.func @forward(%x: tensor<2x4x8xf32> {mt.name = "x"}) -> (tensor<2x4x8xf32>, tensor<f32>) {
    %xf = mt.reshape %x : (tensor<2x4x8xf32>) -> tensor<8x8xf32>
    %wr = mt.param_ref @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>
    %logits = mt.matmul %xf, %wr : (tensor<8x8xf32>, tensor<4x8xf32>) -> tensor<8x4xf32>
    %p, %m, %aux, %z = mt.moe_router %logits softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 3 : i64, scaling_factor = 0.0 : f64, seq_length = 4 : i64, topk = 2 : i64, z_loss_coeff = 1.0e-03 : f64} : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x4xi32>, tensor<f32>, tensor<f32>)
    %y, %rows, %n = mt.moe_permute %xf, %m {capacity = 3 : i64, mt.layer = 0 : i64} : (tensor<8x8xf32>, tensor<8x4xi32>) -> (tensor<12x8xf32>, tensor<12xi32>, tensor<4xi32>)
    %w1 = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<4x32x8xf32>
    %h = mt.moe_grouped_matmul %y, %w1, %n : (tensor<12x8xf32>, tensor<4x32x8xf32>, tensor<4xi32>) -> tensor<12x32xf32>
    %a = mt.swiglu %h : (tensor<12x32xf32>) -> tensor<12x16xf32>
    %w2 = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<4x8x16xf32>
    %h2 = mt.moe_grouped_matmul %a, %w2, %n : (tensor<12x16xf32>, tensor<4x8x16xf32>, tensor<4xi32>) -> tensor<12x8xf32>
    %o = mt.moe_unpermute %h2, %p, %rows, %n {mt.layer = 0 : i64} : (tensor<12x8xf32>, tensor<8x4xf32>, tensor<12xi32>, tensor<4xi32>) -> tensor<8x8xf32>
    %o3 = mt.reshape %o : (tensor<8x8xf32>) -> tensor<2x4x8xf32>
    return %o3, %aux : tensor<2x4x8xf32>, tensor<f32>
  }
}

// -----

// Expert tensor parallelism, etp 2 x ep 2 (Megatron-Core's experts with
// expert tp 2): each rank keeps its ep rank's 2 experts, FC1 column-parallel
// (dimension 1, SwiGLU's gate and up halves each split: tp_blocks 2), FC2
// row-parallel (dimension 2). The exchange runs over the S = 4 ranks of the
// tensor-and-expert-parallel group: the layout is [S, L] = [4, 2] and
// R = S * T * min(k, L) = 4 * 8 * 2. The experts' outputs are 1/etp of the
// features until the combine sums the etp partial products.
// CHECK-LABEL: module attributes
// CHECK-SAME: mt.expert_parallel = 2 : i64
// CHECK-SAME: mt.expert_tensor_parallel = 2 : i64
// CHECK: mt.param @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>, normal(2.000000e-02){{$}}
// CHECK: mt.param @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<2x16x8xf32>, normal(2.000000e-02) {ep_dim = 0 : i64, ep_size = 2 : i64, mt.expert, tp_blocks = 2 : i64, tp_dim = 1 : i64, tp_size = 2 : i64}
// CHECK: mt.param @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<2x8x8xf32>, normal(1.000000e-02) {ep_dim = 0 : i64, ep_size = 2 : i64, mt.expert, tp_blocks = 1 : i64, tp_dim = 2 : i64, tp_size = 2 : i64}
// CHECK: %[[Y:.*]], %[[IDS:.*]], %[[N:.*]] = mt.moe_permute {{.*}} -> (tensor<16x8xf32>, tensor<16xi32>, tensor<4xi32>)
// CHECK-NEXT: %[[R:.*]], %[[LC:.*]], %[[LAY:.*]] = mt.moe_dispatch %[[Y]], %[[N]] alltoall {ep_size = 2 : i64, etp_size = 2 : i64, mt.layer = 0 : i64, num_local_experts = 2 : i64} : (tensor<16x8xf32>, tensor<4xi32>) -> (tensor<64x8xf32>, tensor<2xi32>, tensor<4x2xi32>)
// CHECK: %[[W1:.*]] = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<2x16x8xf32>
// CHECK-NEXT: %[[H:.*]] = mt.moe_grouped_matmul %[[R]], %[[W1]], %[[LC]] : (tensor<64x8xf32>, tensor<2x16x8xf32>, tensor<2xi32>) -> tensor<64x16xf32>
// CHECK-NEXT: %[[A:.*]] = mt.swiglu %[[H]] : (tensor<64x16xf32>) -> tensor<64x8xf32>
// CHECK: %[[W2:.*]] = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<2x8x8xf32>
// CHECK-NEXT: %[[H2:.*]] = mt.moe_grouped_matmul %[[A]], %[[W2]], %[[LC]] : (tensor<64x8xf32>, tensor<2x8x8xf32>, tensor<2xi32>) -> tensor<64x8xf32>
// CHECK-NEXT: %[[B:.*]] = mt.moe_combine %[[H2]], %[[LAY]], %[[N]] alltoall {ep_size = 2 : i64, etp_size = 2 : i64, mt.layer = 0 : i64, num_local_experts = 2 : i64} : (tensor<64x8xf32>, tensor<4x2xi32>, tensor<4xi32>) -> tensor<16x8xf32>
// CHECK-NEXT: mt.moe_unpermute %[[B]], %{{.*}}, %[[IDS]], %[[N]] {mt.layer = 0 : i64} : (tensor<16x8xf32>, tensor<8x4xf32>, tensor<16xi32>, tensor<4xi32>) -> tensor<8x8xf32>
module attributes {mt.parallel = {data_parallel_size = 4 : i64, expert_model_parallel_size = 2 : i64, expert_tensor_parallel_size = 2 : i64, moe_token_dispatcher_type = "alltoall", pipeline_model_parallel_size = 1 : i64, sequence_parallel = false, tensor_model_parallel_size = 1 : i64}} {
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

// etp 2 at ep 1 (GELU, the allgather dispatcher): every rank keeps all 4
// experts, each split in two; the exchange still runs, over the 2 ranks
// that split the experts: layout [2, 4], R = 2 * 8 * min(2, 4).
// CHECK-LABEL: module attributes {mt.expert_tensor_parallel = 2 : i64, mt.parallel =
// CHECK: mt.param @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<4x8x8xf32>, normal(2.000000e-02) {mt.expert, tp_blocks = 1 : i64, tp_dim = 1 : i64, tp_size = 2 : i64}
// CHECK: mt.param @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<4x8x8xf32>, normal(1.000000e-02) {mt.expert, tp_blocks = 1 : i64, tp_dim = 2 : i64, tp_size = 2 : i64}
// CHECK: %[[R:.*]], %[[LC:.*]], %[[LAY:.*]] = mt.moe_dispatch %{{.*}}, %{{.*}} allgather {ep_size = 1 : i64, etp_size = 2 : i64, mt.layer = 0 : i64, num_local_experts = 4 : i64} : (tensor<16x8xf32>, tensor<4xi32>) -> (tensor<32x8xf32>, tensor<4xi32>, tensor<2x4xi32>)
// CHECK: mt.moe_grouped_matmul %[[R]], %{{.*}}, %[[LC]] : (tensor<32x8xf32>, tensor<4x8x8xf32>, tensor<4xi32>) -> tensor<32x8xf32>
// CHECK-NEXT: mt.gelu %{{.*}} tanh : tensor<32x8xf32>
// CHECK: mt.moe_grouped_matmul %{{.*}}, %{{.*}}, %[[LC]] : (tensor<32x8xf32>, tensor<4x8x8xf32>, tensor<4xi32>) -> tensor<32x8xf32>
// CHECK-NEXT: mt.moe_combine %{{.*}}, %[[LAY]], %{{.*}} allgather {ep_size = 1 : i64, etp_size = 2 : i64, mt.layer = 0 : i64, num_local_experts = 4 : i64} : (tensor<32x8xf32>, tensor<2x4xi32>, tensor<4xi32>) -> tensor<16x8xf32>
module attributes {mt.parallel = {data_parallel_size = 2 : i64, expert_model_parallel_size = 1 : i64, expert_tensor_parallel_size = 2 : i64, moe_token_dispatcher_type = "allgather", pipeline_model_parallel_size = 1 : i64, sequence_parallel = false, tensor_model_parallel_size = 1 : i64}} {
  mt.param @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<4x16x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<4x8x16xf32>, normal(1.000000e-02)
  func.func @forward(%x: tensor<2x4x8xf32> {mt.name = "x"}) -> (tensor<2x4x8xf32>, tensor<f32>) {
    %xf = mt.reshape %x : (tensor<2x4x8xf32>) -> tensor<8x8xf32>
    %wr = mt.param_ref @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>
    %logits = mt.matmul %xf, %wr : (tensor<8x8xf32>, tensor<4x8xf32>) -> tensor<8x4xf32>
    %p, %m, %aux, %z = mt.moe_router %logits softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 4 : i64, topk = 2 : i64, z_loss_coeff = 1.0e-03 : f64} : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x4xi32>, tensor<f32>, tensor<f32>)
    %y, %rows, %n = mt.moe_permute %xf, %m {capacity = 0 : i64, mt.layer = 0 : i64} : (tensor<8x8xf32>, tensor<8x4xi32>) -> (tensor<16x8xf32>, tensor<16xi32>, tensor<4xi32>)
    %w1 = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<4x16x8xf32>
    %h = mt.moe_grouped_matmul %y, %w1, %n : (tensor<16x8xf32>, tensor<4x16x8xf32>, tensor<4xi32>) -> tensor<16x16xf32>
    %a = mt.gelu %h tanh : tensor<16x16xf32>
    %w2 = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<4x8x16xf32>
    %h2 = mt.moe_grouped_matmul %a, %w2, %n : (tensor<16x16xf32>, tensor<4x8x16xf32>, tensor<4xi32>) -> tensor<16x8xf32>
    %o = mt.moe_unpermute %h2, %p, %rows, %n {mt.layer = 0 : i64} : (tensor<16x8xf32>, tensor<8x4xf32>, tensor<16xi32>, tensor<4xi32>) -> tensor<8x8xf32>
    %o3 = mt.reshape %o : (tensor<8x8xf32>) -> tensor<2x4x8xf32>
    return %o3, %aux : tensor<2x4x8xf32>, tensor<f32>
  }
}

// -----

// Capacity 3 padded at etp 2 x ep 2: R = S * L * C = 4 * 2 * 3.
// CHECK-LABEL: module attributes
// CHECK: mt.moe_dispatch {{.*}} -> (tensor<24x8xf32>, tensor<2xi32>, tensor<4x2xi32>)
module attributes {mt.parallel = {data_parallel_size = 4 : i64, expert_model_parallel_size = 2 : i64, expert_tensor_parallel_size = 2 : i64, moe_token_dispatcher_type = "alltoall", pipeline_model_parallel_size = 1 : i64, sequence_parallel = false, tensor_model_parallel_size = 1 : i64}} {
  mt.param @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<4x32x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<4x8x16xf32>, normal(1.000000e-02)
  func.func @forward(%x: tensor<2x4x8xf32> {mt.name = "x"}) -> (tensor<2x4x8xf32>, tensor<f32>) {
    %xf = mt.reshape %x : (tensor<2x4x8xf32>) -> tensor<8x8xf32>
    %wr = mt.param_ref @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>
    %logits = mt.matmul %xf, %wr : (tensor<8x8xf32>, tensor<4x8xf32>) -> tensor<8x4xf32>
    %p, %m, %aux, %z = mt.moe_router %logits softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 3 : i64, pad_to_capacity, scaling_factor = 0.0 : f64, seq_length = 4 : i64, topk = 2 : i64, z_loss_coeff = 1.0e-03 : f64} : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x4xi32>, tensor<f32>, tensor<f32>)
    %y, %rows, %n = mt.moe_permute %xf, %m {capacity = 3 : i64, pad_to_capacity, mt.layer = 0 : i64} : (tensor<8x8xf32>, tensor<8x4xi32>) -> (tensor<12x8xf32>, tensor<12xi32>, tensor<4xi32>)
    %w1 = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<4x32x8xf32>
    %h = mt.moe_grouped_matmul %y, %w1, %n : (tensor<12x8xf32>, tensor<4x32x8xf32>, tensor<4xi32>) -> tensor<12x32xf32>
    %a = mt.swiglu %h : (tensor<12x32xf32>) -> tensor<12x16xf32>
    %w2 = mt.param_ref @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<4x8x16xf32>
    %h2 = mt.moe_grouped_matmul %a, %w2, %n : (tensor<12x16xf32>, tensor<4x8x16xf32>, tensor<4xi32>) -> tensor<12x8xf32>
    %o = mt.moe_unpermute %h2, %p, %rows, %n {mt.layer = 0 : i64} : (tensor<12x8xf32>, tensor<8x4xf32>, tensor<12xi32>, tensor<4xi32>) -> tensor<8x8xf32>
    %o3 = mt.reshape %o : (tensor<8x8xf32>) -> tensor<2x4x8xf32>
    return %o3, %aux : tensor<2x4x8xf32>, tensor<f32>
  }
}
