// mt.fused and mt.yield parse, verify and print back, in the custom and the
// generic form.
// RUN: mtc-opt %s | mtc-opt | FileCheck %s
// RUN: mtc-opt %s --mlir-print-op-generic | mtc-opt | FileCheck %s

// CHECK-LABEL: func.func @elementwise
// CHECK: %[[Y:.*]] = mt.fused elementwise "decoder.layers.0 dropout+add" (%[[A:.*]] = %{{.*}}, %[[R:.*]] = %{{.*}}) : (tensor<4x8x16xf32>, tensor<4x8x16xf32>) -> tensor<4x8x16xf32> attributes {mt.layer = 0 : i64} {
// CHECK-NEXT: %[[D:.*]] = mt.dropout %[[A]] {rate = 1.000000e-01 : f64, stream = 2 : i64} : tensor<4x8x16xf32>
// CHECK-NEXT: %[[S:.*]] = mt.add %[[R]], %[[D]] : tensor<4x8x16xf32>
// CHECK-NEXT: mt.yield %[[S]] : tensor<4x8x16xf32>
// CHECK-NEXT: }
// CHECK: return %[[Y]]
func.func @elementwise(%x: tensor<4x8x16xf32>, %res: tensor<4x8x16xf32>) -> tensor<4x8x16xf32> {
  %y = mt.fused elementwise "decoder.layers.0 dropout+add" (%a = %x, %r = %res)
      : (tensor<4x8x16xf32>, tensor<4x8x16xf32>) -> tensor<4x8x16xf32> attributes {mt.layer = 0 : i64} {
    %d = mt.dropout %a {rate = 0.1 : f64, stream = 2 : i64} : tensor<4x8x16xf32>
    %s = mt.add %r, %d : tensor<4x8x16xf32>
    mt.yield %s : tensor<4x8x16xf32>
  }
  return %y : tensor<4x8x16xf32>
}

// Every elementwise op, a reshape inside, and two results.
// CHECK-LABEL: func.func @every_elementwise_op
// CHECK: %{{.*}}:2 = mt.fused elementwise "k" ({{.*}}) : (tensor<4x8x32xf32>, tensor<32xf32>, tensor<4x8x16xf32>, tensor<4x8x32xf32>) -> (tensor<4x8x16xf32>, tensor<2x16x32xf32>)
// CHECK: mt.bias_add
// CHECK: mt.gelu {{.*}} tanh
// CHECK: mt.gelu_grad
// CHECK: mt.swiglu
// CHECK: mt.swiglu_grad
// CHECK: mt.reshape
// CHECK: mt.yield
func.func @every_elementwise_op(%x: tensor<4x8x32xf32>, %b: tensor<32xf32>, %dy: tensor<4x8x16xf32>,
                                %u: tensor<4x8x32xf32>) -> (tensor<4x8x16xf32>, tensor<2x16x32xf32>) {
  %y:2 = mt.fused elementwise "k" (%a = %x, %bb = %b, %g = %dy, %v = %u)
      : (tensor<4x8x32xf32>, tensor<32xf32>, tensor<4x8x16xf32>, tensor<4x8x32xf32>) -> (tensor<4x8x16xf32>, tensor<2x16x32xf32>) {
    %0 = mt.bias_add %a, %bb : tensor<4x8x32xf32>, tensor<32xf32>
    %1 = mt.gelu %0 tanh : tensor<4x8x32xf32>
    %2 = mt.gelu_grad %1, %v erf : tensor<4x8x32xf32>
    %3 = mt.swiglu %2 : (tensor<4x8x32xf32>) -> tensor<4x8x16xf32>
    %4 = mt.swiglu_grad %g, %2 : (tensor<4x8x16xf32>, tensor<4x8x32xf32>) -> tensor<4x8x32xf32>
    %5 = mt.reshape %4 : (tensor<4x8x32xf32>) -> tensor<2x16x32xf32>
    mt.yield %3, %5 : tensor<4x8x16xf32>, tensor<2x16x32xf32>
  }
  return %y#0, %y#1 : tensor<4x8x16xf32>, tensor<2x16x32xf32>
}

// A row-wise op with elementwise ops before and after it.
// CHECK-LABEL: func.func @row_reduction
// CHECK: mt.fused row_reduction "add+rms_norm+gelu" (
// CHECK: mt.add
// CHECK: mt.rms_norm
// CHECK: mt.gelu
// CHECK: mt.yield
func.func @row_reduction(%x: tensor<4x8x16xbf16>, %r: tensor<4x8x16xbf16>, %w: tensor<16xbf16>) -> tensor<4x8x16xbf16> {
  %y = mt.fused row_reduction "add+rms_norm+gelu" (%a = %x, %b = %r, %ww = %w)
      : (tensor<4x8x16xbf16>, tensor<4x8x16xbf16>, tensor<16xbf16>) -> tensor<4x8x16xbf16> {
    %s = mt.add %a, %b : tensor<4x8x16xbf16>
    %n = mt.rms_norm %s, %ww {epsilon = 1.0e-05 : f64} : tensor<4x8x16xbf16>, tensor<16xbf16>
    %g = mt.gelu %n erf : tensor<4x8x16xbf16>
    mt.yield %g : tensor<4x8x16xbf16>
  }
  return %y : tensor<4x8x16xbf16>
}

// CHECK-LABEL: func.func @layer_norm
// CHECK: mt.fused row_reduction "bias_add+layer_norm"
// CHECK: mt.layer_norm
func.func @layer_norm(%x: tensor<4x16xf32>, %b: tensor<16xf32>, %w: tensor<16xf32>) -> tensor<4x16xf32> {
  %y = mt.fused row_reduction "bias_add+layer_norm" (%a = %x, %bb = %b, %ww = %w)
      : (tensor<4x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<4x16xf32> {
    %0 = mt.bias_add %a, %bb : tensor<4x16xf32>, tensor<16xf32>
    %1 = mt.layer_norm %0, %ww, %bb {epsilon = 1.0e-05 : f64} : tensor<4x16xf32>, tensor<16xf32>
    mt.yield %1 : tensor<4x16xf32>
  }
  return %y : tensor<4x16xf32>
}

// The backward GEMMs with cuBLASLt's DGELU_BGRAD and BGRADB epilogues.
// CHECK-LABEL: func.func @gemm_grad
// CHECK: %[[DX:.*]] = mt.fused gemm_grad "matmul_input_grad+gelu_grad+bias_grad" (%[[G:.*]] = %{{.*}}, %[[W:.*]] = %{{.*}}, %[[P:.*]] = %{{.*}}) : (tensor<2x4x16xf32>, tensor<16x32xf32>, tensor<2x4x32xf32>) -> tensor<2x4x32xf32> {
// CHECK-NEXT: %[[DH:.*]] = mt.matmul_input_grad %[[G]], %[[W]]
// CHECK-NEXT: %[[D:.*]] = mt.gelu_grad %[[DH]], %[[P]] tanh
// CHECK-NEXT: mt.bias_grad %[[D]] into @fc1.bias
// CHECK-NEXT: mt.yield %[[D]]
// CHECK: mt.fused gemm_grad "matmul_weight_grad+bias_grad" (%[[G2:.*]] = %[[DX]], %[[X:.*]] = %{{.*}}) : (tensor<2x4x32xf32>, tensor<2x4x8xf32>) -> () {
// CHECK-NEXT: mt.matmul_weight_grad %[[G2]], %[[X]] into @fc1.weight
// CHECK-NEXT: mt.bias_grad %[[G2]] into @fc1.bias
// CHECK-NEXT: mt.yield
// CHECK-NEXT: }
mt.param @fc1.weight : tensor<32x8xf32>, normal(2.000000e-02)
mt.param @fc1.bias : tensor<32xf32>, zeros
func.func @gemm_grad(%dy: tensor<2x4x16xf32>, %w: tensor<16x32xf32>, %pre: tensor<2x4x32xf32>, %x: tensor<2x4x8xf32>) -> tensor<2x4x32xf32> {
  %dx = mt.fused gemm_grad "matmul_input_grad+gelu_grad+bias_grad" (%g = %dy, %ww = %w, %p = %pre)
      : (tensor<2x4x16xf32>, tensor<16x32xf32>, tensor<2x4x32xf32>) -> tensor<2x4x32xf32> {
    %dh = mt.matmul_input_grad %g, %ww : (tensor<2x4x16xf32>, tensor<16x32xf32>) -> tensor<2x4x32xf32>
    %d = mt.gelu_grad %dh, %p tanh : tensor<2x4x32xf32>
    mt.bias_grad %d into @fc1.bias : tensor<2x4x32xf32>
    mt.yield %d : tensor<2x4x32xf32>
  }
  mt.fused gemm_grad "matmul_weight_grad+bias_grad" (%g = %dx, %a = %x)
      : (tensor<2x4x32xf32>, tensor<2x4x8xf32>) -> () {
    mt.matmul_weight_grad %g, %a into @fc1.weight : tensor<2x4x32xf32>, tensor<2x4x8xf32>
    mt.bias_grad %g into @fc1.bias : tensor<2x4x32xf32>
    mt.yield
  }
  return %dx : tensor<2x4x32xf32>
}
