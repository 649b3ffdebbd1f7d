// mt-autodiff through expert parallelism: mt.moe_dispatch and mt.moe_combine
// are a conjugate pair. The rows' gradient goes back to the ranks that sent
// the rows by mt.moe_combine (with the forward's layout), and the gradient
// of the combined rows reaches the experts again by mt.moe_dispatch.
// RUN: mtc-opt %s -mt-shard-ep -mt-autodiff | FileCheck %s --enable-var-scope

// CHECK-LABEL: func.func @train_step
// CHECK: %[[Y:.*]], %[[IDS:.*]], %[[N:.*]] = mt.moe_permute
// CHECK: %[[R:.*]], %[[LC:.*]], %[[LAY:.*]] = mt.moe_dispatch %[[Y]], %[[N]] alltoall
// CHECK: %[[H2:.*]] = mt.moe_grouped_matmul %{{.*}}, %{{.*}}, %[[LC]] : (tensor<32x16xf32>, tensor<2x8x16xf32>, tensor<2xi32>) -> tensor<32x8xf32>
// CHECK: %[[B:.*]] = mt.moe_combine %[[H2]], %[[LAY]], %[[N]] alltoall
// CHECK: %[[DB:.*]], %{{.*}} = mt.moe_unpermute_grad %{{.*}}, %[[B]], %{{.*}}, %[[IDS]], %[[N]]
// CHECK-NEXT: %[[DR:.*]], %{{.*}}, %{{.*}} = mt.moe_dispatch %[[DB]], %[[N]] alltoall {ep_size = 2 : i64, mt.layer = 0 : i64, num_local_experts = 2 : i64} : (tensor<16x8xf32>, tensor<4xi32>) -> (tensor<32x8xf32>, tensor<2xi32>, tensor<2x2xi32>)
// CHECK-NEXT: mt.moe_grouped_matmul_input_grad %[[DR]], %{{.*}}, %[[LC]]
// CHECK-NEXT: mt.moe_grouped_matmul_weight_grad %[[DR]], %{{.*}}, %[[LC]] into @decoder.layers.0.mlp.experts.linear_fc2.weight
// CHECK: %[[DX:.*]] = mt.moe_grouped_matmul_input_grad %{{.*}}, %{{.*}}, %[[LC]] : (tensor<32x32xf32>, tensor<2x32x8xf32>, tensor<2xi32>) -> tensor<32x8xf32>
// CHECK-NEXT: mt.moe_grouped_matmul_weight_grad %{{.*}}, %[[R]], %[[LC]] into @decoder.layers.0.mlp.experts.linear_fc1.weight
// CHECK-NEXT: %[[DY:.*]] = mt.moe_combine %[[DX]], %[[LAY]], %[[N]] alltoall {ep_size = 2 : i64, mt.layer = 0 : i64, num_local_experts = 2 : i64} : (tensor<32x8xf32>, tensor<2x2xi32>, tensor<4xi32>) -> tensor<16x8xf32>
// CHECK-NEXT: mt.moe_permute_grad %[[DY]], %[[IDS]]
module attributes {mt.training = {num_micro_batches = 1 : i64}, mt.parallel = {data_parallel_size = 1 : i64, expert_model_parallel_size = 2 : i64, expert_tensor_parallel_size = 1 : i64, moe_token_dispatcher_type = "alltoall", pipeline_model_parallel_size = 1 : i64, sequence_parallel = false, tensor_model_parallel_size = 1 : i64}} {
  mt.param @decoder.layers.0.mlp.router.weight : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.experts.linear_fc1.weight : tensor<4x32x8xf32>, normal(2.000000e-02)
  mt.param @decoder.layers.0.mlp.experts.linear_fc2.weight : tensor<4x8x16xf32>, normal(1.000000e-02)
  mt.param @out : tensor<32x8xf32>, normal(2.000000e-02)
  func.func @forward(%x: tensor<2x4x8xf32> {mt.name = "x"}, %labels: tensor<2x4xi32> {mt.name = "labels"}) -> (tensor<f32>, tensor<f32> {mt.name = "load_balancing_loss"}) {
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
    %wo = mt.param_ref @out : tensor<32x8xf32>
    %lg = mt.matmul %o3, %wo : (tensor<2x4x8xf32>, tensor<32x8xf32>) -> tensor<2x4x32xf32>
    %loss = mt.cross_entropy %lg, %labels : (tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %loss, %aux : tensor<f32>, tensor<f32>
  }
}