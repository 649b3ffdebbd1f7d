// Every verifier and parser message of mt.fused and mt.yield.
// RUN: mtc-opt %s -split-input-file -verify-diagnostics -allow-unregistered-dialect

func.func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{expected 'elementwise', 'row_reduction', 'gemm' or 'gemm_grad', got 'pointwise'}}
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

// -----

// gemm_grad: an erf GeLU gradient is not cuBLASLt's DGELU.
mt.param @b : tensor<32xf32>, zeros
func.func @f(%dy: tensor<2x4x16xf32>, %w: tensor<16x32xf32>, %pre: tensor<2x4x32xf32>) -> tensor<2x4x32xf32> {
  %y = mt.fused gemm_grad "k" (%g = %dy, %ww = %w, %p = %pre) : (tensor<2x4x16xf32>, tensor<16x32xf32>, tensor<2x4x32xf32>) -> tensor<2x4x32xf32> {
    %dh = mt.matmul_input_grad %g, %ww : (tensor<2x4x16xf32>, tensor<16x32xf32>) -> tensor<2x4x32xf32>
    // expected-error @+1 {{'mt.gelu_grad' op cannot be part of a kernel of kind 'gemm_grad'; see mt.fused for the ops a kernel can hold}}
    %dx = mt.gelu_grad %dh, %p erf : tensor<2x4x32xf32>
    mt.yield %dx : tensor<2x4x32xf32>
  }
  return %y : tensor<2x4x32xf32>
}

// -----

// gemm_grad: the bias gradient must be of the GeLU's gradient.
mt.param @b : tensor<32xf32>, zeros
func.func @f(%dy: tensor<2x4x16xf32>, %w: tensor<16x32xf32>, %pre: tensor<2x4x32xf32>) -> tensor<2x4x32xf32> {
  // expected-error @+1 {{a gemm_grad kernel on mt.matmul_input_grad is that op, the tanh mt.gelu_grad of its result, and optionally the mt.bias_grad of that, in this order}}
  %y = mt.fused gemm_grad "k" (%g = %dy, %ww = %w, %p = %pre) : (tensor<2x4x16xf32>, tensor<16x32xf32>, tensor<2x4x32xf32>) -> tensor<2x4x32xf32> {
    %dh = mt.matmul_input_grad %g, %ww : (tensor<2x4x16xf32>, tensor<16x32xf32>) -> tensor<2x4x32xf32>
    %dx = mt.gelu_grad %dh, %p tanh : tensor<2x4x32xf32>
    mt.bias_grad %p into @b : tensor<2x4x32xf32>
    mt.yield %dx : tensor<2x4x32xf32>
  }
  return %y : tensor<2x4x32xf32>
}

// -----

func.func @f(%dy: tensor<2x4x16xf32>, %w: tensor<16x32xf32>, %pre: tensor<2x4x32xf32>) -> (tensor<2x4x32xf32>, tensor<2x4x32xf32>) {
  // expected-error @+1 {{a gemm_grad kernel's matmul_input_grad result feeds only its gelu_grad}}
  %y:2 = mt.fused gemm_grad "k" (%g = %dy, %ww = %w, %p = %pre) : (tensor<2x4x16xf32>, tensor<16x32xf32>, tensor<2x4x32xf32>) -> (tensor<2x4x32xf32>, tensor<2x4x32xf32>) {
    %dh = mt.matmul_input_grad %g, %ww : (tensor<2x4x16xf32>, tensor<16x32xf32>) -> tensor<2x4x32xf32>
    %dx = mt.gelu_grad %dh, %p tanh : tensor<2x4x32xf32>
    mt.yield %dh, %dx : tensor<2x4x32xf32>, tensor<2x4x32xf32>
  }
  return %y#0, %y#1 : tensor<2x4x32xf32>, tensor<2x4x32xf32>
}

// -----

mt.param @w : tensor<16x32xf32>, normal(2.000000e-02)
mt.param @b : tensor<16xf32>, zeros
func.func @f(%dy: tensor<2x4x16xf32>, %x: tensor<2x4x32xf32>, %dz: tensor<2x4x16xf32>) {
  // expected-error @+1 {{a gemm_grad kernel's mt.bias_grad sums the output gradient its mt.matmul_weight_grad reads}}
  mt.fused gemm_grad "k" (%g = %dy, %a = %x, %h = %dz) : (tensor<2x4x16xf32>, tensor<2x4x32xf32>, tensor<2x4x16xf32>) -> () {
    mt.matmul_weight_grad %g, %a into @w : tensor<2x4x16xf32>, tensor<2x4x32xf32>
    mt.bias_grad %h into @b : tensor<2x4x16xf32>
    mt.yield
  }
  return
}

// -----

mt.param @w : tensor<16x32xf32>, normal(2.000000e-02)
func.func @f(%dy: tensor<2x4x16xf32>, %x: tensor<2x4x32xf32>) {
  // expected-error @+1 {{a gemm_grad kernel is an mt.matmul_input_grad with its tanh mt.gelu_grad (and optionally mt.bias_grad), or an mt.matmul_weight_grad and one mt.bias_grad, in this order}}
  mt.fused gemm_grad "k" (%g = %dy, %a = %x) : (tensor<2x4x16xf32>, tensor<2x4x32xf32>) -> () {
    mt.matmul_weight_grad %g, %a into @w : tensor<2x4x16xf32>, tensor<2x4x32xf32>
    mt.yield
  }
  return
}

// -----

func.func @f(%dy: tensor<2x4x16xf32>) {
  // expected-error @+1 {{has no results; a kernel must compute at least one value}}
  mt.fused elementwise "k" (%g = %dy) : (tensor<2x4x16xf32>) -> () {
    %d = mt.gelu %g tanh : tensor<2x4x16xf32>
    mt.yield
  }
  return
}
