// Every verifier of the mt dialect rejects what it must, with its message.
// RUN: mtc-opt %s -split-input-file -verify-diagnostics

// expected-error @+1 {{normal initialisation needs a standard deviation}}
mt.param @w : tensor<4x4xf32>, normal

// -----

// expected-error @+1 {{standard deviation must be positive and finite, got -1.000000e+00}}
mt.param @w : tensor<4x4xf32>, normal(-1.0)

// -----

// expected-error @+1 {{ones initialisation takes no standard deviation}}
mt.param @w : tensor<4xf32>, ones(0.02)

// -----

// expected-error @+1 {{parameter has no elements}}
mt.param @w : tensor<0x4xf32>, zeros

// -----

func.func @f() {
  // expected-error @+1 {{'mt.param' op expects parent op 'builtin.module'}}
  "mt.param"() {sym_name = "w", type = tensor<4xf32>, init = 0 : i32} : () -> ()
  return
}

// -----

func.func @f() -> tensor<4xf32> {
  // expected-error @+1 {{'missing' does not name an mt.param}}
  %w = mt.param_ref @missing : tensor<4xf32>
  return %w : tensor<4xf32>
}

// -----

mt.param @w : tensor<4xf32>, zeros
func.func @f() -> tensor<8xf32> {
  // expected-error @+1 {{result type 'tensor<8xf32>' differs from the parameter's declared type 'tensor<4xf32>'}}
  %w = mt.param_ref @w : tensor<8xf32>
  return %w : tensor<8xf32>
}

// -----

func.func @f() -> tensor<8xi32> {
  // expected-error @+1 {{result must be [batch, seq], got [8]}}
  %p = mt.position_ids : tensor<8xi32>
  return %p : tensor<8xi32>
}

// -----

func.func @f(%t: tensor<16x8xf32>, %ids: tensor<2x4xi32>) -> tensor<2x4x16xf32> {
  // expected-error @+1 {{result shape [2, 4, 16] should be the ids' shape followed by the table's dim: [2, 4, 8]}}
  %e = mt.embedding %t, %ids : (tensor<16x8xf32>, tensor<2x4xi32>) -> tensor<2x4x16xf32>
  return %e : tensor<2x4x16xf32>
}

// -----

func.func @f(%t: tensor<16xf32>, %ids: tensor<2x4xi32>) -> tensor<2x4x16xf32> {
  // expected-error @+1 {{table must be [rows, dim], got [16]}}
  %e = mt.embedding %t, %ids : (tensor<16xf32>, tensor<2x4xi32>) -> tensor<2x4x16xf32>
  return %e : tensor<2x4x16xf32>
}

// -----

func.func @f(%t: tensor<16x8xf32>, %ids: tensor<2x4xf32>) {
  // expected-error @+1 {{operand #1 must be statically shaped tensor of 32-bit signless integer or 64-bit signless integer values}}
  %e = mt.embedding %t, %ids : (tensor<16x8xf32>, tensor<2x4xf32>) -> tensor<2x4x8xf32>
  return
}

// -----

func.func @f(%x: tensor<2x8xf32>, %w: tensor<4xf32>, %b: tensor<4xf32>) {
  // expected-error @+1 {{weight has 4 elements but the input's last dimension is 8}}
  %y = mt.layer_norm %x, %w, %b {epsilon = 1.0e-5 : f64} : tensor<2x8xf32>, tensor<4xf32>
  return
}

// -----

func.func @f(%x: tensor<2x8xf32>, %w: tensor<8xf32>, %b: tensor<8xf32>) {
  // expected-error @+1 {{epsilon must be positive}}
  %y = mt.layer_norm %x, %w, %b {epsilon = 0.0 : f64} : tensor<2x8xf32>, tensor<8xf32>
  return
}

// -----

func.func @f(%x: tensor<2x8xf32>, %w: tensor<8xbf16>) {
  // expected-error @+1 {{weight element type 'bf16' differs from the input's 'f32'}}
  %y = mt.rms_norm %x, %w {epsilon = 1.0e-5 : f64} : tensor<2x8xf32>, tensor<8xbf16>
  return
}

// -----

func.func @f(%x: tensor<2x8xf32>, %w: tensor<2x8xf32>) {
  // expected-error @+1 {{weight must be rank 1, got [2, 8]}}
  %y = mt.rms_norm %x, %w {epsilon = 1.0e-5 : f64} : tensor<2x8xf32>, tensor<2x8xf32>
  return
}

// -----

func.func @f(%x: tensor<2x4x8xf32>, %w: tensor<16x4xf32>) {
  // expected-error @+1 {{weight [16, 4] expects 4 input features but the input's last dimension is 8}}
  %y = mt.matmul %x, %w : (tensor<2x4x8xf32>, tensor<16x4xf32>) -> tensor<2x4x16xf32>
  return
}

// -----

func.func @f(%x: tensor<2x4x8xf32>, %w: tensor<16x8xf32>) {
  // expected-error @+1 {{result shape [2, 4, 8] should be [2, 4, 16]}}
  %y = mt.matmul %x, %w : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x8xf32>
  return
}

// -----

func.func @f(%x: tensor<8xf32>, %w: tensor<16x8xf32>) {
  // expected-error @+1 {{input must have rank >= 2, got [8]}}
  %y = mt.matmul %x, %w : (tensor<8xf32>, tensor<16x8xf32>) -> tensor<16xf32>
  return
}

// -----

func.func @f(%x: tensor<2x8xf32>, %w: tensor<4x8xbf16>) {
  // expected-error @+1 {{input, weight and result must share an element type}}
  %y = mt.matmul %x, %w : (tensor<2x8xf32>, tensor<4x8xbf16>) -> tensor<2x4xf32>
  return
}

// -----

func.func @f(%x: tensor<2x8xf32>, %b: tensor<4xf32>) {
  // expected-error @+1 {{bias has 4 elements but the input's last dimension is 8}}
  %y = mt.bias_add %x, %b : tensor<2x8xf32>, tensor<4xf32>
  return
}

// -----

func.func @f(%x: tensor<2x7xf32>) {
  // expected-error @+1 {{input's last dimension must be even (two halves)}}
  %y = mt.swiglu %x : (tensor<2x7xf32>) -> tensor<2x3xf32>
  return
}

// -----

func.func @f(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{result shape [2, 8] should be [2, 4]}}
  %y = mt.swiglu %x : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @f(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{rate must be in [0, 1), got 1.000000e+00}}
  %y = mt.dropout %x {rate = 1.0 : f64, stream = 0 : i64} : tensor<2x8xf32>
  return
}

// -----

func.func @f(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{cannot reshape [2, 8] (16 elements) to [3, 5] (15 elements)}}
  %y = mt.reshape %x : (tensor<2x8xf32>) -> tensor<3x5xf32>
  return
}

// -----

func.func @f(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{reshape cannot change the element type}}
  %y = mt.reshape %x : (tensor<2x8xf32>) -> tensor<16xf16>
  return
}

// -----

func.func @f(%x: tensor<2x4x60xf32>) {
  // expected-error @+1 {{input has 60 features but (heads + 2 * groups) * head_dim = (4 + 2 * 2) * 8 = 64}}
  %q, %k, %v = mt.split_qkv %x : (tensor<2x4x60xf32>) -> (tensor<2x4x4x8xf32>, tensor<2x4x2x8xf32>, tensor<2x4x2x8xf32>)
  return
}

// -----

func.func @f(%x: tensor<2x4x88xf32>) {
  // expected-error @+1 {{5 query heads cannot be split evenly into 3 groups}}
  %q, %k, %v = mt.split_qkv %x : (tensor<2x4x88xf32>) -> (tensor<2x4x5x8xf32>, tensor<2x4x3x8xf32>, tensor<2x4x3x8xf32>)
  return
}

// -----

func.func @f(%x: tensor<2x4x64xf32>) {
  // expected-error @+1 {{key and value must have the same type}}
  %q, %k, %v = mt.split_qkv %x : (tensor<2x4x64xf32>) -> (tensor<2x4x4x8xf32>, tensor<2x4x2x8xf32>, tensor<2x4x2x4xf32>)
  return
}

// -----

func.func @f(%x: tensor<2x4x64xf32>) {
  // expected-error @+1 {{query must be [batch, seq, heads, head_dim] with the input's batch and seq, got [2, 5, 4, 8]}}
  %q, %k, %v = mt.split_qkv %x : (tensor<2x4x64xf32>) -> (tensor<2x5x4x8xf32>, tensor<2x4x2x8xf32>, tensor<2x4x2x8xf32>)
  return
}

// -----

func.func @f(%x: tensor<2x4x64xf32>) {
  // expected-error @+1 {{rope_base must be greater than 1}}
  %q, %k, %v = mt.split_qkv %x {rope_base = 1.0 : f64} : (tensor<2x4x64xf32>) -> (tensor<2x4x4x8xf32>, tensor<2x4x2x8xf32>, tensor<2x4x2x8xf32>)
  return
}

// -----

func.func @f(%x: tensor<2x4x56xf32>) {
  // expected-error @+1 {{rope_base needs an even head_dim to rotate pairs, got 7}}
  %q, %k, %v = mt.split_qkv %x {rope_base = 10000.0 : f64} : (tensor<2x4x56xf32>) -> (tensor<2x4x4x7xf32>, tensor<2x4x2x7xf32>, tensor<2x4x2x7xf32>)
  return
}

// -----

func.func @f(%x: tensor<2x4x3x7xf32>) {
  // expected-error @+1 {{head_dim must be even to rotate pairs}}
  %y = mt.rope %x {base = 10000.0 : f64} : tensor<2x4x3x7xf32>
  return
}

// -----

func.func @f(%x: tensor<2x4x3x8xf32>) {
  // expected-error @+1 {{base must be greater than 1}}
  %y = mt.rope %x {base = 1.0 : f64} : tensor<2x4x3x8xf32>
  return
}

// -----

func.func @f(%x: tensor<2x4x3x8xf32>) {
  // expected-error @+1 {{scaling_factor must be at least 1}}
  %y = mt.rope %x {base = 10000.0 : f64, scaling_factor = 0.5 : f64} : tensor<2x4x3x8xf32>
  return
}

// -----

func.func @f(%x: tensor<2x4x64xf32>) {
  // expected-error @+1 {{rope_scaling_factor needs rope_base}}
  %q, %k, %v = mt.split_qkv %x {rope_scaling_factor = 8.0 : f64} : (tensor<2x4x64xf32>) -> (tensor<2x4x4x8xf32>, tensor<2x4x2x8xf32>, tensor<2x4x2x8xf32>)
  return
}

// -----

func.func @f(%q: tensor<2x4x6x8xf32>, %k: tensor<2x4x4x8xf32>) {
  // expected-error @+1 {{6 query heads cannot share 4 key/value groups evenly}}
  %o, %lse = mt.attention %q, %k, %k {causal, scale = 0.35 : f64, dropout_rate = 0.0 : f64, stream = 0 : i64} : tensor<2x4x6x8xf32>, tensor<2x4x4x8xf32>
  return
}

// -----

func.func @f(%q: tensor<2x4x4x8xf32>, %k: tensor<2x5x4x8xf32>) {
  // expected-error @+1 {{query [2, 4, 4, 8] and key [2, 5, 4, 8] must agree in batch, seq and head_dim}}
  %o, %lse = mt.attention %q, %k, %k {causal, scale = 0.35 : f64, dropout_rate = 0.0 : f64, stream = 0 : i64} : tensor<2x4x4x8xf32>, tensor<2x5x4x8xf32>
  return
}

// -----

func.func @f(%q: tensor<2x4x4x8xf32>) {
  // expected-error @+1 {{scale must be positive}}
  %o, %lse = mt.attention %q, %q, %q {causal, scale = 0.0 : f64, dropout_rate = 0.0 : f64, stream = 0 : i64} : tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>
  return
}

// -----

func.func @f(%q: tensor<2x4x4x8xf32>) {
  // expected-error @+1 {{dropout_rate must be in [0, 1), got -1.000000e-01}}
  %o, %lse = mt.attention %q, %q, %q {causal, scale = 0.35 : f64, dropout_rate = -0.1 : f64, stream = 0 : i64} : tensor<2x4x4x8xf32>, tensor<2x4x4x8xf32>
  return
}

// -----

// The log-sum-exp is [batch, heads, seq], not the query's [batch, seq, heads].
func.func @f(%q: tensor<2x4x3x8xf32>) {
  // expected-error @+1 {{failed to verify that lse is f32 [batch, heads, seq] of the query}}
  %o, %lse = "mt.attention"(%q, %q, %q) {causal, scale = 0.35 : f64, dropout_rate = 0.0 : f64, stream = 0 : i64} : (tensor<2x4x3x8xf32>, tensor<2x4x3x8xf32>, tensor<2x4x3x8xf32>) -> (tensor<2x4x3x8xf32>, tensor<2x4x3xf32>)
  return
}

// -----

// The backward's lse must be the forward's: f32, [batch, heads, seq].
func.func @f(%q: tensor<2x4x3x8xf32>, %lse: tensor<2x3x5xf32>) {
  // expected-error @+1 {{failed to verify that lse is f32 [batch, heads, seq] of the query}}
  %dq, %dk, %dv = "mt.attention_grad"(%q, %q, %q, %q, %q, %lse) {causal, scale = 0.35 : f64, dropout_rate = 0.0 : f64, stream = 0 : i64} : (tensor<2x4x3x8xf32>, tensor<2x4x3x8xf32>, tensor<2x4x3x8xf32>, tensor<2x4x3x8xf32>, tensor<2x4x3x8xf32>, tensor<2x3x5xf32>) -> (tensor<2x4x3x8xf32>, tensor<2x4x3x8xf32>, tensor<2x4x3x8xf32>)
  return
}

// -----

func.func @f(%l: tensor<2x4x16xf32>, %y: tensor<2x5xi32>) {
  // expected-error @+1 {{logits [2, 4, 16] must be the labels' shape [2, 5] plus a vocabulary dimension}}
  %loss = mt.cross_entropy %l, %y : (tensor<2x4x16xf32>, tensor<2x5xi32>) -> tensor<f32>
  return
}

// -----

func.func @f(%l: tensor<2x4x16xf32>, %y: tensor<2x4xi32>) {
  // expected-error @+1 {{result #0 must be 0D tensor of 32-bit float values}}
  %loss = mt.cross_entropy %l, %y : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<1xf32>
  return
}

// -----

func.func @f(%x: tensor<?x8xf32>) {
  // expected-error @+1 {{must be statically shaped tensor}}
  %y = mt.gelu %x tanh : tensor<?x8xf32>
  return
}

// -----

// expected-error @+1 {{a tensor-parallel shard needs both tp_dim and tp_size}}
mt.param @w : tensor<4x4xf32>, normal(2.0e-02) {tp_dim = 0 : i64}

// -----

// expected-error @+1 {{tp_dim 2 is not a dimension of [4, 4]}}
mt.param @w : tensor<4x4xf32>, normal(2.0e-02) {tp_dim = 2 : i64, tp_size = 2 : i64}

// -----

// expected-error @+1 {{tp_size must be >= 2, got 1}}
mt.param @w : tensor<4x4xf32>, normal(2.0e-02) {tp_dim = 0 : i64, tp_size = 1 : i64}

// -----

// expected-error @+1 {{tp_blocks 3 must be >= 1 and divide the shard's dimension 0 (4)}}
mt.param @w : tensor<4x4xf32>, normal(2.0e-02) {tp_blocks = 3 : i64, tp_dim = 0 : i64, tp_size = 2 : i64}

// -----

func.func @f(%x: tensor<2x4x8xf32>) -> tensor<2x4x8xf32> {
  // expected-error @+1 {{tp_size must be >= 2, got 1}}
  %y = mt.tp_all_reduce %x {tp_size = 1 : i64} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  return %y : tensor<2x4x8xf32>
}

// -----

func.func @f(%x: tensor<2x4x8xf32>) -> tensor<2x4x8xf16> {
  // expected-error @+1 {{result element type differs from the input's}}
  %y = mt.tp_copy %x {tp_size = 2 : i64} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf16>
  return %y : tensor<2x4x8xf16>
}

// -----

func.func @f(%x: tensor<2x4x8xf32>) -> tensor<2x4x8xf32> {
  // expected-error @+1 {{result shape [2, 4, 8] should be [2, 8, 8]}}
  %y = mt.sp_gather %x {tp_size = 2 : i64} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  return %y : tensor<2x4x8xf32>
}

// -----

func.func @f(%x: tensor<2x3x8xf32>) -> tensor<2x1x8xf32> {
  // expected-error @+1 {{sequence length 3 is not divisible by tp_size 2}}
  %y = mt.sp_reduce_scatter %x {tp_size = 2 : i64} : (tensor<2x3x8xf32>) -> tensor<2x1x8xf32>
  return %y : tensor<2x1x8xf32>
}

// -----

func.func @f(%x: tensor<8xf32>) -> tensor<8xf32> {
  // expected-error @+1 {{input must be [batch, seq, ...], got [8]}}
  %y = mt.sp_split %x {tp_size = 2 : i64} : (tensor<8xf32>) -> tensor<8xf32>
  return %y : tensor<8xf32>
}

// -----

func.func @f(%l: tensor<2x32x4xf32>) {
  // expected-error @+1 {{logits must be [tokens, experts], got [2, 32, 4]}}
  %p, %m, %a, %z = mt.moe_router %l softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 32 : i64, topk = 2 : i64, z_loss_coeff = 0.0 : f64} : (tensor<2x32x4xf32>) -> (tensor<2x32x4xf32>, tensor<2x32x4xi32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @f(%l: tensor<64x4xf32>) {
  // expected-error @+1 {{topk 5 must be between 1 and the 4 experts}}
  %p, %m, %a, %z = mt.moe_router %l softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 32 : i64, topk = 5 : i64, z_loss_coeff = 0.0 : f64} : (tensor<64x4xf32>) -> (tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @f(%l: tensor<64x4xf32>) {
  // expected-error @+1 {{topk 0 must be between 1 and the 4 experts}}
  %p, %m, %a, %z = mt.moe_router %l softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 32 : i64, topk = 0 : i64, z_loss_coeff = 0.0 : f64} : (tensor<64x4xf32>) -> (tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @f(%l: tensor<64x4xf32>) {
  // expected-error @+1 {{scaling_factor must be finite and >= 0 (0: none), got -1.000000e+00}}
  %p, %m, %a, %z = mt.moe_router %l softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = -1.0 : f64, seq_length = 32 : i64, topk = 2 : i64, z_loss_coeff = 0.0 : f64} : (tensor<64x4xf32>) -> (tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @f(%l: tensor<64x4xf32>) {
  // expected-error @+1 {{z_loss_coeff must be finite and >= 0 (0: off), got -1.000000e-03}}
  %p, %m, %a, %z = mt.moe_router %l softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 32 : i64, topk = 2 : i64, z_loss_coeff = -1.0e-03 : f64} : (tensor<64x4xf32>) -> (tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @f(%l: tensor<64x4xf32>) {
  // expected-error @+1 {{capacity must be >= 0 (0: no capacity), got -3}}
  %p, %m, %a, %z = mt.moe_router %l softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = -3 : i64, scaling_factor = 0.0 : f64, seq_length = 32 : i64, topk = 2 : i64, z_loss_coeff = 0.0 : f64} : (tensor<64x4xf32>) -> (tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @f(%l: tensor<64x4xf32>) {
  // expected-error @+1 {{pad_to_capacity needs a capacity}}
  %p, %m, %a, %z = mt.moe_router %l softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 32 : i64, topk = 2 : i64, z_loss_coeff = 0.0 : f64, pad_to_capacity} : (tensor<64x4xf32>) -> (tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @f(%l: tensor<64x4xf32>) {
  // expected-error @+1 {{seq_length 24 must divide the 64 tokens}}
  %p, %m, %a, %z = mt.moe_router %l softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 24 : i64, topk = 2 : i64, z_loss_coeff = 0.0 : f64} : (tensor<64x4xf32>) -> (tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @f(%l: tensor<64x4xf32>) {
  // expected-error @+1 {{probs must be the logits' shape [64, 4], got [64, 8]}}
  %p, %m, %a, %z = mt.moe_router %l softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 32 : i64, topk = 2 : i64, z_loss_coeff = 0.0 : f64} : (tensor<64x4xf32>) -> (tensor<64x8xf32>, tensor<64x4xi32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @f(%l: tensor<64x4xf32>) {
  // expected-error @+1 {{routing_map must be the logits' shape [64, 4], got [4, 64]}}
  %p, %m, %a, %z = mt.moe_router %l softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 32 : i64, topk = 2 : i64, z_loss_coeff = 0.0 : f64} : (tensor<64x4xf32>) -> (tensor<64x4xf32>, tensor<4x64xi32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @f(%l: tensor<64x4xf32>) {
  // expected-error @+1 {{aux_loss_coeff must be finite and >= 0, got -1.000000e-02}}
  %p, %m, %a, %z = mt.moe_router %l softmax aux_loss drop probs dtype none {aux_loss_coeff = -1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 32 : i64, topk = 2 : i64, z_loss_coeff = 0.0 : f64} : (tensor<64x4xf32>) -> (tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @f(%x: tensor<2x32x16xf32>, %m: tensor<64x4xi32>) {
  // expected-error @+1 {{input must be [tokens, hidden], got [2, 32, 16]}}
  %y, %r, %n = mt.moe_permute %x, %m {capacity = 0 : i64} : (tensor<2x32x16xf32>, tensor<64x4xi32>) -> (tensor<128x16xf32>, tensor<128xi32>, tensor<4xi32>)
  return
}

// -----

func.func @f(%x: tensor<64x16xf32>, %m: tensor<32x4xi32>) {
  // expected-error @+1 {{routing_map must be [64, experts] for the input's tokens, got [32, 4]}}
  %y, %r, %n = mt.moe_permute %x, %m {capacity = 0 : i64} : (tensor<64x16xf32>, tensor<32x4xi32>) -> (tensor<128x16xf32>, tensor<128xi32>, tensor<4xi32>)
  return
}

// -----

func.func @f(%x: tensor<64x16xf32>, %m: tensor<64x4xi32>) {
  // expected-error @+1 {{result must be [rows, 16], got [128, 8]}}
  %y, %r, %n = mt.moe_permute %x, %m {capacity = 0 : i64} : (tensor<64x16xf32>, tensor<64x4xi32>) -> (tensor<128x8xf32>, tensor<128xi32>, tensor<4xi32>)
  return
}

// -----

func.func @f(%x: tensor<64x16xf32>, %m: tensor<64x4xi32>) {
  // expected-error @+1 {{result element type 'bf16' differs from the input's 'f32'}}
  %y, %r, %n = mt.moe_permute %x, %m {capacity = 0 : i64} : (tensor<64x16xf32>, tensor<64x4xi32>) -> (tensor<128x16xbf16>, tensor<128xi32>, tensor<4xi32>)
  return
}

// -----

func.func @f(%x: tensor<64x16xf32>, %m: tensor<64x4xi32>) {
  // expected-error @+1 {{with pad_to_capacity the result has experts * capacity = 96 rows, got 128}}
  %y, %r, %n = mt.moe_permute %x, %m {capacity = 24 : i64, pad_to_capacity} : (tensor<64x16xf32>, tensor<64x4xi32>) -> (tensor<128x16xf32>, tensor<128xi32>, tensor<4xi32>)
  return
}

// -----

func.func @f(%x: tensor<64x16xf32>, %m: tensor<64x4xi32>) {
  // expected-error @+1 {{with capacity 20 the result has min(tokens * topk, experts * capacity) rows, got 128}}
  %y, %r, %n = mt.moe_permute %x, %m {capacity = 20 : i64} : (tensor<64x16xf32>, tensor<64x4xi32>) -> (tensor<128x16xf32>, tensor<128xi32>, tensor<4xi32>)
  return
}

// -----

func.func @f(%x: tensor<64x16xf32>, %m: tensor<64x4xi32>) {
  // expected-error @+1 {{without capacity the result has tokens * topk rows (a multiple of 64 up to 256), got 96}}
  %y, %r, %n = mt.moe_permute %x, %m {capacity = 0 : i64} : (tensor<64x16xf32>, tensor<64x4xi32>) -> (tensor<96x16xf32>, tensor<96xi32>, tensor<4xi32>)
  return
}

// -----

func.func @f(%x: tensor<64x16xf32>, %m: tensor<64x4xi32>) {
  // expected-error @+1 {{row_ids must be one per result row [128], got [64]}}
  %y, %r, %n = mt.moe_permute %x, %m {capacity = 0 : i64} : (tensor<64x16xf32>, tensor<64x4xi32>) -> (tensor<128x16xf32>, tensor<64xi32>, tensor<4xi32>)
  return
}

// -----

func.func @f(%x: tensor<64x16xf32>, %m: tensor<64x4xi32>) {
  // expected-error @+1 {{tokens_per_expert must be one per expert [4], got [8]}}
  %y, %r, %n = mt.moe_permute %x, %m {capacity = 0 : i64} : (tensor<64x16xf32>, tensor<64x4xi32>) -> (tensor<128x16xf32>, tensor<128xi32>, tensor<8xi32>)
  return
}

// -----

func.func @f(%x: tensor<64x16xf32>, %m: tensor<64x4xi32>) {
  // expected-error @+1 {{pad_to_capacity needs a capacity}}
  %y, %r, %n = mt.moe_permute %x, %m {capacity = 0 : i64, pad_to_capacity} : (tensor<64x16xf32>, tensor<64x4xi32>) -> (tensor<128x16xf32>, tensor<128xi32>, tensor<4xi32>)
  return
}

// -----

func.func @f(%x: tensor<2x64x16xf32>, %w: tensor<4x64x16xf32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{input must be [rows, features], got [2, 64, 16]}}
  %h = mt.moe_grouped_matmul %x, %w, %n : (tensor<2x64x16xf32>, tensor<4x64x16xf32>, tensor<4xi32>) -> tensor<2x64x64xf32>
  return
}

// -----

func.func @f(%x: tensor<128x16xf32>, %w: tensor<64x16xf32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{weight must be [experts, out, in], got [64, 16]}}
  %h = mt.moe_grouped_matmul %x, %w, %n : (tensor<128x16xf32>, tensor<64x16xf32>, tensor<4xi32>) -> tensor<128x64xf32>
  return
}

// -----

func.func @f(%x: tensor<128x16xf32>, %w: tensor<4x64x32xf32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{weight [4, 64, 32] expects 32 features but the input has 16}}
  %h = mt.moe_grouped_matmul %x, %w, %n : (tensor<128x16xf32>, tensor<4x64x32xf32>, tensor<4xi32>) -> tensor<128x64xf32>
  return
}

// -----

func.func @f(%x: tensor<128x16xf32>, %w: tensor<4x64x16xf32>, %n: tensor<2xi32>) {
  // expected-error @+1 {{tokens_per_expert must be one per expert [4], got [2]}}
  %h = mt.moe_grouped_matmul %x, %w, %n : (tensor<128x16xf32>, tensor<4x64x16xf32>, tensor<2xi32>) -> tensor<128x64xf32>
  return
}

// -----

func.func @f(%x: tensor<128x16xf32>, %w: tensor<4x64x16xf32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{result must be [rows, features] [128, 64], got [128, 32]}}
  %h = mt.moe_grouped_matmul %x, %w, %n : (tensor<128x16xf32>, tensor<4x64x16xf32>, tensor<4xi32>) -> tensor<128x32xf32>
  return
}

// -----

func.func @f(%x: tensor<128x16xf32>, %w: tensor<4x64x16xbf16>, %n: tensor<4xi32>) {
  // expected-error @+1 {{input, weight and result must share an element type}}
  %h = mt.moe_grouped_matmul %x, %w, %n : (tensor<128x16xf32>, tensor<4x64x16xbf16>, tensor<4xi32>) -> tensor<128x64xf32>
  return
}

// -----

func.func @f(%y: tensor<128xf32>, %p: tensor<64x4xf32>, %r: tensor<128xi32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{input must be [rows, hidden], got [128]}}
  %o = mt.moe_unpermute %y, %p, %r, %n : (tensor<128xf32>, tensor<64x4xf32>, tensor<128xi32>, tensor<4xi32>) -> tensor<64x16xf32>
  return
}

// -----

func.func @f(%y: tensor<128x16xf32>, %p: tensor<64x4xf32>, %r: tensor<128xi32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{result must be [tokens, 16], got [64, 8]}}
  %o = mt.moe_unpermute %y, %p, %r, %n : (tensor<128x16xf32>, tensor<64x4xf32>, tensor<128xi32>, tensor<4xi32>) -> tensor<64x8xf32>
  return
}

// -----

func.func @f(%y: tensor<128x16xf32>, %p: tensor<32x4xf32>, %r: tensor<128xi32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{probs must be [64, experts], got [32, 4]}}
  %o = mt.moe_unpermute %y, %p, %r, %n : (tensor<128x16xf32>, tensor<32x4xf32>, tensor<128xi32>, tensor<4xi32>) -> tensor<64x16xf32>
  return
}

// -----

func.func @f(%y: tensor<128x16xf32>, %p: tensor<64x4xf32>, %r: tensor<64xi32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{row_ids must be one per input row [128], got [64]}}
  %o = mt.moe_unpermute %y, %p, %r, %n : (tensor<128x16xf32>, tensor<64x4xf32>, tensor<64xi32>, tensor<4xi32>) -> tensor<64x16xf32>
  return
}

// -----

func.func @f(%y: tensor<128x16xf32>, %p: tensor<64x4xf32>, %r: tensor<128xi32>, %n: tensor<8xi32>) {
  // expected-error @+1 {{tokens_per_expert must be one per expert [4], got [8]}}
  %o = mt.moe_unpermute %y, %p, %r, %n : (tensor<128x16xf32>, tensor<64x4xf32>, tensor<128xi32>, tensor<8xi32>) -> tensor<64x16xf32>
  return
}

// -----

func.func @f(%y: tensor<128x16xf32>, %p: tensor<64x4xf32>, %r: tensor<128xi32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{result element type 'bf16' differs from the input's 'f32'}}
  %o = mt.moe_unpermute %y, %p, %r, %n : (tensor<128x16xf32>, tensor<64x4xf32>, tensor<128xi32>, tensor<4xi32>) -> tensor<64x16xbf16>
  return
}

// -----

func.func @f(%l: tensor<64x4xf32>) {
  // expected-error @+1 {{pad_to_capacity needs a capacity of at most the 64 tokens, got 80}}
  %p, %m, %a, %z = mt.moe_router %l softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 80 : i64, pad_to_capacity, scaling_factor = 0.0 : f64, seq_length = 32 : i64, topk = 2 : i64, z_loss_coeff = 0.0 : f64} : (tensor<64x4xf32>) -> (tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @f(%x: tensor<64x16xf32>, %m: tensor<64x4xi32>) {
  // expected-error @+1 {{pad_to_capacity needs a capacity of at most the 64 tokens, got 80}}
  %y, %r, %n = mt.moe_permute %x, %m {capacity = 80 : i64, pad_to_capacity} : (tensor<64x16xf32>, tensor<64x4xi32>) -> (tensor<320x16xf32>, tensor<320xi32>, tensor<4xi32>)
  return
}

// -----

// expected-error @+1 {{an expert-parallel shard needs both ep_dim and ep_size}}
mt.param @w : tensor<2x4x4xf32>, zeros {ep_dim = 0 : i64, mt.expert}

// -----

// expected-error @+1 {{only a routed expert's weight (mt.expert) is split over expert-parallel ranks}}
mt.param @w : tensor<2x4x4xf32>, zeros {ep_dim = 0 : i64, ep_size = 2 : i64}

// -----

// expected-error @+1 {{ep_dim must be 0 (the stacked experts), got 1}}
mt.param @w : tensor<2x4x4xf32>, zeros {ep_dim = 1 : i64, ep_size = 2 : i64, mt.expert}

// -----

// expected-error @+1 {{ep_size must be >= 2, got 1}}
mt.param @w : tensor<2x4x4xf32>, zeros {ep_dim = 0 : i64, ep_size = 1 : i64, mt.expert}

// -----

// expected-error @+1 {{dimension 0 cannot be split over both tensor- and expert-parallel ranks}}
mt.param @w : tensor<2x4x4xf32>, zeros {ep_dim = 0 : i64, ep_size = 2 : i64, mt.expert, tp_dim = 0 : i64, tp_size = 2 : i64}

// -----

// expected-error @+1 {{dimension 0 of a routed expert's weight stacks the experts: only expert-parallel ranks split it (ep_dim), not tp_dim}}
mt.param @w : tensor<2x4x4xf32>, zeros {mt.expert, tp_dim = 0 : i64, tp_size = 2 : i64}

// -----

func.func @router_count_group(%l: tensor<64x4xf32>) {
  // expected-error @+1 {{count_group must be "tp" (the tensor-parallel group of sequence parallelism), got "dp"}}
  %p, %m, %a, %z = mt.moe_router %l softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, count_group = "dp", scaling_factor = 0.0 : f64, seq_length = 32 : i64, topk = 2 : i64, z_loss_coeff = 0.0 : f64} : (tensor<64x4xf32>) -> (tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @dispatch_ep1(%y: tensor<16x8xf32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{exchanges rows between etp_size * ep_size = 1 ranks; it needs at least 2}}
  %r, %l, %lay = mt.moe_dispatch %y, %n alltoall {ep_size = 1 : i64, num_local_experts = 4 : i64} : (tensor<16x8xf32>, tensor<4xi32>) -> (tensor<16x8xf32>, tensor<4xi32>, tensor<1x4xi32>)
  return
}

// -----

func.func @dispatch_local0(%y: tensor<16x8xf32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{num_local_experts must be >= 1, got 0}}
  %r, %l, %lay = mt.moe_dispatch %y, %n alltoall {ep_size = 2 : i64, num_local_experts = 0 : i64} : (tensor<16x8xf32>, tensor<4xi32>) -> (tensor<16x8xf32>, tensor<0xi32>, tensor<2x0xi32>)
  return
}

// -----

func.func @dispatch_counts(%y: tensor<16x8xf32>, %n: tensor<6xi32>) {
  // expected-error @+1 {{tokens_per_expert must be one per expert of every rank (ep_size * num_local_experts) [4], got [6]}}
  %r, %l, %lay = mt.moe_dispatch %y, %n alltoall {ep_size = 2 : i64, num_local_experts = 2 : i64} : (tensor<16x8xf32>, tensor<6xi32>) -> (tensor<32x8xf32>, tensor<2xi32>, tensor<2x2xi32>)
  return
}

// -----

func.func @dispatch_rank(%y: tensor<2x8x8xf32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{input must be [rows, hidden], got [2, 8, 8]}}
  %r, %l, %lay = mt.moe_dispatch %y, %n alltoall {ep_size = 2 : i64, num_local_experts = 2 : i64} : (tensor<2x8x8xf32>, tensor<4xi32>) -> (tensor<32x8xf32>, tensor<2xi32>, tensor<2x2xi32>)
  return
}

// -----

func.func @dispatch_hidden(%y: tensor<16x8xf32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{result must be [rows, 8], got [32, 4]}}
  %r, %l, %lay = mt.moe_dispatch %y, %n alltoall {ep_size = 2 : i64, num_local_experts = 2 : i64} : (tensor<16x8xf32>, tensor<4xi32>) -> (tensor<32x4xf32>, tensor<2xi32>, tensor<2x2xi32>)
  return
}

// -----

func.func @dispatch_type(%y: tensor<16x8xf32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{result element type 'bf16' differs from the input's 'f32'}}
  %r, %l, %lay = mt.moe_dispatch %y, %n alltoall {ep_size = 2 : i64, num_local_experts = 2 : i64} : (tensor<16x8xf32>, tensor<4xi32>) -> (tensor<32x8xbf16>, tensor<2xi32>, tensor<2x2xi32>)
  return
}

// -----

func.func @dispatch_layout(%y: tensor<16x8xf32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{layout must be [etp_size * ep_size, num_local_experts] [2, 2], got [4]}}
  %r, %l, %lay = mt.moe_dispatch %y, %n alltoall {ep_size = 2 : i64, num_local_experts = 2 : i64} : (tensor<16x8xf32>, tensor<4xi32>) -> (tensor<32x8xf32>, tensor<2xi32>, tensor<4xi32>)
  return
}

// -----

func.func @dispatch_local_counts(%y: tensor<16x8xf32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{local_counts must be one per local expert [2], got [4]}}
  %r, %l, %lay = mt.moe_dispatch %y, %n alltoall {ep_size = 2 : i64, num_local_experts = 2 : i64} : (tensor<16x8xf32>, tensor<4xi32>) -> (tensor<32x8xf32>, tensor<4xi32>, tensor<2x2xi32>)
  return
}

// -----

func.func @combine_hidden(%r: tensor<32x8xf32>, %lay: tensor<2x2xi32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{input must be [rows, 4], got [32, 8]}}
  %y = mt.moe_combine %r, %lay, %n alltoall {ep_size = 2 : i64, num_local_experts = 2 : i64} : (tensor<32x8xf32>, tensor<2x2xi32>, tensor<4xi32>) -> tensor<16x4xf32>
  return
}

// -----

func.func @combine_layout(%r: tensor<32x8xf32>, %lay: tensor<2x3xi32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{layout must be [etp_size * ep_size, num_local_experts] [2, 2], got [2, 3]}}
  %y = mt.moe_combine %r, %lay, %n alltoall {ep_size = 2 : i64, num_local_experts = 2 : i64} : (tensor<32x8xf32>, tensor<2x3xi32>, tensor<4xi32>) -> tensor<16x8xf32>
  return
}

// -----

func.func @combine_ep1(%r: tensor<32x8xf32>, %lay: tensor<1x4xi32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{exchanges rows between etp_size * ep_size = 1 ranks; it needs at least 2}}
  %y = mt.moe_combine %r, %lay, %n allgather {ep_size = 1 : i64, num_local_experts = 4 : i64} : (tensor<32x8xf32>, tensor<1x4xi32>, tensor<4xi32>) -> tensor<16x8xf32>
  return
}

// -----

func.func @dispatch_etp0(%y: tensor<16x8xf32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{etp_size must be >= 1, got 0}}
  %r, %l, %lay = mt.moe_dispatch %y, %n alltoall {ep_size = 2 : i64, etp_size = 0 : i64, num_local_experts = 2 : i64} : (tensor<16x8xf32>, tensor<4xi32>) -> (tensor<32x8xf32>, tensor<2xi32>, tensor<2x2xi32>)
  return
}

// -----

// With expert tensor parallelism the layout has a row per source of the
// etp x ep group.
func.func @dispatch_etp_layout(%y: tensor<16x8xf32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{layout must be [etp_size * ep_size, num_local_experts] [4, 2], got [2, 2]}}
  %r, %l, %lay = mt.moe_dispatch %y, %n alltoall {ep_size = 2 : i64, etp_size = 2 : i64, num_local_experts = 2 : i64} : (tensor<16x8xf32>, tensor<4xi32>) -> (tensor<64x8xf32>, tensor<2xi32>, tensor<2x2xi32>)
  return
}

// -----

func.func @combine_etp_layout(%r: tensor<32x8xf32>, %lay: tensor<1x4xi32>, %n: tensor<4xi32>) {
  // expected-error @+1 {{layout must be [etp_size * ep_size, num_local_experts] [2, 4], got [1, 4]}}
  %y = mt.moe_combine %r, %lay, %n allgather {ep_size = 1 : i64, etp_size = 2 : i64, num_local_experts = 4 : i64} : (tensor<32x8xf32>, tensor<1x4xi32>, tensor<4xi32>) -> tensor<16x8xf32>
  return
}

// -----

func.func @f(%l: tensor<64x4xf64>) {
  // expected-error @+1 {{logits of 'f64' need router dtype fp64 and the reverse, got fp32}}
  %p, %m, %a, %z = mt.moe_router %l softmax aux_loss drop probs dtype fp32 {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 32 : i64, topk = 2 : i64, z_loss_coeff = 0.0 : f64} : (tensor<64x4xf64>) -> (tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @f(%l: tensor<64x4xf32>) {
  // expected-error @+1 {{logits of 'f32' need router dtype fp64 and the reverse, got fp64}}
  %p, %m, %a, %z = mt.moe_router %l softmax aux_loss drop probs dtype fp64 {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 32 : i64, topk = 2 : i64, z_loss_coeff = 0.0 : f64} : (tensor<64x4xf32>) -> (tensor<64x4xf32>, tensor<64x4xi32>, tensor<f32>, tensor<f32>)
  return
}

// -----

func.func @f(%x: tensor<2x8xf64>, %w: tensor<4x8xf64>) {
  // expected-error @+1 {{operand #0 must be statically shaped tensor of 32-bit float or 16-bit float or bfloat16 type values}}
  %y = mt.matmul %x, %w : (tensor<2x8xf64>, tensor<4x8xf64>) -> tensor<2x4xf64>
  return
}
