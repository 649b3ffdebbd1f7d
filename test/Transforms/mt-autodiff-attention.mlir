// mt-autodiff through attention: mt.attention_grad reads the forward's
// output and log-sum-exp (nothing seq x seq, and no second forward), the
// split's gradient merges the three head gradients, and a split that already
// rotates q and k (rope_base) passes its base to its gradient. The eval
// program keeps the lse result (unused) and drops the attention dropout.
// RUN: mtc-opt %s -mt-autodiff | FileCheck %s

module attributes {mt.training = {num_micro_batches = 1 : i64}} {
  mt.param @emb : tensor<32x16xf32>, normal(2.000000e-02)
  mt.param @qkv.weight : tensor<32x16xf32>, normal(2.000000e-02)
  mt.param @proj.weight : tensor<16x16xf32>, normal(1.000000e-02)
  func.func @forward(%tokens: tensor<2x4xi32> {mt.name = "tokens"}, %labels: tensor<2x4xi32> {mt.name = "labels"}) -> tensor<f32> {
    %e = mt.param_ref @emb : tensor<32x16xf32>
    %x = mt.embedding %e, %tokens : (tensor<32x16xf32>, tensor<2x4xi32>) -> tensor<2x4x16xf32>
    %wq = mt.param_ref @qkv.weight : tensor<32x16xf32>
    %qkv = mt.matmul %x, %wq : (tensor<2x4x16xf32>, tensor<32x16xf32>) -> tensor<2x4x32xf32>
    %q, %k, %v = mt.split_qkv %qkv {rope_base = 10000.0 : f64} : (tensor<2x4x32xf32>) -> (tensor<2x4x2x8xf32>, tensor<2x4x1x8xf32>, tensor<2x4x1x8xf32>)
    %o, %lse = mt.attention %q, %k, %v {causal, scale = 0.35 : f64, dropout_rate = 0.1 : f64, stream = 1 : i64} : tensor<2x4x2x8xf32>, tensor<2x4x1x8xf32>
    %or = mt.reshape %o : (tensor<2x4x2x8xf32>) -> tensor<2x4x16xf32>
    %wp = mt.param_ref @proj.weight : tensor<16x16xf32>
    %y = mt.matmul %or, %wp : (tensor<2x4x16xf32>, tensor<16x16xf32>) -> tensor<2x4x16xf32>
    %logits = mt.matmul %y, %e : (tensor<2x4x16xf32>, tensor<32x16xf32>) -> tensor<2x4x32xf32>
    %loss = mt.cross_entropy %logits, %labels : (tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// CHECK-LABEL: func.func @train_step(
// CHECK:   %[[Q:.*]], %[[K:.*]], %[[V:.*]] = mt.split_qkv %{{.*}} {rope_base = 1.000000e+04 : f64}
// CHECK:   %[[O:.*]], %[[LSE:.*]] = mt.attention %[[Q]], %[[K]], %[[V]] {causal, dropout_rate = 1.000000e-01 : f64, scale = 3.500000e-01 : f64, stream = 1 : i64} : tensor<2x4x2x8xf32>, tensor<2x4x1x8xf32>
// CHECK:   mt.grad_seed
// CHECK:   %[[DOR:.*]] = mt.reshape %{{.*}} : (tensor<2x4x16xf32>) -> tensor<2x4x2x8xf32>
// CHECK:   %[[DQ:.*]], %[[DK:.*]], %[[DV:.*]] = mt.attention_grad %[[DOR]], %[[Q]], %[[K]], %[[V]], %[[O]], %[[LSE]] {causal, dropout_rate = 1.000000e-01 : f64, scale = 3.500000e-01 : f64, stream = 1 : i64}
// CHECK-NOT: mt.attention %
// CHECK:   mt.split_qkv_grad %[[DQ]], %[[DK]], %[[DV]] {rope_base = 1.000000e+04 : f64}
// CHECK:   return

// CHECK-LABEL: func.func @eval_step(
// CHECK:   %{{.*}}, %{{.*}} = mt.attention {{.*}}dropout_rate = 0.000000e+00 : f64
// CHECK-NOT: grad
// CHECK: return
