// The training-step ops (backward and optimizer) parse, verify and print back.
// RUN: mtc-opt %s | mtc-opt | FileCheck %s
// RUN: mtc-opt %s --mlir-print-op-generic | mtc-opt | FileCheck %s

mt.param @emb : tensor<64x16xf32>, normal(2.000000e-02)
mt.param @w : tensor<48x16xf32>, normal(2.000000e-02)
mt.param @b : tensor<48xf32>, zeros
mt.param @ln.weight : tensor<16xf32>, ones
mt.param @ln.bias : tensor<16xf32>, zeros

// CHECK-LABEL: func.func @backward
func.func @backward(%x: tensor<2x8x16xf32>, %ids: tensor<2x8xi32>, %dy: tensor<2x8x48xf32>,
                    %lnw: tensor<16xf32>, %w: tensor<48x16xf32>, %logits: tensor<2x8x64xf32>,
                    %u: tensor<2x8x32xf32>, %dq: tensor<2x8x2x8xf32>, %dkv: tensor<2x8x1x8xf32>,
                    %lse: tensor<2x2x8xf32>) {
  // CHECK: mt.grad_seed {scale = 2.500000e-01 : f64} : tensor<f32>
  %seed = mt.grad_seed {scale = 0.25 : f64} : tensor<f32>
  // CHECK: mt.cross_entropy_grad
  %dl = mt.cross_entropy_grad %logits, %ids, %seed : (tensor<2x8x64xf32>, tensor<2x8xi32>, tensor<f32>) -> tensor<2x8x64xf32>
  // CHECK: mt.embedding_grad %{{.*}}, %{{.*}} into @emb
  mt.embedding_grad %x, %ids into @emb : tensor<2x8x16xf32>, tensor<2x8xi32>
  // CHECK: mt.matmul_input_grad
  %dx = mt.matmul_input_grad %dy, %w : (tensor<2x8x48xf32>, tensor<48x16xf32>) -> tensor<2x8x16xf32>
  // CHECK: mt.matmul_weight_grad %{{.*}}, %{{.*}} into @w
  mt.matmul_weight_grad %dy, %x into @w : tensor<2x8x48xf32>, tensor<2x8x16xf32>
  // CHECK: mt.bias_grad %{{.*}} into @b
  mt.bias_grad %dy into @b : tensor<2x8x48xf32>
  // CHECK: mt.layer_norm_grad %{{.*}} into @ln.weight, @ln.bias
  %dn = mt.layer_norm_grad %dx, %x, %lnw into @ln.weight, @ln.bias {epsilon = 1.0e-05 : f64} : tensor<2x8x16xf32>, tensor<16xf32>
  // CHECK: mt.rms_norm_grad %{{.*}} into @ln.weight
  %dr = mt.rms_norm_grad %dx, %x, %lnw into @ln.weight {epsilon = 1.0e-05 : f64} : tensor<2x8x16xf32>, tensor<16xf32>
  // CHECK: mt.gelu_grad %{{.*}}, %{{.*}} erf
  %dg = mt.gelu_grad %dx, %x erf : tensor<2x8x16xf32>
  // CHECK: mt.swiglu_grad
  %ds = mt.swiglu_grad %x, %u : (tensor<2x8x16xf32>, tensor<2x8x32xf32>) -> tensor<2x8x32xf32>
  // CHECK: mt.rope_grad
  %dro = mt.rope_grad %dq {base = 1.0e+04 : f64} : tensor<2x8x2x8xf32>
  // CHECK: mt.attention_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[LSE:.*]] {causal
  %a, %k, %v = mt.attention_grad %dq, %dq, %dkv, %dkv, %dq, %lse {causal, scale = 0.35 : f64, dropout_rate = 0.0 : f64, stream = 1 : i64} : tensor<2x8x2x8xf32>, tensor<2x8x1x8xf32>
  // CHECK: mt.split_qkv_grad
  %dqkv = mt.split_qkv_grad %a, %k, %v : (tensor<2x8x2x8xf32>, tensor<2x8x1x8xf32>, tensor<2x8x1x8xf32>) -> tensor<2x8x32xf32>
  // CHECK: mt.split_qkv_grad %{{.*}}, %{{.*}}, %{{.*}} {rope_base = 5.000000e+05 : f64} : (tensor<2x8x2x8xf32>, tensor<2x8x1x8xf32>, tensor<2x8x1x8xf32>) -> tensor<2x8x32xf32>
  %dqkv2 = mt.split_qkv_grad %a, %k, %v {rope_base = 5.0e+05 : f64} : (tensor<2x8x2x8xf32>, tensor<2x8x1x8xf32>, tensor<2x8x1x8xf32>) -> tensor<2x8x32xf32>
  return
}

// CHECK-LABEL: func.func @optimizer
func.func @optimizer(%steps: tensor<i64>, %step: tensor<i64>) -> tensor<f32> {
  // CHECK: mt.all_reduce_grads {group = "dp", scale = 2.500000e-01 : f64}
  mt.all_reduce_grads {group = "dp", scale = 0.25 : f64}
  // CHECK: mt.grad_norm : tensor<f32>
  %n = mt.grad_norm : tensor<f32>
  // CHECK: mt.lr_schedule %{{.*}} cosine
  %lr = mt.lr_schedule %steps cosine {lr = 1.0e-03 : f64, min_lr = 1.0e-04 : f64, warmup_iters = 10 : i64, decay_iters = 100 : i64} : tensor<i64> -> tensor<f32>
  // CHECK: mt.lr_schedule %{{.*}} wsd anneal minus_sqrt {decay_iters = 100 : i64, lr = 1.000000e-03 : f64, min_lr = 1.000000e-04 : f64, warmup_iters = 10 : i64, wsd_decay_iters = 20 : i64}
  %wsd = mt.lr_schedule %steps wsd anneal minus_sqrt {lr = 1.0e-03 : f64, min_lr = 1.0e-04 : f64, warmup_iters = 10 : i64, decay_iters = 100 : i64, wsd_decay_iters = 20 : i64} : tensor<i64> -> tensor<f32>
  // CHECK: mt.lr_schedule %{{.*}} inverse_square_root {decay_iters = 100 : i64, lr = 1.000000e-03 : f64, min_lr = 1.000000e-04 : f64, samples_per_step = 512 : i64, warmup_iters = 10 : i64}
  %isr = mt.lr_schedule %steps inverse_square_root {lr = 1.0e-03 : f64, min_lr = 1.0e-04 : f64, warmup_iters = 10 : i64, decay_iters = 100 : i64, samples_per_step = 512 : i64} : tensor<i64> -> tensor<f32>
  // CHECK: mt.clip_coeff %{{.*}}, %{{.*}} {max_norm
  %c = mt.clip_coeff %n, %n {max_norm = 1.0 : f64} : tensor<f32>
  // CHECK: mt.adamw @w, %{{.*}}, %{{.*}}, %{{.*}} {beta1
  mt.adamw @w, %lr, %c, %step {beta1 = 0.9 : f64, beta2 = 0.999 : f64, epsilon = 1.0e-08 : f64, weight_decay = 0.01 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
  // CHECK: mt.sgd @w, %{{.*}}, %{{.*}} {momentum = 9.000000e-01 : f64, weight_decay = 1.000000e-02 : f64} : tensor<f32>, tensor<f32>
  mt.sgd @w, %lr, %c {momentum = 0.9 : f64, weight_decay = 0.01 : f64} : tensor<f32>, tensor<f32>
  return %lr : tensor<f32>
}


// CHECK-LABEL: func.func @pipeline
// CHECK: mt.send %{{.*}} to 1 {tag = 0 : i64} : tensor<2x4xf32>
// CHECK: mt.recv from 1 {tag = 1 : i64} : tensor<2x4xf32>
// CHECK: mt.all_reduce_tied_grad @emb {peer = 1 : i64, tag = 0 : i64}
// CHECK: mt.grad_norm {group = "mp"} : tensor<f32>
func.func @pipeline(%x: tensor<2x4xf32>) -> tensor<f32> {
  mt.send %x to 1 {tag = 0 : i64} : tensor<2x4xf32>
  %g = mt.recv from 1 {tag = 1 : i64} : tensor<2x4xf32>
  mt.all_reduce_tied_grad @emb {peer = 1 : i64, tag = 0 : i64}
  %n = mt.grad_norm {group = "mp"} : tensor<f32>
  return %n : tensor<f32>
}

// Mixture of experts: the backward ops mt-autodiff builds from the forward's
// VJP rules.
mt.param @experts.fc1 : tensor<4x64x16xf32>, normal(2.000000e-02)

// CHECK-LABEL: func.func @moe_backward
func.func @moe_backward(%dout: tensor<64x16xf32>, %h2: tensor<128x16xf32>, %probs: tensor<64x4xf32>,
                        %rows: tensor<128xi32>, %n: tensor<4xi32>, %logits: tensor<64x4xf32>,
                        %map: tensor<64x4xi32>, %w: tensor<4x64x16xf32>, %y: tensor<128x16xf32>,
                        %dh: tensor<128x64xf32>) -> (tensor<64x4xf32>, tensor<64x16xf32>, tensor<128x16xf32>) {
  %seed = mt.grad_seed {scale = 0.25 : f64} : tensor<f32>
  // CHECK: %[[DH2:.*]], %[[DP:.*]] = mt.moe_unpermute_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : (tensor<64x16xf32>, tensor<128x16xf32>, tensor<64x4xf32>, tensor<128xi32>, tensor<4xi32>) -> (tensor<128x16xf32>, tensor<64x4xf32>)
  %dh2, %dprobs = mt.moe_unpermute_grad %dout, %h2, %probs, %rows, %n : (tensor<64x16xf32>, tensor<128x16xf32>, tensor<64x4xf32>, tensor<128xi32>, tensor<4xi32>) -> (tensor<128x16xf32>, tensor<64x4xf32>)
  // CHECK: mt.moe_grouped_matmul_input_grad %{{.*}}, %{{.*}}, %{{.*}} : (tensor<128x64xf32>, tensor<4x64x16xf32>, tensor<4xi32>) -> tensor<128x16xf32>
  %dy = mt.moe_grouped_matmul_input_grad %dh, %w, %n : (tensor<128x64xf32>, tensor<4x64x16xf32>, tensor<4xi32>) -> tensor<128x16xf32>
  // CHECK: mt.moe_grouped_matmul_weight_grad %{{.*}}, %{{.*}}, %{{.*}} into @experts.fc1 : tensor<128x64xf32>, tensor<128x16xf32>, tensor<4xi32>
  mt.moe_grouped_matmul_weight_grad %dh, %y, %n into @experts.fc1 : tensor<128x64xf32>, tensor<128x16xf32>, tensor<4xi32>
  // CHECK: mt.moe_permute_grad %{{.*}}, %{{.*}} : (tensor<128x16xf32>, tensor<128xi32>) -> tensor<64x16xf32>
  %dx = mt.moe_permute_grad %dy, %rows : (tensor<128x16xf32>, tensor<128xi32>) -> tensor<64x16xf32>
  // CHECK: mt.moe_router_grad %[[DP]], %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.000000e-02 : f64, capacity = 0 : i64, scaling_factor = 0.000000e+00 : f64, seq_length = 32 : i64, topk = 2 : i64, z_loss_coeff = 1.000000e-03 : f64} : (tensor<64x4xf32>, tensor<64x4xf32>, tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>) -> tensor<64x4xf32>
  %dl = mt.moe_router_grad %dprobs, %logits, %probs, %map, %seed softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.000000e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 32 : i64, topk = 2 : i64, z_loss_coeff = 1.000000e-03 : f64} : (tensor<64x4xf32>, tensor<64x4xf32>, tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>) -> tensor<64x4xf32>
  return %dl, %dx, %dh2 : tensor<64x4xf32>, tensor<64x16xf32>, tensor<128x16xf32>
}
