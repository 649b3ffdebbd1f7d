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
