// mt-autodiff: backward from VJP rules, gradient sums for reused values,
// parameter gradients into their buffers, and an eval program without dropout.
// RUN: mtc-opt %s -mt-autodiff | FileCheck %s

module attributes {mt.training = {num_micro_batches = 4 : i64}} {
  mt.param @emb : tensor<32x8xf32>, normal(2.000000e-02)
  mt.param @ln.weight : tensor<8xf32>, ones
  mt.param @ln.bias : tensor<8xf32>, zeros
  mt.param @fc.weight : tensor<16x8xf32>, normal(2.000000e-02)
  mt.param @fc.bias : tensor<16xf32>, zeros
  mt.param @proj.weight : tensor<8x16xf32>, normal(1.000000e-02)
  func.func @forward(%tokens: tensor<2x4xi32> {mt.name = "tokens"}, %labels: tensor<2x4xi32> {mt.name = "labels"}) -> tensor<f32> {
    %e = mt.param_ref @emb : tensor<32x8xf32>
    %x = mt.embedding %e, %tokens : (tensor<32x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
    %d = mt.dropout %x {rate = 1.000000e-01 : f64, stream = 0 : i64} : tensor<2x4x8xf32>
    %lw = mt.param_ref @ln.weight : tensor<8xf32>
    %lb = mt.param_ref @ln.bias : tensor<8xf32>
    %n = mt.layer_norm %d, %lw, %lb {epsilon = 1.000000e-05 : f64} : tensor<2x4x8xf32>, tensor<8xf32>
    %w1 = mt.param_ref @fc.weight : tensor<16x8xf32>
    %h = mt.matmul %n, %w1 : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
    %b1 = mt.param_ref @fc.bias : tensor<16xf32>
    %hb = mt.bias_add %h, %b1 : tensor<2x4x16xf32>, tensor<16xf32>
    %g = mt.gelu %hb tanh : tensor<2x4x16xf32>
    %w2 = mt.param_ref @proj.weight : tensor<8x16xf32>
    %y = mt.matmul %g, %w2 : (tensor<2x4x16xf32>, tensor<8x16xf32>) -> tensor<2x4x8xf32>
    %r = mt.add %d, %y : tensor<2x4x8xf32>
    %logits = mt.matmul %r, %e : (tensor<2x4x8xf32>, tensor<32x8xf32>) -> tensor<2x4x32xf32>
    %loss = mt.cross_entropy %logits, %labels : (tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// CHECK-NOT: func.func @forward
// CHECK-LABEL: func.func @train_step(
// CHECK:   %[[E:.*]] = mt.param_ref @emb
// CHECK:   %[[X:.*]] = mt.embedding %[[E]], %[[TOK:.*]] :
// CHECK:   %[[D:.*]] = mt.dropout %[[X]] {rate = 1.000000e-01 : f64, stream = 0 : i64}
// CHECK:   %[[N:.*]] = mt.layer_norm %[[D]]
// CHECK:   %[[H:.*]] = mt.matmul %[[N]]
// CHECK:   %[[HB:.*]] = mt.bias_add %[[H]]
// CHECK:   %[[G:.*]] = mt.gelu %[[HB]] tanh
// CHECK:   %[[Y:.*]] = mt.matmul %[[G]]
// CHECK:   %[[R:.*]] = mt.add %[[D]], %[[Y]]
// CHECK:   %[[L:.*]] = mt.matmul %[[R]], %[[E]]
// CHECK:   %[[LOSS:.*]] = mt.cross_entropy %[[L]], %[[LAB:.*]] :
// The mean over 4 micro-batches:
// CHECK:   %[[SEED:.*]] = mt.grad_seed {scale = 2.500000e-01 : f64}
// CHECK:   %[[DL:.*]] = mt.cross_entropy_grad %[[L]], %[[LAB]], %[[SEED]]
// The tied table gets the output layer's weight gradient...
// CHECK:   %[[DR:.*]] = mt.matmul_input_grad %[[DL]], %[[E]]
// CHECK:   mt.matmul_weight_grad %[[DL]], %[[R]] into @emb
// CHECK:   %[[DG:.*]] = mt.matmul_input_grad %[[DR]], %{{.*}}
// CHECK:   mt.matmul_weight_grad %[[DR]], %[[G]] into @proj.weight
// CHECK:   %[[DHB:.*]] = mt.gelu_grad %[[DG]], %[[HB]] tanh
// CHECK:   mt.bias_grad %[[DHB]] into @fc.bias
// CHECK:   %[[DN:.*]] = mt.matmul_input_grad %[[DHB]], %{{.*}}
// CHECK:   mt.matmul_weight_grad %[[DHB]], %[[N]] into @fc.weight
// CHECK:   %[[DD:.*]] = mt.layer_norm_grad %[[DN]], %[[D]], %{{.*}} into @ln.weight, @ln.bias
// The residual's input is read twice: its gradient is the sum.
// CHECK:   %[[SUM:.*]] = mt.add %[[DR]], %[[DD]]
// Dropout's gradient is the same dropout (same stream, same mask).
// CHECK:   %[[DX:.*]] = mt.dropout %[[SUM]] {rate = 1.000000e-01 : f64, stream = 0 : i64}
// ...and the embedding's.
// CHECK:   mt.embedding_grad %[[DX]], %[[TOK]] into @emb
// CHECK:   return %[[LOSS]] : tensor<f32>

// CHECK-LABEL: func.func @eval_step(
// CHECK-NOT: mt.dropout
// CHECK-NOT: grad
// CHECK: return
