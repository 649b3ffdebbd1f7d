// mt-recompute (full) on a mixture-of-experts layer: the router, the
// permutation and the expert matmuls are re-executed before the layer's
// backward, which then reads only the copies; the auxiliary losses returned
// for the log stay the forward's.
// RUN: mtc-opt %s -mt-autodiff -mt-recompute | FileCheck %s

// CHECK-LABEL: func.func @train_step(
// CHECK:   %{{.*}}, %{{.*}}, %[[AUX:.*]], %[[Z:.*]] = mt.moe_router %{{.*}} softmax
// CHECK:   %[[LOSS:.*]] = mt.cross_entropy
// CHECK:   mt.grad_seed
// CHECK:   %[[XF:.*]] = mt.reshape %{{.*}} {mt.layer = 0 : i64, mt.recomputed}
// CHECK:   %[[LG:.*]] = mt.matmul %[[XF]], %{{.*}} {mt.layer = 0 : i64, mt.recomputed}
// CHECK:   %[[P:.*]], %[[M:.*]], %{{.*}}, %{{.*}} = mt.moe_router %[[LG]] {{.*}}mt.recomputed
// CHECK:   %[[Y:.*]], %[[ROWS:.*]], %[[N:.*]] = mt.moe_permute %[[XF]], %[[M]] {{.*}}mt.recomputed
// CHECK:   %[[H:.*]] = mt.moe_grouped_matmul %[[Y]], %{{.*}}, %[[N]] {{.*}}mt.recomputed
// CHECK:   %[[A:.*]] = mt.swiglu %[[H]] {{.*}}mt.recomputed
// CHECK:   %[[H2:.*]] = mt.moe_grouped_matmul %[[A]], %{{.*}}, %[[N]] {{.*}}mt.recomputed
// CHECK:   mt.moe_unpermute_grad %{{.*}}, %[[H2]], %[[P]], %[[ROWS]], %[[N]]
// CHECK:   mt.moe_router_grad %{{.*}}, %[[LG]], %[[P]], %[[M]]
// CHECK:   return %[[LOSS]], %[[AUX]], %[[Z]]

module attributes {mt.training = {num_micro_batches = 4 : i64, recompute_granularity = "full", recompute_method = "uniform", recompute_num_layers = 1 : i64}} {
  mt.param @emb : tensor<32x8xf32>, normal(2.000000e-02)
  mt.param @router : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @fc1 : tensor<4x32x8xf32>, normal(2.000000e-02)
  mt.param @fc2 : tensor<4x8x16xf32>, normal(1.000000e-02)
  mt.param @out : tensor<32x8xf32>, normal(2.000000e-02)
  func.func @forward(%tokens: tensor<2x4xi32> {mt.name = "tokens"}, %labels: tensor<2x4xi32> {mt.name = "labels"})
      -> (tensor<f32>, tensor<f32> {mt.name = "load_balancing_loss"}, tensor<f32> {mt.name = "z_loss"}) {
    %e = mt.param_ref @emb : tensor<32x8xf32>
    %x = mt.embedding %e, %tokens : (tensor<32x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
    %xf = mt.reshape %x {mt.layer = 0 : i64} : (tensor<2x4x8xf32>) -> tensor<8x8xf32>
    %wr = mt.param_ref @router : tensor<4x8xf32>
    %logits = mt.matmul %xf, %wr {mt.layer = 0 : i64} : (tensor<8x8xf32>, tensor<4x8xf32>) -> tensor<8x4xf32>
    %p, %m, %aux, %z = mt.moe_router %logits softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 4 : i64, topk = 2 : i64, z_loss_coeff = 1.0e-03 : f64, mt.layer = 0 : i64} : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x4xi32>, tensor<f32>, tensor<f32>)
    %y, %rows, %n = mt.moe_permute %xf, %m {capacity = 0 : i64, mt.layer = 0 : i64} : (tensor<8x8xf32>, tensor<8x4xi32>) -> (tensor<16x8xf32>, tensor<16xi32>, tensor<4xi32>)
    %w1 = mt.param_ref @fc1 : tensor<4x32x8xf32>
    %h = mt.moe_grouped_matmul %y, %w1, %n {mt.layer = 0 : i64} : (tensor<16x8xf32>, tensor<4x32x8xf32>, tensor<4xi32>) -> tensor<16x32xf32>
    %a = mt.swiglu %h {mt.layer = 0 : i64} : (tensor<16x32xf32>) -> tensor<16x16xf32>
    %w2 = mt.param_ref @fc2 : tensor<4x8x16xf32>
    %h2 = mt.moe_grouped_matmul %a, %w2, %n {mt.layer = 0 : i64} : (tensor<16x16xf32>, tensor<4x8x16xf32>, tensor<4xi32>) -> tensor<16x8xf32>
    %o = mt.moe_unpermute %h2, %p, %rows, %n {mt.layer = 0 : i64} : (tensor<16x8xf32>, tensor<8x4xf32>, tensor<16xi32>, tensor<4xi32>) -> tensor<8x8xf32>
    %o3 = mt.reshape %o {mt.layer = 0 : i64} : (tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %r = mt.add %x, %o3 {mt.layer = 0 : i64} : tensor<2x4x8xf32>
    %wo = mt.param_ref @out : tensor<32x8xf32>
    %logits2 = mt.matmul %r, %wo : (tensor<2x4x8xf32>, tensor<32x8xf32>) -> tensor<2x4x32xf32>
    %loss = mt.cross_entropy %logits2, %labels : (tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %loss, %aux, %z : tensor<f32>, tensor<f32>, tensor<f32>
  }
}
