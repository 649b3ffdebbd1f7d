// Operations of the kernel level (DESIGN.md, IR level 3): `mt.fused` regions,
// each of which becomes one generated kernel. Included by MtOps.td.
#ifndef MT_KERNEL_OPS_TD
#define MT_KERNEL_OPS_TD

def Mt_FusionKind : I32EnumAttr<"FusionKind", "the shape of a fused kernel's loop", [
    I32EnumAttrCase<"Elementwise", 0, "elementwise">,
    I32EnumAttrCase<"RowReduction", 1, "row_reduction">,
    I32EnumAttrCase<"Gemm", 2, "gemm">,
    I32EnumAttrCase<"GemmGrad", 3, "gemm_grad">,
  ]> {
  let cppNamespace = "::mt";
}

def Mt_FusedOp : Mt_Op<"fused", [IsolatedFromAbove, SingleBlock,
    RecursiveMemoryEffects]> {
  let summary = "a group of ops that runs as one generated kernel";
  let description = [{
    The body computes the results from the operands (the kernel's inputs),
    bound in order to the entry block's arguments, and ends in `mt.yield`
    with one value per result. Nothing else crosses the region's boundary
    (it is isolated from above), so the kernel's inputs and outputs are
    exactly the operands and results: only they take arena space, and every
    value inside lives in registers on the GPU (in kernel-local scratch on
    the CPU executor).

    `kind` says which loop the kernel generator emits, and so which ops the
    body may hold:

    - `elementwise`: one thread per element. Ops in which each output
      element depends on a fixed, small set of input elements at the same
      row: `mt.bias_add`, `mt.add`, `mt.gelu`, `mt.gelu_grad`, `mt.swiglu`,
      `mt.swiglu_grad`, `mt.dropout` (its mask is a function of the element
      index, so a thread reproduces it alone) and `mt.reshape`.
    - `row_reduction`: one block per row of the last dimension. Exactly one
      of `mt.layer_norm` or `mt.rms_norm`, whose output row depends on its
      whole input row, plus elementwise ops before or after it on the same
      rows. `mt.reshape` is excluded, as it may change what a row is.

    - `gemm`: one cuBLASLt matmul whose epilogue computes the rest. The
      body is exactly an `mt.matmul`, the `mt.bias_add` of its result, and
      optionally the tanh `mt.gelu` of that (cuBLASLt's GELU epilogue is the
      tanh form). With the GeLU, the bias add's result may be a second
      result: the epilogue's aux output, the pre-activation the backward's
      `mt.gelu_grad` reads.
    - `gemm_grad`: one cuBLASLt backward matmul whose epilogue computes the
      rest, in one of two forms:
      - an `mt.matmul_input_grad`, the tanh `mt.gelu_grad` of its result
        (cuBLASLt's DGELU epilogue, the pre-activation read as its aux
        input) and optionally the `mt.bias_grad` of that (DGELU_BGRAD: the
        bias gradient summed over the GEMM's tokens); the result is the
        GeLU gradient;
      - an `mt.matmul_weight_grad` and the `mt.bias_grad` of the same
        output gradient (BGRADB: the column sums of the GEMM's B operand).
        Both add into parameter gradients, so this kernel has no results.

    Not allowed: GEMMs outside `gemm` and `gemm_grad` kernels, attention,
    other ops that add into gradient buffers (their column sums reduce
    across rows), and `mt.cross_entropy`, which reduces every token to one
    number. Each result is a value the body computes (not an entry
    argument), yielded once.

    `name` identifies the kernel in plan.bin, in logs and in errors.

    ```mlir
    %y = mt.fused elementwise "decoder.layers.0 dropout+add" (%a = %x, %r = %res)
        : (tensor<4x128x64xf32>, tensor<4x128x64xf32>) -> tensor<4x128x64xf32> {
      %d = mt.dropout %a {rate = 1.000000e-01 : f64, stream = 2 : i64} : tensor<4x128x64xf32>
      %s = mt.add %r, %d : tensor<4x128x64xf32>
      mt.yield %s : tensor<4x128x64xf32>
    }
    ```

    A backward GEMM with the GeLU and bias gradients in its epilogue:

    ```mlir
    %dpre = mt.fused gemm_grad "decoder.layers.0 matmul_input_grad+gelu_grad+bias_grad" (%dy = %0, %w = %1, %pre = %2)
        : (tensor<4x128x64xf32>, tensor<64x256xf32>, tensor<4x128x256xf32>) -> tensor<4x128x256xf32> {
      %dh = mt.matmul_input_grad %dy, %w : (tensor<4x128x64xf32>, tensor<64x256xf32>) -> tensor<4x128x256xf32>
      %dx = mt.gelu_grad %dh, %pre tanh : tensor<4x128x256xf32>
      mt.bias_grad %dx into @decoder.layers.0.mlp.linear_fc1.bias : tensor<4x128x256xf32>
      mt.yield %dx : tensor<4x128x256xf32>
    }
    ```
  }];
  let arguments = (ins Variadic<AnyRankedTensor>:$inputs, StrAttr:$name,
                       Mt_FusionKind:$kind);
  let results = (outs Variadic<AnyRankedTensor>:$results);
  let regions = (region SizedRegion<1>:$body);
  let hasCustomAssemblyFormat = 1;
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    ::mlir::Block &getBodyBlock() { return getBody().front(); }
    // Whether `op` may appear in the body of a kernel of this kind.
    static bool isFusible(::mlir::Operation *op, ::mt::FusionKind kind);
    // mt.layer_norm and mt.rms_norm: each output row needs its whole input row.
    static bool isRowReduction(::mlir::Operation *op);
    // The body invariants of kind gemm_grad (part of the region verifier).
    ::mlir::LogicalResult verifyGemmGrad();
  }];
}

def Mt_YieldOp : Mt_Op<"yield", [Pure, Terminator, HasParent<"FusedOp">]> {
  let summary = "the results of an `mt.fused` body";
  let description = [{
    Ends an `mt.fused` body; its operands become the op's results, in order.

    ```mlir
    mt.yield %s : tensor<4x128x64xf32>
    ```
  }];
  let arguments = (ins Variadic<AnyRankedTensor>:$values);
  let assemblyFormat = "attr-dict ($values^ `:` type($values))?";
}

#endif // MT_KERNEL_OPS_TD
