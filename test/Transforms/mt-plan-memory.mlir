// mt-plan-memory: persistent regions per kind, 256-byte aligned; the arena
// placed from liveness, offline by size or by best-fit, whichever is smaller;
// results never overlap their operands; reshape aliases its input; params
// read in place take no arena space.
// RUN: mtc-opt %s -mt-plan-memory | FileCheck %s

// 16x8 f32 = 512 B, 8 x bf16 = 16 B (rounded to 256). The module's arena is
// its largest program's (@ce_in_place_offline).
// CHECK: module attributes {mt.arena_bytes = 1792 : i64, mt.memory = {activations = 1792 : i64, grads = 768 : i64, master_weights = 256 : i64, optimizer_moments = 1536 : i64, weights = 768 : i64}, mt.state_bytes = 3328 : i64}
// CHECK: mt.param @w : tensor<16x8xf32>, normal(2.000000e-02) {mt.exp_avg_offset = 1792 : i64, mt.exp_avg_sq_offset = 2560 : i64, mt.grad_offset = 768 : i64, mt.master_offset = -1 : i64, mt.weight_offset = 0 : i64}
// CHECK: mt.param @v : tensor<8xbf16>, ones {mt.exp_avg_offset = 2304 : i64, mt.exp_avg_sq_offset = 3072 : i64, mt.grad_offset = 1280 : i64, mt.master_offset = 1536 : i64, mt.weight_offset = 512 : i64}
mt.param @w : tensor<16x8xf32>, normal(2.000000e-02)
mt.param @v : tensor<8xbf16>, ones

// CHECK-LABEL: func.func @f(
// CHECK-SAME: %{{.*}}: tensor<2x8xf32> {mt.offset = 0 : i64}) -> tensor<2x8xf32> attributes {mt.arena_bytes = 768 : i64}
func.func @f(%x: tensor<2x8xf32>) -> tensor<2x8xf32> {
  // CHECK: mt.param_ref @w {mt.offsets = array<i64: -1>}
  %w = mt.param_ref @w : tensor<16x8xf32>
  // [2,16] f32 = 128 B -> 256; placed after %x.
  // CHECK: mt.matmul {{.*}} {mt.offsets = array<i64: 256>}
  %h = mt.matmul %x, %w : (tensor<2x8xf32>, tensor<16x8xf32>) -> tensor<2x16xf32>
  // %x is dead after the matmul; the gelu result must not overlap %h.
  // CHECK: mt.gelu {{.*}} {mt.offsets = array<i64: 0>}
  %g = mt.gelu %h tanh : tensor<2x16xf32>
  // The reshape aliases %g.
  // CHECK: mt.reshape {{.*}} {mt.offsets = array<i64: 0>}
  %r = mt.reshape %g : (tensor<2x16xf32>) -> tensor<4x8xf32>
  // %h (256) and %g (0, through %r) are live: the top.
  // CHECK: mt.gelu {{.*}} {mt.offsets = array<i64: 512>}
  %r2 = mt.gelu %r tanh : tensor<4x8xf32>
  // %r2 is never read and %g is dead: both freed; 0 is the best fit.
  // CHECK: mt.matmul_input_grad {{.*}} {mt.offsets = array<i64: 0>}
  %dx = mt.matmul_input_grad %h, %w : (tensor<2x16xf32>, tensor<16x8xf32>) -> tensor<2x8xf32>
  // %h died at the op before.
  // CHECK: mt.gelu {{.*}} {mt.offsets = array<i64: 256>}
  %y = mt.gelu %dx tanh : tensor<2x8xf32>
  return %y : tensor<2x8xf32>
}

// A second program shares the arena; the module records the larger one.
// %a is read by the add, so the add's result goes above both operands.
// CHECK-LABEL: func.func @g(
// CHECK-SAME: attributes {mt.arena_bytes = 768 : i64}
// CHECK: mt.gelu {{.*}} {mt.offsets = array<i64: 256>}
// CHECK: mt.gelu {{.*}} {mt.offsets = array<i64: 0>}
// CHECK: mt.add {{.*}} {mt.offsets = array<i64: 512>}
func.func @g(%x: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %a = mt.gelu %x tanh : tensor<2x8xf32>
  %b = mt.gelu %a tanh : tensor<2x8xf32>
  %c = mt.add %a, %b : tensor<2x8xf32>
  return %c : tensor<2x8xf32>
}

// An mt.fused op is placed like any op: its operands live until it runs and
// its result does not overlap them; the values inside its body take no arena
// bytes (no mt.offsets) and do not count towards the peak.
// CHECK-LABEL: func.func @fused(
// CHECK-SAME: attributes {mt.arena_bytes = 768 : i64}
// CHECK: mt.gelu {{.*}} {mt.offsets = array<i64: 256>}
// CHECK: mt.fused elementwise "add+gelu" ({{.*}}) : {{.*}} attributes {mt.offsets = array<i64: 512>} {
// CHECK-NOT: mt.offsets
// CHECK: mt.yield
// CHECK-NEXT: }
// CHECK-NEXT: mt.gelu {{.*}} {mt.offsets = array<i64: 0>}
func.func @fused(%x: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %a = mt.gelu %x tanh : tensor<2x8xf32>
  %k = mt.fused elementwise "add+gelu" (%p = %a, %q = %x) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32> {
    %s = mt.add %p, %q : tensor<2x8xf32>
    %g = mt.gelu %s tanh : tensor<2x8xf32>
    mt.yield %g : tensor<2x8xf32>
  }
  %y = mt.gelu %k tanh : tensor<2x8xf32>
  return %y : tensor<2x8xf32>
}

// The logits' gradient overwrites the logits when the gradient op is their
// last use (one logits-sized buffer at the peak instead of two)...
// CHECK-LABEL: func.func @ce_in_place(
// CHECK: %[[L:.*]] = mt.gelu {{.*}} {mt.offsets = array<i64: [[OFF:[0-9]+]]>}
// CHECK: mt.cross_entropy %[[L]]
// CHECK: mt.cross_entropy_grad %[[L]], {{.*}} {mt.offsets = array<i64: [[OFF]]>}
func.func @ce_in_place(%x: tensor<2x64xf32>, %labels: tensor<2xi32>, %seed: tensor<f32>) -> tensor<2x64xf32> {
  %l = mt.gelu %x tanh : tensor<2x64xf32>
  %loss = mt.cross_entropy %l, %labels : (tensor<2x64xf32>, tensor<2xi32>) -> tensor<f32>
  %d = mt.cross_entropy_grad %l, %labels, %seed : (tensor<2x64xf32>, tensor<2xi32>, tensor<f32>) -> tensor<2x64xf32>
  return %d : tensor<2x64xf32>
}

// ... and not when the logits are read again afterwards.
// CHECK-LABEL: func.func @ce_logits_read_later(
// CHECK: %[[L:.*]] = mt.gelu {{.*}} {mt.offsets = array<i64: 1024>}
// CHECK: mt.cross_entropy_grad %[[L]], {{.*}} {mt.offsets = array<i64: 0>}
// CHECK: mt.add %[[L]], {{.*}} {mt.offsets = array<i64: 512>}
func.func @ce_logits_read_later(%x: tensor<2x64xf32>, %labels: tensor<2xi32>, %seed: tensor<f32>) -> tensor<2x64xf32> {
  %l = mt.gelu %x tanh : tensor<2x64xf32>
  %d = mt.cross_entropy_grad %l, %labels, %seed : (tensor<2x64xf32>, tensor<2xi32>, tensor<f32>) -> tensor<2x64xf32>
  %s = mt.add %l, %d : tensor<2x64xf32>
  return %s : tensor<2x64xf32>
}

// Best-fit in program order fragments: %x (256 B) at 0 and %y (512 B) at
// 256; %a goes on top (768); %x's bytes free after op 0 are too few for %b,
// which grows the arena to 1536 B. Placed offline by size, the long-lived
// %b is laid out first, at 0, and everything else around it: 1280 B, the
// most ever live at once (%y, %a and %b at op 1).
// CHECK-LABEL: func.func @offline_by_size(
// CHECK-SAME: %{{.*}}: tensor<64xf32> {mt.offset = 0 : i64}, %{{.*}}: tensor<128xf32> {mt.offset = 512 : i64})
// CHECK-SAME: attributes {mt.arena_bytes = 1280 : i64}
// CHECK: mt.gelu {{.*}} {mt.offsets = array<i64: 1024>}
// CHECK: mt.gelu {{.*}} {mt.offsets = array<i64: 0>}
// CHECK: mt.gelu {{.*}} {mt.offsets = array<i64: 512>}
func.func @offline_by_size(%x: tensor<64xf32>, %y: tensor<128xf32>) -> (tensor<128xf32>, tensor<64xf32>) {
  %a = mt.gelu %x tanh : tensor<64xf32>
  %b = mt.gelu %y tanh : tensor<128xf32>
  %c = mt.gelu %a tanh : tensor<64xf32>
  return %b, %c : tensor<128xf32>, tensor<64xf32>
}

// The in-place logits gradient under the offline layout: the logits and
// their gradient are one buffer, live from the gelu to the return, placed
// first at 0 (best-fit would need 2048 B; the bound, at op 1, is 1792 B).
// CHECK-LABEL: func.func @ce_in_place_offline(
// CHECK-SAME: attributes {mt.arena_bytes = 1792 : i64}
// CHECK: mt.gelu {{.*}} {mt.offsets = array<i64: 1536>}
// CHECK: %[[L:.*]] = mt.gelu {{.*}} {mt.offsets = array<i64: [[OFF:0]]>}
// CHECK: mt.cross_entropy_grad %[[L]], {{.*}} {mt.offsets = array<i64: [[OFF]]>}
// CHECK: mt.gelu {{.*}} {mt.offsets = array<i64: 512>}
func.func @ce_in_place_offline(%x: tensor<2x32xf32>, %y: tensor<2x64xf32>, %labels: tensor<2xi32>, %seed: tensor<f32>) -> (tensor<2x64xf32>, tensor<2x32xf32>) {
  %a = mt.gelu %x tanh : tensor<2x32xf32>
  %l = mt.gelu %y tanh : tensor<2x64xf32>
  %d = mt.cross_entropy_grad %l, %labels, %seed : (tensor<2x64xf32>, tensor<2xi32>, tensor<f32>) -> tensor<2x64xf32>
  %c = mt.gelu %a tanh : tensor<2x32xf32>
  return %d, %c : tensor<2x64xf32>, tensor<2x32xf32>
}
