// mt-fuse on a mixture-of-experts layer's step: the router, permutations and
// grouped matmuls (and their backward ops) stay outside every kernel; the
// elementwise ops between them fuse as usual (the routed output's reshape
// and residual add; in the backward, the two gradients of the token rows
// with the residual's).
// RUN: mtc-opt %s -mt-autodiff -mt-fuse | FileCheck %s

// CHECK-LABEL: func.func @train_step(
// CHECK-NOT: mt.fused
// CHECK: mt.moe_router
// CHECK-NEXT: mt.moe_permute
// CHECK-NEXT: mt.param_ref
// CHECK-NEXT: mt.moe_grouped_matmul
// CHECK-NEXT: mt.swiglu
// CHECK-NEXT: mt.param_ref
// CHECK-NEXT: mt.moe_grouped_matmul
// CHECK-NEXT: %[[O:.*]] = mt.moe_unpermute
// CHECK-NEXT: mt.fused elementwise "reshape+add" (%{{.*}} = %[[O]], %{{.*}} = %{{.*}})
// CHECK: mt.moe_unpermute_grad
// CHECK-NEXT: mt.moe_grouped_matmul_input_grad
// CHECK-NEXT: mt.moe_grouped_matmul_weight_grad
// CHECK-NEXT: mt.swiglu_grad
// CHECK-NEXT: mt.moe_grouped_matmul_input_grad
// CHECK-NEXT: mt.moe_grouped_matmul_weight_grad
// CHECK-NEXT: %[[DX:.*]] = mt.moe_permute_grad
// CHECK-NEXT: mt.grad_seed
// CHECK-NEXT: mt.moe_router_grad
// CHECK-NEXT: %[[DR:.*]] = mt.matmul_input_grad
// CHECK-NEXT: mt.matmul_weight_grad
// CHECK-NEXT: mt.fused elementwise "add+reshape+add" (%{{.*}} = %[[DX]], %{{.*}} = %[[DR]], %{{.*}} = %{{.*}})
// CHECK-LABEL: func.func @eval_step(

module attributes {mt.training = {num_micro_batches = 4 : i64}} {
  mt.param @emb : tensor<32x8xf32>, normal(2.000000e-02)
  mt.param @router : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @fc1 : tensor<4x32x8xf32>, normal(2.000000e-02)
  mt.param @fc2 : tensor<4x8x16xf32>, normal(1.000000e-02)
  mt.param @out : tensor<32x8xf32>, normal(2.000000e-02)
  func.func @forward(%tokens: tensor<2x4xi32> {mt.name = "tokens"}, %labels: tensor<2x4xi32> {mt.name = "labels"})
      -> (tensor<f32>, tensor<f32> {mt.name = "load_balancing_loss"}, tensor<f32> {mt.name = "z_loss"}) {
    %e = mt.param_ref @emb : tensor<32x8xf32>
    %x = mt.embedding %e, %tokens : (tensor<32x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
    %xf = mt.reshape %x : (tensor<2x4x8xf32>) -> tensor<8x8xf32>
    %wr = mt.param_ref @router : tensor<4x8xf32>
    %logits = mt.matmul %xf, %wr : (tensor<8x8xf32>, tensor<4x8xf32>) -> tensor<8x4xf32>
    %p, %m, %aux, %z = mt.moe_router %logits softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 4 : i64, topk = 2 : i64, z_loss_coeff = 1.0e-03 : f64} : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x4xi32>, tensor<f32>, tensor<f32>)
    %y, %rows, %n = mt.moe_permute %xf, %m {capacity = 0 : i64} : (tensor<8x8xf32>, tensor<8x4xi32>) -> (tensor<16x8xf32>, tensor<16xi32>, tensor<4xi32>)
    %w1 = mt.param_ref @fc1 : tensor<4x32x8xf32>
    %h = mt.moe_grouped_matmul %y, %w1, %n : (tensor<16x8xf32>, tensor<4x32x8xf32>, tensor<4xi32>) -> tensor<16x32xf32>
    %a = mt.swiglu %h : (tensor<16x32xf32>) -> tensor<16x16xf32>
    %w2 = mt.param_ref @fc2 : tensor<4x8x16xf32>
    %h2 = mt.moe_grouped_matmul %a, %w2, %n : (tensor<16x16xf32>, tensor<4x8x16xf32>, tensor<4xi32>) -> tensor<16x8xf32>
    %o = mt.moe_unpermute %h2, %p, %rows, %n : (tensor<16x8xf32>, tensor<8x4xf32>, tensor<16xi32>, tensor<4xi32>) -> tensor<8x8xf32>
    %o3 = mt.reshape %o : (tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %r = mt.add %x, %o3 : tensor<2x4x8xf32>
    %wo = mt.param_ref @out : tensor<32x8xf32>
    %logits2 = mt.matmul %r, %wo : (tensor<2x4x8xf32>, tensor<32x8xf32>) -> tensor<2x4x32xf32>
    %loss = mt.cross_entropy %logits2, %labels : (tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %loss, %aux, %z : tensor<f32>, tensor<f32>, tensor<f32>
  }
}
