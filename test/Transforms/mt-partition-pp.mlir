// mt-partition-pp: layers over pipeline stages, one nested module per rank,
// send/recv at the boundaries, tied embeddings copied to the last stage.
// RUN: mtc-opt %s -split-input-file -mt-partition-pp | FileCheck %s --enable-var-scope

// CHECK-LABEL: module attributes
// CHECK-SAME: mt.pipeline = {chunks = 1 : i64, stages = 2 : i64, tags_per_micro_batch = 2 : i64}
// CHECK: mt.param @emb
// CHECK: module @stage0 attributes {mt.stage = 0 : i64}
// CHECK-NEXT: mt.param @emb : tensor<32x8xf32>, normal(2.000000e-02) {mt.tied_peer = 1 : i64}
// CHECK-NEXT: mt.param @l0.weight
// CHECK-NEXT: func.func @forward(%[[TOK:.*]]: tensor<2x4xi32> {mt.name = "tokens"}) {
// CHECK:   %[[X:.*]] = mt.embedding {{.*}} {mt.chunk = 0 : i64}
// CHECK:   %[[Y:.*]] = mt.matmul %[[X]], {{.*}} {mt.chunk = 0 : i64, mt.layer = 0 : i64}
// CHECK:   mt.send %[[Y]] to 1 {mt.chunk = 0 : i64, tag = 0 : i64} : tensor<2x4x8xf32>
// CHECK-NEXT: return
// CHECK: module @stage1 attributes {mt.stage = 1 : i64}
// CHECK-NEXT: mt.param @emb : tensor<32x8xf32>, normal(2.000000e-02) {mt.tied_copy, mt.tied_peer = 0 : i64}
// CHECK-NEXT: mt.param @l1.weight
// CHECK-NEXT: func.func @forward(%[[LAB:.*]]: tensor<2x4xi32> {mt.name = "labels"}) -> tensor<f32> {
// CHECK:   %[[R:.*]] = mt.recv from 0 {mt.chunk = 0 : i64, tag = 0 : i64} : tensor<2x4x8xf32>
// CHECK:   mt.matmul %[[R]], {{.*}} {mt.chunk = 0 : i64, mt.layer = 1 : i64}
// CHECK:   %[[L:.*]] = mt.cross_entropy {{.*}}, %[[LAB]] {mt.chunk = 0 : i64}
// CHECK:   return %[[L]] : tensor<f32>
// CHECK-NOT: func.func @forward
module attributes {mt.parallel = {pipeline_model_parallel_size = 2 : i64}} {
  mt.param @emb : tensor<32x8xf32>, normal(2.000000e-02)
  mt.param @l0.weight : tensor<8x8xf32>, normal(2.000000e-02)
  mt.param @l1.weight : tensor<8x8xf32>, normal(2.000000e-02)
  func.func @forward(%tokens: tensor<2x4xi32> {mt.name = "tokens"}, %labels: tensor<2x4xi32> {mt.name = "labels"}) -> tensor<f32> {
    %e = mt.param_ref @emb : tensor<32x8xf32>
    %x = mt.embedding %e, %tokens : (tensor<32x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
    %w0 = mt.param_ref @l0.weight : tensor<8x8xf32>
    %y0 = mt.matmul %x, %w0 {mt.layer = 0 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %w1 = mt.param_ref @l1.weight : tensor<8x8xf32>
    %y1 = mt.matmul %y0, %w1 {mt.layer = 1 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %logits = mt.matmul %y1, %e : (tensor<2x4x8xf32>, tensor<32x8xf32>) -> tensor<2x4x32xf32>
    %loss = mt.cross_entropy %logits, %labels : (tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// -----

// Interleaved: 4 layers, pp 2, vp 2: rank 0 holds layers 0 and 2 (chunks 0
// and 1), rank 1 layers 1 and 3; chunk 1 of rank 0 receives from rank 1.
// CHECK-LABEL: module attributes
// CHECK-SAME: chunks = 2 : i64, stages = 2 : i64, tags_per_micro_batch = 6 : i64
// CHECK: module @stage0
// CHECK: mt.matmul {{.*}} {mt.chunk = 0 : i64, mt.layer = 0 : i64}
// CHECK: mt.send {{.*}} to 1 {mt.chunk = 0 : i64, tag = 0 : i64}
// CHECK: mt.recv from 1 {mt.chunk = 1 : i64, tag = 2 : i64}
// CHECK: mt.matmul {{.*}} {mt.chunk = 1 : i64, mt.layer = 2 : i64}
// CHECK: mt.send {{.*}} to 1 {mt.chunk = 1 : i64, tag = 4 : i64}
// CHECK: module @stage1
// CHECK: mt.recv from 0 {mt.chunk = 0 : i64, tag = 0 : i64}
// CHECK: mt.matmul {{.*}} {mt.chunk = 0 : i64, mt.layer = 1 : i64}
// CHECK: mt.send {{.*}} to 0 {mt.chunk = 0 : i64, tag = 2 : i64}
// CHECK: mt.recv from 0 {mt.chunk = 1 : i64, tag = 4 : i64}
// CHECK: mt.matmul {{.*}} {mt.chunk = 1 : i64, mt.layer = 3 : i64}
module attributes {mt.parallel = {pipeline_model_parallel_size = 2 : i64, virtual_pipeline_model_parallel_size = 2 : i64}} {
  mt.param @w : tensor<8x8xf32>, normal(2.000000e-02)
  mt.param @w0 : tensor<8x8xf32>, normal(2.000000e-02)
  mt.param @w1 : tensor<8x8xf32>, normal(2.000000e-02)
  mt.param @w2 : tensor<8x8xf32>, normal(2.000000e-02)
  mt.param @w3 : tensor<8x8xf32>, normal(2.000000e-02)
  mt.param @out : tensor<32x8xf32>, normal(2.000000e-02)
  func.func @forward(%x: tensor<2x4x8xf32> {mt.name = "x"}, %labels: tensor<2x4xi32> {mt.name = "labels"}) -> tensor<f32> {
    %w = mt.param_ref @w : tensor<8x8xf32>
    %h = mt.matmul %x, %w : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %w0 = mt.param_ref @w0 : tensor<8x8xf32>
    %y0 = mt.matmul %h, %w0 {mt.layer = 0 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %w1 = mt.param_ref @w1 : tensor<8x8xf32>
    %y1 = mt.matmul %y0, %w1 {mt.layer = 1 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %w2 = mt.param_ref @w2 : tensor<8x8xf32>
    %y2 = mt.matmul %y1, %w2 {mt.layer = 2 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %w3 = mt.param_ref @w3 : tensor<8x8xf32>
    %y3 = mt.matmul %y2, %w3 {mt.layer = 3 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %o = mt.param_ref @out : tensor<32x8xf32>
    %logits = mt.matmul %y3, %o : (tensor<2x4x8xf32>, tensor<32x8xf32>) -> tensor<2x4x32xf32>
    %loss = mt.cross_entropy %logits, %labels : (tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// -----

// One stage: the module stays flat.
// CHECK-LABEL: module attributes
// CHECK-NOT: mt.pipeline
// CHECK-NOT: module @stage
// CHECK: func.func @forward
module attributes {mt.parallel = {pipeline_model_parallel_size = 1 : i64}} {
  func.func @forward(%x: tensor<f32>) -> tensor<f32> {
    return %x : tensor<f32>
  }
}

// -----

// An MoE model's auxiliary-loss sum: each stage returns the sum of its own
// layers' terms under the same name (the first stage two routers', the last
// one's), and the loss stays on the last stage.
// CHECK-LABEL: module attributes
// CHECK: module @stage0
// CHECK: func.func @forward(%{{.*}}: tensor<2x4xi32> {mt.name = "tokens"}) -> (tensor<f32> {mt.name = "load_balancing_loss"})
// CHECK:   %{{.*}}, %{{.*}}, %[[A0:.*]], %{{.*}} = mt.moe_router {{.*}}mt.layer = 0 : i64
// CHECK:   %{{.*}}, %{{.*}}, %[[A1:.*]], %{{.*}} = mt.moe_router {{.*}}mt.layer = 1 : i64
// CHECK:   mt.send
// CHECK:   %[[S:.*]] = mt.add %[[A0]], %[[A1]] {mt.chunk = 0 : i64} : tensor<f32>
// CHECK:   return %[[S]] : tensor<f32>
// CHECK: module @stage1
// CHECK: func.func @forward(%{{.*}}: tensor<2x4xi32> {mt.name = "labels"}) -> (tensor<f32>, tensor<f32> {mt.name = "load_balancing_loss"})
// CHECK:   %{{.*}}, %{{.*}}, %[[A3:.*]], %{{.*}} = mt.moe_router {{.*}}mt.layer = 3 : i64
// CHECK:   %[[L:.*]] = mt.cross_entropy
// CHECK-NOT: mt.add
// CHECK:   return %[[L]], %[[A3]] : tensor<f32>, tensor<f32>
module attributes {mt.parallel = {pipeline_model_parallel_size = 2 : i64}} {
  mt.param @emb : tensor<32x8xf32>, normal(2.000000e-02)
  mt.param @r0 : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @r1 : tensor<4x8xf32>, normal(2.000000e-02)
  mt.param @l2.weight : tensor<8x8xf32>, normal(2.000000e-02)
  mt.param @r3 : tensor<4x8xf32>, normal(2.000000e-02)
  func.func @forward(%tokens: tensor<2x4xi32> {mt.name = "tokens"}, %labels: tensor<2x4xi32> {mt.name = "labels"})
      -> (tensor<f32>, tensor<f32> {mt.name = "load_balancing_loss"}) {
    %e = mt.param_ref @emb : tensor<32x8xf32>
    %x = mt.embedding %e, %tokens : (tensor<32x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
    %xf = mt.reshape %x {mt.layer = 0 : i64} : (tensor<2x4x8xf32>) -> tensor<8x8xf32>
    %w0 = mt.param_ref @r0 : tensor<4x8xf32>
    %g0 = mt.matmul %xf, %w0 {mt.layer = 0 : i64} : (tensor<8x8xf32>, tensor<4x8xf32>) -> tensor<8x4xf32>
    %p0, %m0, %a0, %z0 = mt.moe_router %g0 softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, mt.layer = 0 : i64, scaling_factor = 0.0 : f64, seq_length = 4 : i64, topk = 2 : i64, z_loss_coeff = 0.0 : f64} : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x4xi32>, tensor<f32>, tensor<f32>)
    %w1 = mt.param_ref @r1 : tensor<4x8xf32>
    %g1 = mt.matmul %xf, %w1 {mt.layer = 1 : i64} : (tensor<8x8xf32>, tensor<4x8xf32>) -> tensor<8x4xf32>
    %p1, %m1, %a1, %z1 = mt.moe_router %g1 softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, mt.layer = 1 : i64, scaling_factor = 0.0 : f64, seq_length = 4 : i64, topk = 2 : i64, z_loss_coeff = 0.0 : f64} : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x4xi32>, tensor<f32>, tensor<f32>)
    %w2 = mt.param_ref @l2.weight : tensor<8x8xf32>
    %y2 = mt.matmul %x, %w2 {mt.layer = 2 : i64} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %yf = mt.reshape %y2 {mt.layer = 3 : i64} : (tensor<2x4x8xf32>) -> tensor<8x8xf32>
    %w3 = mt.param_ref @r3 : tensor<4x8xf32>
    %g3 = mt.matmul %yf, %w3 {mt.layer = 3 : i64} : (tensor<8x8xf32>, tensor<4x8xf32>) -> tensor<8x4xf32>
    %p3, %m3, %a3, %z3 = mt.moe_router %g3 softmax aux_loss drop probs dtype none {aux_loss_coeff = 1.0e-02 : f64, capacity = 0 : i64, mt.layer = 3 : i64, scaling_factor = 0.0 : f64, seq_length = 4 : i64, topk = 2 : i64, z_loss_coeff = 0.0 : f64} : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x4xi32>, tensor<f32>, tensor<f32>)
    %logits = mt.matmul %y2, %e : (tensor<2x4x8xf32>, tensor<32x8xf32>) -> tensor<2x4x32xf32>
    %loss = mt.cross_entropy %logits, %labels : (tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<f32>
    %s01 = mt.add %a0, %a1 : tensor<f32>
    %s = mt.add %s01, %a3 : tensor<f32>
    return %loss, %s : tensor<f32>, tensor<f32>
  }
}
