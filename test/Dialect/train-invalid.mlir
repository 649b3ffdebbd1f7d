// Every verifier of the training-step ops rejects what it must.
// RUN: mtc-opt %s -split-input-file -verify-diagnostics

mt.param @emb : tensor<64x16xf32>, normal(2.000000e-02)
func.func @f(%x: tensor<2x8x16xf32>, %ids: tensor<2x4xi32>) {
  // expected-error @+1 {{gradient [2, 8, 16] must be the ids' shape [2, 4] plus the embedding dim}}
  mt.embedding_grad %x, %ids into @emb : tensor<2x8x16xf32>, tensor<2x4xi32>
  return
}

// -----

mt.param @emb : tensor<64x32xf32>, normal(2.000000e-02)
func.func @f(%x: tensor<2x8x16xf32>, %ids: tensor<2x8xi32>) {
  // expected-error @+1 {{table 'tensor<64x32xf32>' does not match the gradient 'tensor<2x8x16xf32>'}}
  mt.embedding_grad %x, %ids into @emb : tensor<2x8x16xf32>, tensor<2x8xi32>
  return
}

// -----

func.func @f(%x: tensor<2x8x16xf32>, %ids: tensor<2x8xi32>) {
  // expected-error @+1 {{table 'nope' does not name an mt.param}}
  mt.embedding_grad %x, %ids into @nope : tensor<2x8x16xf32>, tensor<2x8xi32>
  return
}

// -----

func.func @f(%dy: tensor<2x8x48xf32>, %w: tensor<32x16xf32>) {
  // expected-error @+1 {{gradient's last dim 48 differs from the weight's out features 32}}
  %dx = mt.matmul_input_grad %dy, %w : (tensor<2x8x48xf32>, tensor<32x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @f(%dy: tensor<2x8x48xf32>, %w: tensor<48x16xf32>) {
  // expected-error @+1 {{result shape [2, 8, 48] should be [2, 8, 16]}}
  %dx = mt.matmul_input_grad %dy, %w : (tensor<2x8x48xf32>, tensor<48x16xf32>) -> tensor<2x8x48xf32>
  return
}

// -----

func.func @f(%dy: tensor<48xf32>, %w: tensor<48x16xf32>) {
  // expected-error @+1 {{weight must be [out, in] and the gradient of rank >= 2}}
  %dx = mt.matmul_input_grad %dy, %w : (tensor<48xf32>, tensor<48x16xf32>) -> tensor<16xf32>
  return
}

// -----

mt.param @w : tensor<48x16xf32>, normal(2.000000e-02)
func.func @f(%dy: tensor<2x8x48xf32>, %x: tensor<2x4x16xf32>) {
  // expected-error @+1 {{gradient [2, 8, 48] and input [2, 4, 16] must share leading dims}}
  mt.matmul_weight_grad %dy, %x into @w : tensor<2x8x48xf32>, tensor<2x4x16xf32>
  return
}

// -----

mt.param @w : tensor<16x48xf32>, normal(2.000000e-02)
func.func @f(%dy: tensor<2x8x48xf32>, %x: tensor<2x8x16xf32>) {
  // expected-error @+1 {{weight 'w' has type 'tensor<16x48xf32>' but the gradient is for 'tensor<48x16xf32>'}}
  mt.matmul_weight_grad %dy, %x into @w : tensor<2x8x48xf32>, tensor<2x8x16xf32>
  return
}

// -----

mt.param @b : tensor<16xf32>, zeros
func.func @f(%dy: tensor<f32>) {
  // expected-error @+1 {{gradient must have rank >= 1}}
  mt.bias_grad %dy into @b : tensor<f32>
  return
}

// -----

mt.param @b : tensor<16xf32>, zeros
func.func @f(%dy: tensor<2x48xf32>) {
  // expected-error @+1 {{bias 'b' has type 'tensor<16xf32>' but the gradient is for 'tensor<48xf32>'}}
  mt.bias_grad %dy into @b : tensor<2x48xf32>
  return
}

// -----

mt.param @w : tensor<16xf32>, ones
mt.param @b : tensor<16xf32>, zeros
func.func @f(%dy: tensor<2x8xf32>, %lnw: tensor<16xf32>) {
  // expected-error @+1 {{weight has 16 elements but the input's last dimension is 8}}
  %d = mt.layer_norm_grad %dy, %dy, %lnw into @w, @b {epsilon = 1.0e-05 : f64} : tensor<2x8xf32>, tensor<16xf32>
  return
}

// -----

mt.param @w : tensor<16xf32>, ones
mt.param @b : tensor<16xf32>, zeros
func.func @f(%dy: tensor<2x16xf32>, %lnw: tensor<16xf32>) {
  // expected-error @+1 {{epsilon must be positive}}
  %d = mt.layer_norm_grad %dy, %dy, %lnw into @w, @b {epsilon = 0.0 : f64} : tensor<2x16xf32>, tensor<16xf32>
  return
}

// -----

mt.param @w : tensor<16xf32>, ones
mt.param @b : tensor<8xf32>, zeros
func.func @f(%dy: tensor<2x16xf32>, %lnw: tensor<16xf32>) {
  // expected-error @+1 {{bias 'b' has type 'tensor<8xf32>' but the gradient is for 'tensor<16xf32>'}}
  %d = mt.layer_norm_grad %dy, %dy, %lnw into @w, @b {epsilon = 1.0e-05 : f64} : tensor<2x16xf32>, tensor<16xf32>
  return
}

// -----

mt.param @w : tensor<16xf32>, ones
func.func @f(%dy: tensor<2x8xf32>, %lnw: tensor<16xf32>) {
  // expected-error @+1 {{weight has 16 elements but the input's last dimension is 8}}
  %d = mt.rms_norm_grad %dy, %dy, %lnw into @w {epsilon = 1.0e-05 : f64} : tensor<2x8xf32>, tensor<16xf32>
  return
}

// -----

mt.param @w : tensor<16xf32>, ones
func.func @f(%dy: tensor<2x16xf32>, %lnw: tensor<16xf32>) {
  // expected-error @+1 {{epsilon must be positive}}
  %d = mt.rms_norm_grad %dy, %dy, %lnw into @w {epsilon = -1.0 : f64} : tensor<2x16xf32>, tensor<16xf32>
  return
}

// -----

func.func @f(%dy: tensor<2x16xf32>, %x: tensor<2x30xf32>) {
  // expected-error @+1 {{gradient shape [2, 16] should be [2, 15]}}
  %d = mt.swiglu_grad %dy, %x : (tensor<2x16xf32>, tensor<2x30xf32>) -> tensor<2x30xf32>
  return
}

// -----

func.func @f(%dy: tensor<2x16xf32>, %x: tensor<2x31xf32>) {
  // expected-error @+1 {{input's last dimension must be even}}
  %d = mt.swiglu_grad %dy, %x : (tensor<2x16xf32>, tensor<2x31xf32>) -> tensor<2x31xf32>
  return
}

// -----

func.func @f(%q: tensor<2x8x3x8xf32>, %kv: tensor<2x8x2x8xf32>) {
  // expected-error @+1 {{query heads must split evenly over key/value groups of the same head_dim}}
  %d = mt.split_qkv_grad %q, %kv, %kv : (tensor<2x8x3x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>) -> tensor<2x8x56xf32>
  return
}

// -----

func.func @f(%q: tensor<2x8x3x8xf32>, %k: tensor<2x8x3x8xf32>, %v: tensor<2x8x1x8xf32>) {
  // expected-error @+1 {{query, key and value gradients must be [batch, seq, heads, head_dim], key and value of one type}}
  %d = mt.split_qkv_grad %q, %k, %v : (tensor<2x8x3x8xf32>, tensor<2x8x3x8xf32>, tensor<2x8x1x8xf32>) -> tensor<2x8x72xf32>
  return
}

// -----

func.func @f(%q: tensor<2x8x2x8xf32>, %kv: tensor<2x8x1x8xf32>) {
  // expected-error @+1 {{result shape [2, 8, 64] should be [2, 8, 32]}}
  %d = mt.split_qkv_grad %q, %kv, %kv : (tensor<2x8x2x8xf32>, tensor<2x8x1x8xf32>, tensor<2x8x1x8xf32>) -> tensor<2x8x64xf32>
  return
}

// -----

func.func @f(%q: tensor<2x8x2x7xf32>, %kv: tensor<2x8x1x7xf32>) {
  // expected-error @+1 {{rope_base needs an even head_dim to rotate pairs, got 7}}
  %d = mt.split_qkv_grad %q, %kv, %kv {rope_base = 10000.0 : f64} : (tensor<2x8x2x7xf32>, tensor<2x8x1x7xf32>, tensor<2x8x1x7xf32>) -> tensor<2x8x28xf32>
  return
}

// -----

func.func @f(%q: tensor<2x8x2x8xf32>, %kv: tensor<2x8x1x8xf32>) {
  // expected-error @+1 {{rope_base must be greater than 1}}
  %d = mt.split_qkv_grad %q, %kv, %kv {rope_base = 0.5 : f64} : (tensor<2x8x2x8xf32>, tensor<2x8x1x8xf32>, tensor<2x8x1x8xf32>) -> tensor<2x8x32xf32>
  return
}

// -----

func.func @f(%l: tensor<2x8x64xf32>, %ids: tensor<2x4xi32>, %s: tensor<f32>) {
  // expected-error @+1 {{logits [2, 8, 64] must be the labels' shape [2, 4] plus a vocabulary dimension}}
  %d = mt.cross_entropy_grad %l, %ids, %s : (tensor<2x8x64xf32>, tensor<2x4xi32>, tensor<f32>) -> tensor<2x8x64xf32>
  return
}

// -----

func.func @f(%s: tensor<i64>) {
  // expected-error @+1 {{need 0 <= min_lr <= lr, got lr 1.000000e-04 and min_lr 1.000000e-03}}
  %lr = mt.lr_schedule %s cosine {lr = 1.0e-04 : f64, min_lr = 1.0e-03 : f64, warmup_iters = 1 : i64, decay_iters = 10 : i64} : tensor<i64> -> tensor<f32>
  return
}

// -----

func.func @f(%s: tensor<i64>) {
  // expected-error @+1 {{warmup_iters and decay_iters must not be negative}}
  %lr = mt.lr_schedule %s linear {lr = 1.0e-03 : f64, min_lr = 0.0 : f64, warmup_iters = -1 : i64, decay_iters = 10 : i64} : tensor<i64> -> tensor<f32>
  return
}

// -----

func.func @f(%s: tensor<i64>) {
  // expected-error @+1 {{decay_iters (10) must exceed warmup_iters (10)}}
  %lr = mt.lr_schedule %s linear {lr = 1.0e-03 : f64, min_lr = 0.0 : f64, warmup_iters = 10 : i64, decay_iters = 10 : i64} : tensor<i64> -> tensor<f32>
  return
}

// -----

func.func @f(%s: tensor<i64>) {
  // expected-error @+1 {{wsd_style and wsd_decay_iters are given with the wsd style, and only with it}}
  %lr = mt.lr_schedule %s wsd {lr = 1.0e-03 : f64, min_lr = 0.0 : f64, warmup_iters = 0 : i64, decay_iters = 10 : i64} : tensor<i64> -> tensor<f32>
  return
}

// -----

func.func @f(%s: tensor<i64>) {
  // expected-error @+1 {{wsd_style and wsd_decay_iters are given with the wsd style, and only with it}}
  %lr = mt.lr_schedule %s cosine anneal linear {lr = 1.0e-03 : f64, min_lr = 0.0 : f64, warmup_iters = 0 : i64, decay_iters = 10 : i64, wsd_decay_iters = 2 : i64} : tensor<i64> -> tensor<f32>
  return
}

// -----

func.func @f(%s: tensor<i64>) {
  // expected-error @+1 {{wsd_decay_iters (9) must be in [1, decay_iters - warmup_iters = 8]}}
  %lr = mt.lr_schedule %s wsd anneal cosine {lr = 1.0e-03 : f64, min_lr = 0.0 : f64, warmup_iters = 2 : i64, decay_iters = 10 : i64, wsd_decay_iters = 9 : i64} : tensor<i64> -> tensor<f32>
  return
}

// -----

func.func @f(%s: tensor<i64>) {
  // expected-error @+1 {{samples_per_step must be >= 1, got 0}}
  %lr = mt.lr_schedule %s inverse_square_root {lr = 1.0e-03 : f64, min_lr = 0.0 : f64, warmup_iters = 2 : i64, decay_iters = 10 : i64, samples_per_step = 0 : i64} : tensor<i64> -> tensor<f32>
  return
}

// -----

mt.param @w : tensor<4x4xf32>, normal(2.000000e-02)
func.func @f(%lr: tensor<f32>, %s: tensor<i64>) {
  // expected-error @+1 {{beta1 and beta2 must be in [0, 1)}}
  mt.adamw @w, %lr, %lr, %s {beta1 = 1.0 : f64, beta2 = 0.999 : f64, epsilon = 1.0e-08 : f64, weight_decay = 0.0 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
  return
}

// -----

mt.param @w : tensor<4x4xf32>, normal(2.000000e-02)
func.func @f(%lr: tensor<f32>, %s: tensor<i64>) {
  // expected-error @+1 {{epsilon must be positive}}
  mt.adamw @w, %lr, %lr, %s {beta1 = 0.9 : f64, beta2 = 0.999 : f64, epsilon = 0.0 : f64, weight_decay = 0.0 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
  return
}

// -----

mt.param @w : tensor<4x4xf32>, normal(2.000000e-02)
func.func @f(%lr: tensor<f32>, %s: tensor<i64>) {
  // expected-error @+1 {{weight_decay must not be negative}}
  mt.adamw @w, %lr, %lr, %s {beta1 = 0.9 : f64, beta2 = 0.999 : f64, epsilon = 1.0e-08 : f64, weight_decay = -0.1 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
  return
}

// -----

func.func @f(%lr: tensor<f32>, %s: tensor<i64>) {
  // expected-error @+1 {{parameter 'w' does not name an mt.param}}
  mt.adamw @w, %lr, %lr, %s {beta1 = 0.9 : f64, beta2 = 0.999 : f64, epsilon = 1.0e-08 : f64, weight_decay = 0.0 : f64} : tensor<f32>, tensor<f32>, tensor<i64>
  return
}

// -----

mt.param @w : tensor<4x4xf32>, normal(2.000000e-02)
func.func @f(%lr: tensor<f32>) {
  // expected-error @+1 {{momentum must not be negative}}
  mt.sgd @w, %lr, %lr {momentum = -0.5 : f64, weight_decay = 0.0 : f64} : tensor<f32>, tensor<f32>
  return
}

// -----

mt.param @w : tensor<4x4xf32>, normal(2.000000e-02)
func.func @f(%lr: tensor<f32>) {
  // expected-error @+1 {{weight_decay must not be negative}}
  mt.sgd @w, %lr, %lr {momentum = 0.9 : f64, weight_decay = -0.1 : f64} : tensor<f32>, tensor<f32>
  return
}

// -----

func.func @f(%lr: tensor<f32>) {
  // expected-error @+1 {{parameter 'w' does not name an mt.param}}
  mt.sgd @w, %lr, %lr {momentum = 0.9 : f64, weight_decay = 0.0 : f64} : tensor<f32>, tensor<f32>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{group must be "dp" or "tp", got "pp"}}
  mt.all_reduce_grads {group = "pp", scale = 5.0e-01 : f64}
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{scale must be in (0, 1], got 2.000000e+00}}
  mt.all_reduce_grads {group = "dp", scale = 2.0 : f64}
  return
}

// -----

func.func @f(%x: tensor<2x4xf32>) {
  // expected-error @+1 {{peer must be a pipeline rank >= 0, got -1}}
  mt.send %x to -1 {tag = 0 : i64} : tensor<2x4xf32>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{tag must be >= 0, got -2}}
  %x = mt.recv from 1 {tag = -2 : i64} : tensor<2x4xf32>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{group must be "mp" when given, got "dp"}}
  %n = mt.grad_norm {group = "dp"} : tensor<f32>
  return
}

// -----

module {
  func.func @f() {
    // expected-error @+1 {{'nope' does not name an mt.param}}
    mt.all_reduce_tied_grad @nope {peer = 1 : i64, tag = 0 : i64}
    return
  }
}

// -----

func.func @f(%d: tensor<64x8xf32>, %l: tensor<64x4xf32>, %p: tensor<64x4xf32>, %m: tensor<64x4xi32>, %s: tensor<f32>) {
  // expected-error @+1 {{gradient must be the logits' shape [64, 4], got [64, 8]}}
  %g = mt.moe_router_grad %d, %l, %p, %m, %s softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 32 : i64, topk = 2 : i64, z_loss_coeff = 0.0 : f64} : (tensor<64x8xf32>, tensor<64x4xf32>, tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>) -> tensor<64x4xf32>
  return
}

// -----

func.func @f(%d: tensor<64x4xf32>, %l: tensor<64x4xf32>, %p: tensor<64x4xf32>, %m: tensor<64x4xi32>, %s: tensor<f32>) {
  // expected-error @+1 {{topk 8 must be between 1 and the 4 experts}}
  %g = mt.moe_router_grad %d, %l, %p, %m, %s softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 32 : i64, topk = 8 : i64, z_loss_coeff = 0.0 : f64} : (tensor<64x4xf32>, tensor<64x4xf32>, tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>) -> tensor<64x4xf32>
  return
}

// -----

func.func @f(%d: tensor<128x16xf32>, %r: tensor<128xi32>) {
  // expected-error @+1 {{gradient [rows, hidden] and result [tokens, hidden] must share hidden, got [128, 16] and [64, 8]}}
  %x = mt.moe_permute_grad %d, %r : (tensor<128x16xf32>, tensor<128xi32>) -> tensor<64x8xf32>
  return
}

// -----

func.func @f(%d: tensor<128x16xf32>, %r: tensor<128xi32>) {
  // expected-error @+1 {{result element type 'bf16' differs from the gradient's 'f32'}}
  %x = mt.moe_permute_grad %d, %r : (tensor<128x16xf32>, tensor<128xi32>) -> tensor<64x16xbf16>
  return
}

// -----

func.func @f(%d: tensor<128x16xf32>, %r: tensor<64xi32>) {
  // expected-error @+1 {{row_ids must be one per gradient row [128], got [64]}}
  %x = mt.moe_permute_grad %d, %r : (tensor<128x16xf32>, tensor<64xi32>) -> tensor<64x16xf32>
  return
}

// -----

func.func @f(%d: tensor<128x32xf32>, %w: tensor<4x64x16xf32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{weight [4, 64, 16] expects 64 features but the gradient has 32}}
  %x = mt.moe_grouped_matmul_input_grad %d, %w, %n : (tensor<128x32xf32>, tensor<4x64x16xf32>, tensor<4xi32>) -> tensor<128x16xf32>
  return
}

// -----

mt.param @w : tensor<4x64x16xf32>, normal(2.000000e-02)
func.func @f(%d: tensor<128x64xf32>, %x: tensor<96x16xf32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{gradient [128, 64] and input [96, 16] must be [rows, features] with the same rows}}
  mt.moe_grouped_matmul_weight_grad %d, %x, %n into @w : tensor<128x64xf32>, tensor<96x16xf32>, tensor<4xi32>
  return
}

// -----

mt.param @w : tensor<4x64x16xf32>, normal(2.000000e-02)
func.func @f(%d: tensor<128x64xf32>, %x: tensor<128x16xbf16>, %n: tensor<4xi32>) {
  // expected-error @+1 {{input element type 'bf16' differs from the gradient's 'f32'}}
  mt.moe_grouped_matmul_weight_grad %d, %x, %n into @w : tensor<128x64xf32>, tensor<128x16xbf16>, tensor<4xi32>
  return
}

// -----

mt.param @w : tensor<8x64x16xf32>, normal(2.000000e-02)
func.func @f(%d: tensor<128x64xf32>, %x: tensor<128x16xf32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{weight 'w' has type 'tensor<8x64x16xf32>' but the gradient is for 'tensor<4x64x16xf32>'}}
  mt.moe_grouped_matmul_weight_grad %d, %x, %n into @w : tensor<128x64xf32>, tensor<128x16xf32>, tensor<4xi32>
  return
}

// -----

func.func @f(%g: tensor<64x8xf32>, %y: tensor<128x16xf32>, %p: tensor<64x4xf32>, %r: tensor<128xi32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{gradient must be [tokens, 16], got [64, 8]}}
  %dy, %dp = mt.moe_unpermute_grad %g, %y, %p, %r, %n : (tensor<64x8xf32>, tensor<128x16xf32>, tensor<64x4xf32>, tensor<128xi32>, tensor<4xi32>) -> (tensor<128x16xf32>, tensor<64x4xf32>)
  return
}

// -----

module attributes {mt.grad_buckets = [{group = "dp", params = []}]} {
  func.func @f() {
    // expected-error @+1 {{group must be "dp" or "expt_dp", got "tp"}}
    mt.reduce_grads {bucket = 0 : i64, group = "tp", scale = 5.0e-01 : f64, scatter = false}
    return
  }
}

// -----

module attributes {mt.grad_buckets = [{group = "dp", params = []}, {group = "expt_dp", params = []}]} {
  func.func @f() {
    // expected-error @+1 {{bucket 1 is reduced over "expt_dp" (mt.grad_buckets), not "dp"}}
    mt.reduce_grads {bucket = 1 : i64, group = "dp", scale = 5.0e-01 : f64, scatter = false}
    return
  }
}

// -----

module attributes {mt.grad_buckets = [{params = []}]} {
  func.func @f() {
    // expected-error @+1 {{bucket 0 is reduced over "dp" (mt.grad_buckets), not "expt_dp"}}
    mt.all_gather_params {bucket = 0 : i64, group = "expt_dp"}
    return
  }
}
