// mt-autodiff on a mixture-of-experts MLP: the VJP rules of the router,
// permutation, grouped matmuls and unpermutation; the router's gradient
// takes the gradient seed as the auxiliary losses' scale; @forward's named
// results (the auxiliary losses for the log) are outputs, not seeded.
// RUN: mtc-opt %s -mt-autodiff | FileCheck %s

module attributes {mt.training = {num_micro_batches = 4 : i64}} {
  mt.param @router : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @fc1 : tensor<4x32x8xf32>, normal(2.000000e-02)
  mt.param @fc2 : tensor<4x8x16xf32>, normal(1.000000e-02)
  mt.param @out : tensor<32x8xf32>, normal(2.000000e-02)
  func.func @forward(%x: tensor<2x4x8xf32> {mt.name = "x"}, %labels: tensor<2x4xi32> {mt.name = "labels"})
      -> (tensor<f32>, tensor<f32> {mt.name = "load_balancing_loss"}, tensor<f32> {mt.name = "z_loss"}) {
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

// CHECK-LABEL: func.func @train_step(
// CHECK-SAME: -> (tensor<f32>, tensor<f32> {mt.name = "load_balancing_loss"}, tensor<f32> {mt.name = "z_loss"})
// CHECK:   %[[XF:.*]] = mt.reshape %{{.*}} : (tensor<2x4x8xf32>) -> tensor<8x8xf32>
// CHECK:   %[[LOGITS:.*]] = mt.matmul %[[XF]]
// CHECK:   %[[P:.*]], %[[M:.*]], %[[AUX:.*]], %[[Z:.*]] = mt.moe_router %[[LOGITS]]
// CHECK:   %[[Y:.*]], %[[ROWS:.*]], %[[N:.*]] = mt.moe_permute %[[XF]], %[[M]]
// CHECK:   %[[H:.*]] = mt.moe_grouped_matmul %[[Y]], %{{.*}}, %[[N]]
// CHECK:   %[[A:.*]] = mt.swiglu %[[H]]
// CHECK:   %[[H2:.*]] = mt.moe_grouped_matmul %[[A]], %{{.*}}, %[[N]]
// CHECK:   %[[O:.*]] = mt.moe_unpermute %[[H2]], %[[P]], %[[ROWS]], %[[N]]
// CHECK:   %[[LOSS:.*]] = mt.cross_entropy
// Only the loss is seeded.
// CHECK:   %[[SEED:.*]] = mt.grad_seed {scale = 2.500000e-01 : f64}
// CHECK:   %[[DO:.*]] = mt.reshape %{{.*}} : (tensor<2x4x8xf32>) -> tensor<8x8xf32>
// CHECK:   %[[DH2:.*]], %[[DP:.*]] = mt.moe_unpermute_grad %[[DO]], %[[H2]], %[[P]], %[[ROWS]], %[[N]]
// CHECK:   %[[DA:.*]] = mt.moe_grouped_matmul_input_grad %[[DH2]], %{{.*}}, %[[N]]
// CHECK:   mt.moe_grouped_matmul_weight_grad %[[DH2]], %[[A]], %[[N]] into @fc2
// CHECK:   %[[DH:.*]] = mt.swiglu_grad %[[DA]], %[[H]]
// CHECK:   %[[DY:.*]] = mt.moe_grouped_matmul_input_grad %[[DH]], %{{.*}}, %[[N]]
// CHECK:   mt.moe_grouped_matmul_weight_grad %[[DH]], %[[Y]], %[[N]] into @fc1
// CHECK:   %[[DXP:.*]] = mt.moe_permute_grad %[[DY]], %[[ROWS]] : (tensor<16x8xf32>, tensor<16xi32>) -> tensor<8x8xf32>
// The auxiliary losses' gradients are scaled by the seed's value (the
// router's own copy, in its layer's backward).
// CHECK:   %[[SCALE:.*]] = mt.grad_seed {scale = 2.500000e-01 : f64}
// CHECK:   %[[DL:.*]] = mt.moe_router_grad %[[DP]], %[[LOGITS]], %[[P]], %[[M]], %[[SCALE]] softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.000000e-02 : f64, capacity = 0 : i64, scaling_factor = 0.000000e+00 : f64, seq_length = 4 : i64, topk = 2 : i64, z_loss_coeff = 1.000000e-03 : f64}
// CHECK:   %[[DXR:.*]] = mt.matmul_input_grad %[[DL]]
// CHECK:   mt.matmul_weight_grad %[[DL]], %[[XF]] into @router
// The token rows reach the router and the experts: their gradients add.
// CHECK:   mt.add %[[DXP]], %[[DXR]]
// CHECK:   return %[[LOSS]], %[[AUX]], %[[Z]] : tensor<f32>, tensor<f32>, tensor<f32>

// CHECK-LABEL: func.func @eval_step(
// CHECK-SAME: -> (tensor<f32>, tensor<f32> {mt.name = "load_balancing_loss"}, tensor<f32> {mt.name = "z_loss"})
// CHECK-NOT: grad
// CHECK: return
