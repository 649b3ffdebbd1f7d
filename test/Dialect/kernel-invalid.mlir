// Every verifier and parser message of mt.fused and mt.yield.
// RUN: mtc-opt %s -split-input-file -verify-diagnostics -allow-unregistered-dialect

func.func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{expected 'elementwise', 'row_reduction' or 'gemm', got 'pointwise'}}
  %y = mt.fused pointwise "k" (%a = %x) : (tensor<4x8xf32>) -> tensor<4x8xf32> {
    %g = mt.gelu %a tanh : tensor<4x8xf32>
    mt.yield %g : tensor<4x8xf32>
  }
  return %y : tensor<4x8xf32>
}

// -----

func.func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{the type lists 2 inputs but 1 are bound}}
  %y = mt.fused elementwise "k" (%a = %x) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32> {
    %g = mt.gelu %a tanh : tensor<4x8xf32>
    mt.yield %g : tensor<4x8xf32>
  }
  return %y : tensor<4x8xf32>
}

// -----

func.func @f(%x: tensor<4x8xf32>, %r: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{body has 1 arguments but the op has 2 operands}}
  %y = "mt.fused"(%x, %r) <{kind = 0 : i32, name = "k"}> ({
  ^bb0(%a: tensor<4x8xf32>):
    %g = mt.gelu %a tanh : tensor<4x8xf32>
    mt.yield %g : tensor<4x8xf32>
  }) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

// -----

func.func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{body argument #0 has type 'tensor<8x4xf32>' but operand #0 has type 'tensor<4x8xf32>'}}
  %y = "mt.fused"(%x) <{kind = 0 : i32, name = "k"}> ({
  ^bb0(%a: tensor<8x4xf32>):
    %g = mt.gelu %a tanh : tensor<8x4xf32>
    %r = mt.reshape %g : (tensor<8x4xf32>) -> tensor<4x8xf32>
    mt.yield %r : tensor<4x8xf32>
  }) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

// -----

func.func @f(%x: tensor<4x8xf32>) {
  // expected-error @+1 {{has no results; a kernel must compute at least one value}}
  mt.fused elementwise "k" (%a = %x) : (tensor<4x8xf32>) -> () {
    %g = mt.gelu %a tanh : tensor<4x8xf32>
    mt.yield
  }
  return
}

// -----

func.func @f(%x: tensor<4x16xf32>, %w: tensor<16xf32>) -> tensor<4x16xf32> {
  %y = mt.fused elementwise "k" (%a = %x, %ww = %w) : (tensor<4x16xf32>, tensor<16xf32>) -> tensor<4x16xf32> {
    // expected-error @+1 {{'mt.rms_norm' op cannot be part of a kernel of kind 'elementwise'; a row-wise op needs kind row_reduction}}
    %n = mt.rms_norm %a, %ww {epsilon = 1.0e-05 : f64} : tensor<4x16xf32>, tensor<16xf32>
    mt.yield %n : tensor<4x16xf32>
  }
  return %y : tensor<4x16xf32>
}

// -----

func.func @f(%x: tensor<4x16xf32>, %w: tensor<16xf32>) -> tensor<64xf32> {
  %y = mt.fused row_reduction "k" (%a = %x, %ww = %w) : (tensor<4x16xf32>, tensor<16xf32>) -> tensor<64xf32> {
    %n = mt.rms_norm %a, %ww {epsilon = 1.0e-05 : f64} : tensor<4x16xf32>, tensor<16xf32>
    // expected-error @+1 {{'mt.reshape' op cannot be part of a kernel of kind 'row_reduction'; a reshape may change what a row is}}
    %r = mt.reshape %n : (tensor<4x16xf32>) -> tensor<64xf32>
    mt.yield %r : tensor<64xf32>
  }
  return %y : tensor<64xf32>
}

// -----

func.func @f(%x: tensor<4x16xf32>, %w: tensor<8x16xf32>) -> tensor<4x8xf32> {
  %y = mt.fused elementwise "k" (%a = %x, %ww = %w) : (tensor<4x16xf32>, tensor<8x16xf32>) -> tensor<4x8xf32> {
    // expected-error @+1 {{'mt.matmul' op cannot be part of a kernel of kind 'elementwise'; see mt.fused for the ops a kernel can hold}}
    %m = mt.matmul %a, %ww : (tensor<4x16xf32>, tensor<8x16xf32>) -> tensor<4x8xf32>
    mt.yield %m : tensor<4x8xf32>
  }
  return %y : tensor<4x8xf32>
}

// -----

func.func @f(%x: tensor<4x16xf32>, %r: tensor<4x16xf32>) -> tensor<4x16xf32> {
  // expected-error @+1 {{a row_reduction kernel holds exactly one mt.layer_norm or mt.rms_norm, found 0}}
  %y = mt.fused row_reduction "k" (%a = %x, %b = %r) : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32> {
    %s = mt.add %a, %b : tensor<4x16xf32>
    mt.yield %s : tensor<4x16xf32>
  }
  return %y : tensor<4x16xf32>
}

// -----

func.func @f(%x: tensor<4x16xf32>) -> tensor<4x16xf32> {
  // expected-error @+1 {{body must end in mt.yield}}
  %y = mt.fused elementwise "k" (%a = %x) : (tensor<4x16xf32>) -> tensor<4x16xf32> {
    %g = mt.gelu %a tanh : tensor<4x16xf32>
    "other.terminator"(%g) : (tensor<4x16xf32>) -> ()
  }
  return %y : tensor<4x16xf32>
}

// -----

func.func @f(%x: tensor<4x16xf32>) -> tensor<4x16xf32> {
  %y = mt.fused elementwise "k" (%a = %x) : (tensor<4x16xf32>) -> tensor<4x16xf32> {
    %g = mt.gelu %a tanh : tensor<4x16xf32>
    // expected-error @+1 {{'mt.yield' op yields 2 values but the kernel has 1 results}}
    mt.yield %g, %g : tensor<4x16xf32>, tensor<4x16xf32>
  }
  return %y : tensor<4x16xf32>
}

// -----

func.func @f(%x: tensor<4x16xf32>) -> tensor<4x16xf16> {
  %y = mt.fused elementwise "k" (%a = %x) : (tensor<4x16xf32>) -> tensor<4x16xf16> {
    %g = mt.gelu %a tanh : tensor<4x16xf32>
    // expected-error @+1 {{'mt.yield' op value #0 has type 'tensor<4x16xf32>' but result #0 has type 'tensor<4x16xf16>'}}
    mt.yield %g : tensor<4x16xf32>
  }
  return %y : tensor<4x16xf16>
}

// -----

func.func @f(%x: tensor<4x16xf32>) -> (tensor<4x16xf32>, tensor<4x16xf32>) {
  %y:2 = mt.fused elementwise "k" (%a = %x) : (tensor<4x16xf32>) -> (tensor<4x16xf32>, tensor<4x16xf32>) {
    %g = mt.gelu %a tanh : tensor<4x16xf32>
    // expected-error @+1 {{'mt.yield' op value #1 is a body argument; results must be computed by the kernel}}
    mt.yield %g, %a : tensor<4x16xf32>, tensor<4x16xf32>
  }
  return %y#0, %y#1 : tensor<4x16xf32>, tensor<4x16xf32>
}

// -----

func.func @f(%x: tensor<4x16xf32>) -> (tensor<4x16xf32>, tensor<4x16xf32>) {
  %y:2 = mt.fused elementwise "k" (%a = %x) : (tensor<4x16xf32>) -> (tensor<4x16xf32>, tensor<4x16xf32>) {
    %g = mt.gelu %a tanh : tensor<4x16xf32>
    // expected-error @+1 {{'mt.yield' op value #1 is yielded twice; each result must be its own value}}
    mt.yield %g, %g : tensor<4x16xf32>, tensor<4x16xf32>
  }
  return %y#0, %y#1 : tensor<4x16xf32>, tensor<4x16xf32>
}

// -----

func.func @f(%x: tensor<4x16xf32>) -> tensor<4x16xf32> {
  // expected-error @+1 {{'mt.yield' op expects parent op 'mt.fused'}}
  "mt.yield"(%x) : (tensor<4x16xf32>) -> ()
}
