"""The whole model on a GPU from its compiled program: its kernels read from XLA's optimised HLO, priced by the
GPU model, recorded in a profile, and each layer's share of the whole.

The HLO reading is pinned on hand-written HLO text (fusions, convolutions, dots, a loop); the recording and the
prediction on a real TensorFlow profile of a small CNN whose BatchNorm and activations a compiled model fuses.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from keras_models import keras, layers
from tbs.backends.hlo_kernels import KERNEL_RULES, program_kernels, shape_bytes
from tbs.predictions.catalog import load_catalog
from tbs.predictions.gpu_predict import gpu_spec
from tbs.predictions.reference import fitted_model
from tbs.measure.in_context import layer_of
from tbs.predictions.whole import HOST_OVERHEAD_S, WHOLE_BAND, band_percent, predict_whole

FAST = dict(min_samples=3, cell_budget_seconds=0.05, min_block_seconds=0.001, min_span_seconds=0.0)

HLO = """HloModule m

%fused_relu (p0: f32[4,8,8,16], p1: f32[16]) -> f32[4,8,8,16] {
  %p0 = f32[4,8,8,16]{3,2,1,0} parameter(0)
  %p1 = f32[16]{0} parameter(1)
  %b = f32[4,8,8,16]{3,2,1,0} broadcast(%p1), dimensions={3}
  %a = f32[4,8,8,16]{3,2,1,0} add(%p0, %b)
  ROOT %r = f32[4,8,8,16]{3,2,1,0} maximum(%a, %a), metadata={op_name="model/act_1/Relu"}
}

%fused_two (p0: f32[4,8,8,16], p1: f32[3,3,16,16], p2: f32[1,1,16,32]) -> f32[4,8,8,32] {
  %p0 = f32[4,8,8,16]{3,2,1,0} parameter(0)
  %p1 = f32[3,3,16,16]{3,2,1,0} parameter(1)
  %p2 = f32[1,1,16,32]{3,2,1,0} parameter(2)
  %c = f32[4,8,8,16]{3,2,1,0} convolution(%p0, %p1), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, metadata={op_name="model/conv2_1/convolution"}
  ROOT %d = f32[4,8,8,32]{3,2,1,0} convolution(%c, %p2), window={size=1x1}, dim_labels=b01f_01io->b01f, metadata={op_name="model/conv3_1/convolution"}
}

%body (s: (s32[], f32[4,16])) -> (s32[], f32[4,16]) {
  %s = (s32[], f32[4,16]{1,0}) parameter(0)
  %h = f32[4,16]{1,0} get-tuple-element(%s), index=1
  %i = s32[] get-tuple-element(%s), index=0
  %w = f32[16,16]{1,0} constant({...})
  %step = f32[4,16]{1,0} dot(%h, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="model/rnn_1/MatMul"}
  ROOT %t = (s32[], f32[4,16]{1,0}) tuple(%i, %step)
}

%cond (s: (s32[], f32[4,16])) -> pred[] {
  %s = (s32[], f32[4,16]{1,0}) parameter(0)
  ROOT %p = pred[] constant(true)
}

ENTRY %main (x: f32[4,8,8,3], k: f32[3,3,3,16], bias: f32[16], k2: f32[3,3,16,16], k3: f32[1,1,16,32], q: f32[2,4,5,8], v: f32[2,8,6], init: (s32[], f32[4,16])) -> f32[4,8,8,32] {
  %x = f32[4,8,8,3]{3,2,1,0} parameter(0)
  %k = f32[3,3,3,16]{3,2,1,0} parameter(1)
  %bias = f32[16]{0} parameter(2)
  %k2 = f32[3,3,16,16]{3,2,1,0} parameter(3)
  %k3 = f32[1,1,16,32]{3,2,1,0} parameter(4)
  %q = f32[2,4,5,8]{3,2,1,0} parameter(5)
  %v = f32[2,8,6]{2,1,0} parameter(6)
  %init = (s32[], f32[4,16]{1,0}) parameter(7)
  %conv = f32[4,4,4,16]{3,2,1,0} convolution(%x, %k), window={size=3x3 stride=2x2 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, metadata={op_name="model/conv1_1/convolution"}
  %act = f32[4,8,8,16]{3,2,1,0} fusion(%conv, %bias), kind=kLoop, calls=%fused_relu, metadata={op_name="model/act_1/Relu"}
  %cast = f32[4,8,8,16]{3,2,1,0} bitcast(%act)
  %two = f32[4,8,8,32]{3,2,1,0} fusion(%cast, %k2, %k3), kind=kCustom, calls=%fused_two
  %attn = f32[2,4,5,6]{3,2,1,0} dot(%q, %v), lhs_batch_dims={0}, lhs_contracting_dims={3}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  %loop = (s32[], f32[4,16]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"7"}}
  ROOT %t = f32[4,8,8,32]{3,2,1,0} transpose(%two), dimensions={0,1,2,3}
}
"""


def test_an_optimised_programs_kernels_are_its_fusions_gemms_and_data_moves():
    assert shape_bytes("f32[4,16]{1,0}") == 256 and shape_bytes("(s32[], bf16[2,2]{1,0})") == 12
    kernels = program_kernels(HLO)
    assert [k["kind"] for k in kernels] == ["conv", "memory", "conv", "conv", "gemm", "gemm", "memory"]
    conv = kernels[0]  # stride 2: 4x4 output positions per image, K = 3x3 window x 3 channels
    assert (conv["m"], conv["n"], conv["k"], conv["window"], conv["stride"]) == (64, 16, 27, 9, 2)
    assert conv["bytes"] == shape_bytes("f32[4,4,4,16]") + shape_bytes("f32[4,8,8,3]") + shape_bytes("f32[3,3,3,16]")
    act = kernels[1]  # a memory pass: its operands and output, read and written once; it only follows a conv
    assert act["bytes"] == 2 * 4 * 8 * 8 * 16 * 4 - 4 * 8 * 8 * 16 * 4 + 4 * 4 * 4 * 16 * 4 + 16 * 4
    assert act["op"] == "model/act_1/Relu" and not act.get("epilogue")  # not its conv's size: not an epilogue
    # A CPU fusion that chains two convolutions: a GPU runs each as a kernel of its own, each named by its own op.
    assert [(k["k"], k["n"], k["op"]) for k in kernels[2:4]] == [(144, 16, "model/conv2_1/convolution"),
                                                                  (16, 32, "model/conv3_1/convolution")]
    attention = kernels[4]  # a batched dot: count = its batch dimensions
    assert (attention["m"], attention["n"], attention["k"], attention["count"]) == (20, 6, 8, 2)
    assert kernels[5]["repeat"] == 7 and kernels[5]["op"] == "model/rnn_1/MatMul"  # a loop's step, once per trip
    assert kernels[6]["hlo"] == "transpose"


EPILOGUES = """HloModule e

%fused_bias_gelu (p0: f32[4,8,8,16], p1: f32[16]) -> f32[4,8,8,16] {
  %p0 = f32[4,8,8,16]{3,2,1,0} parameter(0)
  %p1 = f32[16]{0} parameter(1)
  %b = f32[4,8,8,16]{3,2,1,0} broadcast(%p1), dimensions={3}
  %a = f32[4,8,8,16]{3,2,1,0} add(%p0, %b)
  %half = f32[] constant(0.5)
  %h = f32[4,8,8,16]{3,2,1,0} broadcast(%half), dimensions={}
  %s = f32[4,8,8,16]{3,2,1,0} multiply(%a, %h)
  %e = f32[4,8,8,16]{3,2,1,0} erf(%s)
  ROOT %g = f32[4,8,8,16]{3,2,1,0} multiply(%a, %e)
}

%fused_batchnorm (p0: f32[4,8,8,16], p1: f32[16], p2: f32[16], p3: f32[16]) -> f32[4,8,8,16] {
  %p0 = f32[4,8,8,16]{3,2,1,0} parameter(0)
  %p1 = f32[16]{0} parameter(1)
  %p2 = f32[16]{0} parameter(2)
  %p3 = f32[16]{0} parameter(3)
  %r = f32[16]{0} rsqrt(%p2)
  %g = f32[16]{0} multiply(%r, %p3)
  %gb = f32[4,8,8,16]{3,2,1,0} broadcast(%g), dimensions={3}
  %mb = f32[4,8,8,16]{3,2,1,0} broadcast(%p1), dimensions={3}
  %c = f32[4,8,8,16]{3,2,1,0} subtract(%p0, %mb)
  %n = f32[4,8,8,16]{3,2,1,0} multiply(%c, %gb)
  %zero = f32[] constant(0)
  %z = f32[4,8,8,16]{3,2,1,0} broadcast(%zero), dimensions={}
  ROOT %o = f32[4,8,8,16]{3,2,1,0} maximum(%n, %z), metadata={op_name="model/bn_1/FusedBatchNormV3"}
}

%fused_row_scale (p0: f32[4,8,8,16], p1: f32[4,8,8]) -> f32[4,8,8,16] {
  %p0 = f32[4,8,8,16]{3,2,1,0} parameter(0)
  %p1 = f32[4,8,8]{2,1,0} parameter(1)
  %b = f32[4,8,8,16]{3,2,1,0} broadcast(%p1), dimensions={0,1,2}
  ROOT %d = f32[4,8,8,16]{3,2,1,0} divide(%p0, %b)
}

ENTRY %main (x: f32[4,8,8,16], k: f32[1,1,16,16], v: f32[16], w: f32[16,16], sums: f32[4,8,8]) -> f32[4,8,8,16] {
  %x = f32[4,8,8,16]{3,2,1,0} parameter(0)
  %k = f32[1,1,16,16]{3,2,1,0} parameter(1)
  %v = f32[16]{0} parameter(2)
  %one = f32[4,8,8,16]{3,2,1,0} convolution(%x, %k), window={size=1x1}, dim_labels=b01f_01io->b01f
  %gelu = f32[4,8,8,16]{3,2,1,0} fusion(%one, %v), kind=kLoop, calls=%fused_bias_gelu
  %two = f32[4,8,8,16]{3,2,1,0} convolution(%gelu, %k), window={size=1x1}, dim_labels=b01f_01io->b01f
  %bn = f32[4,8,8,16]{3,2,1,0} fusion(%two, %v, %v, %v), kind=kLoop, calls=%fused_batchnorm
  %w = f32[16,16]{1,0} parameter(3)
  %sums = f32[4,8,8]{2,1,0} parameter(4)
  %three = f32[4,8,8,16]{3,2,1,0} dot(%bn, %w), lhs_contracting_dims={3}, rhs_contracting_dims={0}
  %scaled = f32[4,8,8,16]{3,2,1,0} fusion(%three, %v, %v, %v), kind=kLoop, calls=%fused_batchnorm
  %four = f32[4,8,8,16]{3,2,1,0} dot(%scaled, %w), lhs_contracting_dims={3}, rhs_contracting_dims={0}
  ROOT %rows = f32[4,8,8,16]{3,2,1,0} fusion(%four, %sums), kind=kLoop, calls=%fused_row_scale
}
"""


def test_a_bias_and_activation_fold_into_their_gemm_and_a_batchnorms_per_channel_scale_does_not():
    # cuDNN's fused convolution and cuBLASLt's epilogues add a per-feature bias and scale by a scalar; a
    # BatchNorm's per-feature scale after a convolution or a dot stays a pass of its own on a GPU (as XLA:GPU
    # compiled ResNet-50 for an H200); a scale per row (a softmax's sums) is not per feature.
    kernels = program_kernels(EPILOGUES)
    assert [(k["kind"], bool(k.get("epilogue"))) for k in kernels] == [
        ("conv", False), ("memory", True), ("conv", False), ("memory", False), ("gemm", False), ("memory", False),
        ("gemm", False), ("memory", True)]


def test_the_whole_program_is_priced_with_epilogues_folded_and_each_kernel_has_a_layer():
    t4 = gpu_spec(load_catalog()["t4"])
    kernels = program_kernels(HLO)
    kernels[1]["epilogue"] = True
    folded = predict_whole(kernels, t4, "fp32", fitted_model(), host_overhead_s=1e-3)
    unfolded = predict_whole(kernels, t4, "fp32", fitted_model(), host_overhead_s=1e-3, fold_epilogues=False)
    assert folded.seconds == pytest.approx(1e-3 + folded.kernel_seconds.sum())
    assert unfolded.seconds > folded.seconds and len(folded.kernels) == len(kernels) - 1
    assert folded.counts() == {"conv": 3, "gemm": 8, "memory": 1}
    assert layer_of("functional_1/conv2d_3/convolution", ["conv2d", "conv2d_3"]) == "conv2d_3"
    assert layer_of("model/block_1/attention_1/query/MatMul", ["block", "attention"]) == "attention"
    assert layer_of("XLA_Args", ["conv2d"]) is None


def test_a_programs_kernels_pay_the_back_to_back_launch_interval_at_the_clock_a_gpu_sustains():
    from tbs.predictions.whole import HOST_OVERHEAD_S, KERNEL_S, TF32_EFFICIENCY

    t4 = gpu_spec(load_catalog()["t4"])
    model = fitted_model()
    tiny = [{"kind": "memory", "bytes": 64.0, "flops": 0.0}] * 100  # launch-bound: each costs the launch interval
    found = predict_whole(tiny, t4, "fp32", model)
    assert KERNEL_S < model.launch_s / 2  # not the GPU model's isolated kernel, timed alone between CUDA events
    assert found.seconds - HOST_OVERHEAD_S == pytest.approx(100 * KERNEL_S, rel=0.3)
    # A large GEMM is compute-bound: at the base clock (the steady state) it takes boost / base as long as at boost.
    gemm = [{"kind": "gemm", "m": 4096, "n": 4096, "k": 4096, "count": 1, "flops": 2.0 * 4096 ** 3,
             "bytes": 3 * 4096 ** 2 * 4.0}]
    base, boost = (predict_whole(gemm, t4, "fp32", model, 0.0, kernel_s=0.0, sustained_clock=c).seconds
                   for c in (0.0, 1.0))
    assert base / boost == pytest.approx(t4.boost_clock_hz / t4.base_clock_hz, rel=1e-6)
    assert predict_whole(gemm, t4, "fp32", model, 0.0, kernel_s=0.0).seconds == pytest.approx(base)  # shipped: base
    # TF32 tensor-core work runs at the share of its peak the published stacks reached; FP16 and FP32 are untouched.
    a100 = gpu_spec(load_catalog()["a100-40gb"])
    full, shipped = (predict_whole(gemm, a100, "tf32", model, 0.0, kernel_s=0.0, tf32_efficiency=e).seconds
                     for e in (1.0, TF32_EFFICIENCY))
    assert TF32_EFFICIENCY < 1.0 and shipped / full == pytest.approx(1.0 / TF32_EFFICIENCY, rel=0.05)
    assert predict_whole(gemm, a100, "fp16", model, 0.0, tf32_efficiency=0.5).seconds == pytest.approx(
        predict_whole(gemm, a100, "fp16", model, 0.0).seconds)


GRADIENT_HLO = """HloModule g

ENTRY %main (x: f32[2,32,32,16], k: f32[3,3,16,32], xt: f32[16,32,32,2], dyt: f32[16,16,2,32]) -> f32[16,3,3,32] {
  %x = f32[2,32,32,16]{3,2,1,0} parameter(0)
  %k = f32[3,3,16,32]{3,2,1,0} parameter(1)
  %xt = f32[16,32,32,2]{3,2,1,0} parameter(2)
  %dyt = f32[16,16,2,32]{3,2,1,0} parameter(3)
  %y = f32[2,16,16,32]{3,2,1,0} convolution(%x, %k), window={size=3x3 stride=2x2 pad=0_1x0_1}, dim_labels=b01f_01io->b01f
  ROOT %dw = f32[16,3,3,32]{3,2,1,0} convolution(%xt, %dyt), window={size=16x16 pad=0_1x0_1 rhs_dilate=2x2}, dim_labels=b01f_01io->b01f
}
"""


def test_a_weights_gradient_convolution_is_priced_as_its_forwards_weight_gradient_not_as_a_huge_window():
    """XLA writes a convolution's weights' gradient as a convolution whose kernel is the output's gradient (a
    16x16 window, the batch as its 2 input channels): priced as that, it had no split-K and no tensor cores (2
    channels) and a U-Net train step's first filter gradient took 11 ms on an A100 (0.4 GFLOP). It is recorded as
    the forward convolution it differentiates and priced as the GPU model prices a layer's weight gradient."""
    from tbs.predictions.gpu_model import frame_of, predict_frame
    from tbs.predictions.whole import program_model
    from tbs.predictions.work import CONV, Work

    forward, gradient = program_kernels(GRADIENT_HLO)
    assert (forward["m"], forward["n"], forward["k"], forward["window"], forward["stride"]) == (512, 32, 144, 9, 2)
    assert "gradient" not in forward
    assert gradient["gradient"] == "weights" and gradient["flops"] == forward["flops"]
    assert (gradient["m"], gradient["n"], gradient["k"], gradient["window"], gradient["stride"], gradient["channels"]) \
        == (512, 32, 144, 9, 2, 16)  # the forward's GEMM: M = batch x positions, K = 3x3 x 16 input channels
    a100, model = gpu_spec(load_catalog()["a100-40gb"]), fitted_model()
    found = predict_whole([gradient], a100, "fp16", model, host_overhead_s=0.0)
    layer = Work(CONV, gradient["flops"], gradient["bytes"], m=512, n=32, k=144, window=9, stride=2,
                 phase="backward_weight")
    expected = predict_frame(frame_of([layer], ["fp16"], [a100]), program_model(model))[0]
    assert found.seconds == pytest.approx(expected)


RECOMPUTE_HLO = """HloModule r

%norm (p0: f32[64,128], p1: f32[64,128]) -> f32[64,128] {
  %p0 = f32[64,128]{1,0} parameter(0)
  %p1 = f32[64,128]{1,0} parameter(1)
  ROOT %sum = f32[64,128]{1,0} add(%p0, %p1), metadata={op_name="model/residual_1/add"}
}

%again (p0: f32[64,128], p1: f32[64,128], p2: f32[64,128]) -> f16[64,128] {
  %p0 = f32[64,128]{1,0} parameter(0)
  %p1 = f32[64,128]{1,0} parameter(1)
  %p2 = f32[64,128]{1,0} parameter(2)
  %sum.1 = f32[64,128]{1,0} add(%p0, %p1), metadata={op_name="model/residual_1/add"}
  %next = f32[64,128]{1,0} add(%sum.1, %p2), metadata={op_name="model/residual_2/add"}
  ROOT %cast = f16[64,128]{1,0} convert(%next), metadata={op_name="model/residual_2/Cast"}
}

ENTRY %main (a: f32[64,128], b: f32[64,128], c: f32[64,128]) -> (f32[64,128], f16[64,128]) {
  %a = f32[64,128]{1,0} parameter(0)
  %b = f32[64,128]{1,0} parameter(1)
  %c = f32[64,128]{1,0} parameter(2)
  %first = f32[64,128]{1,0} fusion(%a, %b), kind=kLoop, calls=%norm
  %second = f16[64,128]{1,0} fusion(%a, %b, %c), kind=kLoop, calls=%again
  ROOT %t = (f32[64,128]{1,0}, f16[64,128]{1,0}) tuple(%first, %second)
}
"""


def test_a_fusion_that_recomputes_an_earlier_kernels_value_reads_it_instead_as_a_gpus_fusion_would():
    """The CPU's fusion copied the first kernel's add into the second, which then reads both of its inputs; a GPU's
    fusion weighs that against reading the add's output once and does what reads less. In a half-precision BERT
    the copies chain through every layer (fusions of up to 74 operands)."""
    first, second = program_kernels(RECOMPUTE_HLO)
    tensor = 64 * 128 * 4
    assert first["bytes"] == 3 * tensor
    assert second["bytes"] == 2 * tensor + 64 * 128 * 2  # reads the sum and c, writes float16
    assert program_kernels(RECOMPUTE_HLO.replace('op_name="model/residual_1/add"}\n  %next',
                                                 'op_name="model/other/add"}\n  %next'))[1]["bytes"] == (
        3 * tensor + 64 * 128 * 2)  # not the same value: computed here from its inputs


GPU_HLO = """HloModule gpu

%lookup (p0: f32[30522,768], p1: s32[128,1]) -> f16[128,1,768] {
  %p0 = f32[30522,768]{1,0} parameter(0)
  %p1 = s32[128,1]{1,0} parameter(1)
  %half = f16[30522,768]{1,0} convert(%p0), metadata={op_name="model/embeddings/convert_element_type"}
  ROOT %rows = f16[128,1,768]{2,1,0} gather(%half, %p1), offset_dims={1,2}, collapsed_slice_dims={}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,768}, metadata={op_name="model/embeddings/gather"}
}

%scaled (p0: f32[30522,768]) -> f32[30522,768] {
  %p0 = f32[30522,768]{1,0} parameter(0)
  ROOT %twice = f32[30522,768]{1,0} add(%p0, %p0), metadata={op_name="model/table/add"}
}

ENTRY %main (table: f32[30522,768], ids: s32[128,1], w: f16[768,768]) -> (f16[128,768], f32[128,1,768], f32[30522,768]) {
  %table = f32[30522,768]{1,0} parameter(0)
  %ids = s32[128,1]{1,0} parameter(1)
  %w = f16[768,768]{1,0} parameter(2)
  %looked = f16[128,1,768]{2,1,0} fusion(%table, %ids), kind=kLoop, calls=%lookup
  %x = f16[128,768]{1,0} bitcast(%looked)
  %mm = (f16[128,768]{1,0}, s8[4194304]{0}) custom-call(%x, %w), custom_call_target="__cublas$lt$matmul", metadata={op_name="model/dense/dot_general"}, backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
  %out = f16[128,768]{1,0} get-tuple-element(%mm), index=0
  %plain = f32[128,1,768]{2,1,0} gather(%table, %ids), offset_dims={1,2}, collapsed_slice_dims={}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,768}, metadata={op_name="model/plain/gather"}
  %whole = f32[30522,768]{1,0} fusion(%table), kind=kLoop, calls=%scaled
  ROOT %t = (f16[128,768]{1,0}, f32[128,1,768]{2,1,0}, f32[30522,768]{1,0}) tuple(%out, %plain, %whole)
}
"""


def test_a_gather_reads_its_rows_not_its_table_and_a_library_call_streams_no_workspace():
    """An embedding lookup (fused with the table's cast, as XLA:GPU compiles it, or on its own, as a CPU does) reads
    the 128 rows it gathers, not the 94 MB table; a cuBLAS call's result carries XLA:GPU's 4 MB scratch
    workspace, which is not streamed. A fusion that reads the whole table still pays for all of it."""
    fused, gemm, plain, whole = program_kernels(GPU_HLO)
    rows, table = 128 * 768, 30522 * 768
    assert fused["kind"] == "memory" and fused["bytes"] == rows * 4 + 128 * 4 + rows * 2
    assert plain["bytes"] == rows * 4 + 128 * 4 + rows * 4
    assert gemm["kind"] == "gemm" and (gemm["m"], gemm["n"], gemm["k"]) == (128, 768, 768)
    assert gemm["bytes"] == 2 * rows * 2 + 768 * 768 * 2  # reads x and w, writes its result
    assert whole["bytes"] == 2 * table * 4


POOLED_HLO = """HloModule pooled

%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a, %b)
}

%fused_pool_conv (p0: f32[8,32,32,16], p1: f32[16], p2: f32[3,3,16,32], p3: f32[1,1,32,32]) -> f32[8,16,16,32] {
  %p0 = f32[8,32,32,16]{3,2,1,0} parameter(0)
  %p1 = f32[16]{0} parameter(1)
  %p2 = f32[3,3,16,32]{3,2,1,0} parameter(2)
  %p3 = f32[1,1,32,32]{3,2,1,0} parameter(3)
  %b = f32[8,32,32,16]{3,2,1,0} broadcast(%p1), dimensions={3}
  %a = f32[8,32,32,16]{3,2,1,0} add(%p0, %b)
  %z = f32[] constant(0)
  %relu = f32[8,32,32,16]{3,2,1,0} maximum(%a, %a)
  %pool = f32[8,16,16,16]{3,2,1,0} reduce-window(%relu, %z), window={size=1x2x2x1 stride=1x2x2x1}, to_apply=%max, metadata={op_name="model/pool_1/MaxPool"}
  %c = f32[8,16,16,32]{3,2,1,0} convolution(%pool, %p2), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, metadata={op_name="model/conv2_1/convolution"}
  ROOT %d = f32[8,16,16,32]{3,2,1,0} convolution(%c, %p3), window={size=1x1}, dim_labels=b01f_01io->b01f, metadata={op_name="model/conv3_1/convolution"}
}

ENTRY %main (x: f32[8,32,32,16], bias: f32[16], k2: f32[3,3,16,32], k3: f32[1,1,32,32]) -> f32[8,16,16,32] {
  %x = f32[8,32,32,16]{3,2,1,0} parameter(0)
  %bias = f32[16]{0} parameter(1)
  %k2 = f32[3,3,16,32]{3,2,1,0} parameter(2)
  %k3 = f32[1,1,32,32]{3,2,1,0} parameter(3)
  ROOT %f = f32[8,16,16,32]{3,2,1,0} fusion(%x, %bias, %k2, %k3), kind=kOutput, calls=%fused_pool_conv
}
"""


def test_a_pooling_a_cpu_fuses_into_the_next_convolution_is_a_pass_of_its_own_as_a_gpu_runs_it():
    """XLA's CPU backend computes a max-pooling (and the bias and ReLU before it) inside the convolution that reads
    it; cuDNN reads a materialised input, so a GPU pools first, in a pass of its own (XLA:GPU compiled
    cnn_flowers so for the H200). The second convolution reads the first's output: no pass before it."""
    pooled, first, second = program_kernels(POOLED_HLO)
    assert pooled["kind"] == "memory" and pooled["producer"] and pooled["op"] == "model/pool_1/MaxPool"
    assert pooled["bytes"] == 8 * 32 * 32 * 16 * 4 + 8 * 16 * 16 * 16 * 4  # reads the activations, writes the pool
    assert (first["kind"], first["op"], second["op"]) == ("conv", "model/conv2_1/convolution",
                                                          "model/conv3_1/convolution")
    assert not pooled.get("epilogue") and KERNEL_RULES == 3
    # A profile recorded before this rule says so where its model pools; one without pooling reads the same
    from types import SimpleNamespace

    from tbs.predictions.gpu_predict import _older_kernels

    def profile(rules, *types):
        return SimpleNamespace(meta=SimpleNamespace(kernel_rules=rules), layers=[SimpleNamespace(type=t) for t in types])

    assert "left a pooling inside" in _older_kernels(profile(2, "Conv2D", "MaxPooling2D"))
    assert _older_kernels(profile(2, "Conv2D", "BatchNormalization")) == ""
    both = _older_kernels(profile(1, "BatchNormalization", "GlobalAveragePooling2D"))
    assert "folded a BatchNorm" in both and "and left a pooling" in both
    assert _older_kernels(profile(3, "MaxPooling2D")) == ""


CUDNN_HLO = """HloModule cudnn

ENTRY %main (x: f16[8,32,32,16], w: f16[64,3,3,16], dy: f16[8,16,16,64]) -> (f16[8,16,16,64], f16[8,32,32,16], f16[64,3,3,16]) {
  %x = f16[8,32,32,16]{3,2,1,0} parameter(0)
  %w = f16[64,3,3,16]{3,2,1,0} parameter(1)
  %dy = f16[8,16,16,64]{3,2,1,0} parameter(2)
  %f = (f16[8,16,16,64]{3,2,1,0}, u8[0]{0}) custom-call(%x, %w), window={size=3x3 stride=2x2 pad=0_1x0_1}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convForward", metadata={op_name="jit(step)/conv/conv_general_dilated"}
  %i = (f16[8,32,32,16]{3,2,1,0}, u8[65536]{0}) custom-call(%dy, %w), window={size=3x3 stride=2x2 pad=0_1x0_1}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convBackwardInput", metadata={op_name="jit(step)/transpose(jvp(conv))/conv_general_dilated"}
  %g = (f16[64,3,3,16]{3,2,1,0}, u8[0]{0}) custom-call(%x, %dy), window={size=3x3 stride=2x2 pad=0_1x0_1}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convBackwardFilter", metadata={op_name="jit(step)/transpose(jvp(conv))/conv_general_dilated"}
  %f0 = f16[8,16,16,64]{3,2,1,0} get-tuple-element(%f), index=0
  %i0 = f16[8,32,32,16]{3,2,1,0} get-tuple-element(%i), index=0
  %g0 = f16[64,3,3,16]{3,2,1,0} get-tuple-element(%g), index=0
  ROOT %t = (f16[8,16,16,64]{3,2,1,0}, f16[8,32,32,16]{3,2,1,0}, f16[64,3,3,16]{3,2,1,0}) tuple(%f0, %i0, %g0)
}
"""


def test_a_gpu_compiles_cudnn_calls_are_its_convolution_and_both_gradients_each_with_the_forwards_flops():
    """XLA:GPU writes a convolution's forward and both gradients as cuDNN calls that all keep the forward's
    dim_labels; which operand is which depends on the call. Each is read as the GEMM it runs: the forward's, the
    data gradient's (every input position, the stride's zeros skipped), the filter gradient as its forward
    marked as a weights' gradient, all three the forward's FLOPs, none streaming its workspace."""
    forward, data, weights = program_kernels(CUDNN_HLO)
    flops = 2.0 * 8 * 16 * 16 * 64 * 9 * 16
    assert (forward["m"], forward["n"], forward["k"], forward["stride"], forward["channels"]) == (2048, 64, 144, 2, 16)
    assert (data["m"], data["n"], data["k"], data["window"], data["channels"]) == (8 * 32 * 32, 16, 2 * 64, 2, 64)
    assert (weights["m"], weights["n"], weights["k"], weights.get("gradient")) == (2048, 64, 144, "weights")
    assert forward["flops"] == weights["flops"] == flops and data["flops"] == pytest.approx(flops)
    x, w, dy = 8 * 32 * 32 * 16 * 2, 64 * 9 * 16 * 2, 8 * 16 * 16 * 64 * 2
    assert forward["bytes"] == data["bytes"] == weights["bytes"] == x + w + dy


def test_a_deviceless_gpu_compile_reads_as_the_program_the_gpu_compiled_for_itself():
    """tests/programs/: keras.applications ResNet-50 at batch 32 compiled on a CPU-only machine for a described
    H200 (benchmarks/gpu_programs.py); profiles/h200/resnet50 keeps the kernels of the program the H200 machine
    compiled for itself when it measured it. Read here, the two are the same program: its cuDNN calls the same
    convolutions, its memory passes the same bytes."""
    import gzip
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    here = program_kernels(gzip.decompress((root / "tests/programs/h200-resnet50-32-fp32.hlo.gz").read_bytes()).decode())
    rows = pd.read_csv(root / "profiles/h200/resnet50/inference/analysis.csv")
    own = json.loads(rows[(rows["target"] == "model") & (rows["batch_size"] == 32)]["kernels"].iloc[0])
    convolutions = [sorted((k["m"], k["n"], k["k"]) for k in program if k["kind"] == "conv") for program in (own, here)]
    assert len(convolutions[0]) == 53 and convolutions[0] == convolutions[1]
    memory = [sum(k["bytes"] for k in program if k["kind"] == "memory") for program in (own, here)]
    assert memory[1] == pytest.approx(memory[0], rel=1e-3)
    assert sum(k["flops"] for k in here) == pytest.approx(sum(k["flops"] for k in own))


def test_a_profile_records_its_whole_program_and_a_gpu_is_predicted_from_it(tmp_path):
    import tbs

    inputs = keras.Input((16, 16, 8), name="x")
    x = inputs
    for index in range(2):
        x = layers.Conv2D(8, 3, padding="same", name=f"conv{index}")(x)
        x = layers.BatchNormalization(name=f"norm{index}")(x)
        x = layers.ReLU(name=f"relu{index}")(x)
    model = keras.Model(inputs, layers.Add(name="add")([inputs, x]))
    p = tbs.profile(model, [8], devices="cpu", timing=tbs.TimingConfig(**FAST), progress=None, report=False,
                    out=tmp_path / "p")
    whole_cell = p.analysis[p.analysis["target"] == "model"].iloc[0]
    kinds = [k["kind"] for k in json.loads(whole_cell["kernels"])]
    assert kinds.count("conv") == 2 and 2 <= kinds.count("memory") < 6  # each BatchNorm + ReLU pair: one pass
    loaded = tbs.load(tmp_path / "p")
    rows = tbs.predict(loaded, "t4").predictions
    whole = rows[rows["target"] == "model"].iloc[0]
    assert whole["method"].startswith("GPU model of the fused whole-model program: 2 convolutions")
    layer_rows = rows[rows["target"] == "layer"]
    summed = layer_rows["median_s"].sum()
    assert f"the sum of the isolated layers' predictions: {summed * 1e3:.3g} ms" in whole["method"]
    assert whole["method"].endswith("; 95% band")  # wider than a layer's 90%: benchmarks/whole_model.md
    # What a profile measures as the whole model: the program per call, its dispatch apart (an H200's measured
    # whole models read up to 40x under predictions that added a framework step's host overhead)
    assert whole["median_s"] < HOST_OVERHEAD_S / 10 and f"about {HOST_OVERHEAD_S * 1e3:.2g} ms outside" in whole["method"]
    assert (whole["low_s"] / whole["median_s"], whole["high_s"] / whole["median_s"]) == pytest.approx(WHOLE_BAND)
    shares = pd.to_numeric(layer_rows.set_index("layer")["model_share"])
    assert shares["conv0"] > 0 and shares.sum() <= 1.0 + 1e-9  # each layer's kernels inside the whole
    assert (layer_rows["median_s"] > 0).all()  # the isolated per-layer predictions stay
    predicted = tbs.predict(loaded, "t4")
    text = tbs.render(predicted, "predicted")
    assert "t4 share of model" in text and "whole model time per sample [95% band]" in text
    page = tbs.render(predicted, "html")
    assert "t4 share of model" in page and "GPU model of the fused whole-model program</li>" in page
    # A profile whose kernels an older tbs read (no kernel_rules: a BatchNorm folded into its convolution) says so
    assert loaded.meta.kernel_rules == KERNEL_RULES
    older = dict(loaded.metadata)
    del older["kernel_rules"]
    old = tbs.predict(loaded.__class__(**{**loaded.__dict__, "metadata": older}), "t4").predictions
    assert "recorded by an older tbs" in old[old["target"] == "model"].iloc[0]["method"]
    assert "older tbs" not in whole["method"]
    without = tbs.predict(loaded.__class__(**{**loaded.__dict__, "analysis": loaded.analysis.drop(columns="kernels")}),
                          "t4").predictions
    fallback = without[without["target"] == "model"].iloc[0]
    assert fallback["median_s"] == pytest.approx(summed) and "the sum of the layers' predictions" in fallback["method"]


def test_the_published_whole_model_rows_name_their_source_precision_and_licence_and_classifiers_are_marked():
    from pathlib import Path

    table = pd.read_csv(Path(__file__).resolve().parent.parent / "tbs/predictions/reference/whole_models.csv")
    assert set(table["precision"]) == {"fp16", "fp32", "tf32"} and (table["latency_s"] > 0).all()
    assert table[["source_path", "commit", "table", "license"]].notna().all().all()
    assert set(table.loc[table["classifier"], "family"]) == {"resnet50"}  # the independent check, never fitted
    bert = table.query("model == 'bert_base' and device == 't4' and precision == 'fp32' and sequence_length == 128"
                       " and framework.str.contains('TF1')", engine="python")
    assert bert.set_index("batch_size")["latency_s"][1] == pytest.approx(18.80e-3)  # the table's 90th percentile
    tf2 = table[table["source_path"] == "TensorFlow2/LanguageModeling/BERT/README.md"]  # the model from the label
    assert set(tf2["device"]) == {"a100-80gb", "t4", "v100"} and set(tf2["model"]) == {"bert_base", "bert_large"}
    first = tf2.iloc[0]  # DGX-1 V100 16GB, "BERT-LARGE FP16", 128 tokens, batch 1: 9.67 ms at the 90th percentile
    assert (first["model"], first["precision"], first["latency_s"]) == ("bert_large", "fp16", pytest.approx(9.67e-3))


def test_the_shipped_whole_model_band_is_the_benchmarks_and_says_where_it_meets_the_target():
    """WHOLE_BAND is the 2.5th-97.5th percentile of the held-out residuals benchmarks/whole_model.py wrote; on
    those rows the A100 40GB, the A100 80GB and the V100 meet issue 30's target (median error <= 25%, >= 85% inside
    the 95% band), where a 90% band from the same residuals does not everywhere. The T4 misses the median (26%)
    because NVIDIA's TF1 and TF2 tables of the same T4 configurations disagree by 1.7x at the median (one value per
    configuration at their geometric mean would have a 31% median error): against its TF1 table alone the T4 meets
    the target. The A100 80GB met it only once the clock was fixed at base: left free, the fit without BERT-base
    traded it against the launch and host constants (0.8 us, 4.9 ms) and read BERT-base 1.6x slow there."""
    import numpy as np
    from pathlib import Path

    rows = pd.read_csv(Path(__file__).resolve().parent.parent / "benchmarks/rows/whole_model.csv")
    fitted = rows[~rows["classifier"]]
    residual = np.log(fitted["latency_s"] / fitted["predicted_s"])
    assert tuple(np.round(np.exp(np.quantile(residual, [0.025, 0.975])), 2)) == pytest.approx(WHOLE_BAND)
    assert (fitted["sustained_clock"] == 0.0).all() and (fitted["kernel_s"] >= 3e-6).all()  # no held-out fit degenerate
    per_gpu = fitted.groupby("device")
    covered, median = per_gpu["covered"].mean(), np.expm1(per_gpu["log_error"].apply(lambda e: np.median(np.abs(e))))
    meets = covered.index.isin(["a100-40gb", "a100-80gb", "v100"])
    assert meets.sum() == 3 and (covered[meets] >= 0.85).all() and (median[meets] <= 0.25).all()
    assert covered["t4"] >= 0.85 and 0.25 < median["t4"] <= 0.32
    t4 = fitted[fitted["device"] == "t4"]
    tf1 = t4[t4["framework"].str.contains("TF1")]
    assert len(tf1) == 32 and tf1["covered"].all() and np.median(np.abs(tf1["log_error"])) <= np.log(1.25)
    published = t4.groupby(["model", "precision", "sequence_length", "batch_size"])["latency_s"]
    assert (published.size() == 2).all() and np.median(published.max() / published.min()) > 1.6
    assert (per_gpu["covered_90"].mean() < 0.85).any()
    assert fitted["covered"].mean() == pytest.approx(0.95, abs=0.02)  # calibrated over all rows
    assert band_percent(["GPU model of the fused whole-model program: 3 GEMMs; 95% band"]) == "95%"
    assert band_percent(["GPU model (NeuSight-style)", None]) == "90%"
    assert band_percent(["GPU model of the fused whole-model program", "roofline scaling"]) == "95%/90%"


def test_the_published_training_rows_are_one_gpu_steps_with_their_optimizer_precision_and_licence():
    """whole_training.csv: the 1-GPU rows of NVIDIA's training tables, each step batch / throughput."""
    from pathlib import Path

    table = pd.read_csv(Path(__file__).resolve().parent.parent / "tbs/predictions/reference/whole_training.csv")
    assert set(table["precision"]) == {"fp16", "fp32", "tf32"} and table["xla"].all()
    assert table[["source_path", "commit", "table", "license", "optimizer"]].notna().all().all()
    assert table["step_s"].to_numpy() == pytest.approx((table["batch_size"] / table["throughput_per_s"]).to_numpy())
    assert set(table["model"]) == {"bert_large", "unet_medical", "resnet50"}  # no pre-training (LAMB) rows
    assert set(table.loc[table["classifier"], "model"]) == {"resnet50"}
    row = table.query("device == 'v100' and precision == 'fp16' and batch_size == 24 and throughput_per_s > 55")
    assert len(row) == 1 and row["framework"].iloc[0].startswith("TensorFlow 20.06 (TF1)")  # DGX-2's SQuAD table
    tf2_a100 = table.query("device == 'a100-80gb' and model == 'bert_large'").set_index("precision")
    assert tf2_a100.loc["tf32", ["batch_size", "throughput_per_s"]].tolist() == [38, 43.9]  # "mixed precision, TF32"
    resnet = table.query("model == 'resnet50' and device == 'v100' and precision == 'fp32'")
    assert sorted(resnet["throughput_per_s"]) == [412.0, 432.0] and set(resnet["batch_size"]) == {128}
    unet = table.query("model == 'unet_medical' and device == 'a100-80gb' and batch_size == 8").set_index("precision")
    assert unet.loc["fp16", "throughput_per_s"] == 141.03 and unet.loc["tf32", "throughput_per_s"] == 63.33


def test_a_train_steps_whole_model_prediction_says_its_band_was_fitted_on_inference():
    """Training's whole-model rows use the inference-fitted constants and band, which read slow against published
    training runs (benchmarks/whole_training.md): the method says so; inference's does not."""
    from types import SimpleNamespace

    from tbs.predictions.gpu_predict import _fused_row

    kernels = json.dumps([{"kind": "gemm", "m": 64, "n": 64, "k": 64, "count": 1, "flops": 2 * 64 ** 3,
                           "bytes": 3 * 4 * 64 * 64, "op": "m/dense/MatMul"}])
    spec, model = gpu_spec(load_catalog()["t4"]), fitted_model()
    for mode in ("inference", "training"):
        profile = SimpleNamespace(analysis=pd.DataFrame([{"target": "model", "device": "cpu:0", "mode": mode,
                                                         "batch_size": 4, "kernels": kernels}]),
                                  meta=SimpleNamespace(kernel_rules=KERNEL_RULES))
        summed = {"batch_size": 4, "mode": mode, "median_s": 1e-4, "method": "sum"}
        row = _fused_row(profile, "cpu:0", summed, [], spec, "fp32", model)
        assert ("fitted on inference" in row["method"]) == (mode == "training"), row["method"]


def _benchmark_module(name: str):
    """A benchmarks/ module by path (benchmarks is not a package)."""
    import importlib.util
    from pathlib import Path

    import sys

    folder = Path(__file__).resolve().parent.parent / "benchmarks"
    if str(folder) not in sys.path:  # a benchmark module imports its siblings by name
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_train_steps_kernels_extrapolated_in_batch_keep_the_optimizers_update_and_never_go_negative():
    """Batch 1 and 2 programs order their kernels differently: the optimizer's update of every variable carries one
    op name, and an unnamed layout pass may be split into more kernels at batch 2. Extrapolated to batch 24, the
    update stays what both programs have (it once grew with the batch: BERT-large's AdamW read 52.8 GB at batch
    24 where every compiled batch has 13.9), every activation pass grows affinely, and no kernel goes negative."""
    steps = _benchmark_module("whole_train_steps")

    def memory(op: str, nbytes: float) -> dict:
        return {"kind": "memory", "op": op, "bytes": nbytes, "flops": nbytes / 4}

    update = [memory("adam_w/AssignAddVariableOp", b) for b in (4e6, 16e6, 64e6)]
    one = [memory("dense/Relu", 1e3), *update, memory("", 5e3), memory("softmax/Exp", 2e3), memory("softmax/Sum", 9e2)]
    two = [update[2], memory("softmax/Sum", 1.8e3), update[1], memory("dense/Relu", 2e3), update[0], memory("", 4e3),
           memory("", 6e3), memory("softmax/Exp", 4e3)]
    grown = steps.aligned(one, two, 24)
    total = lambda op: sum(k["bytes"] for k in grown if k["op"] == op)  # noqa: E731
    assert total("adam_w/AssignAddVariableOp") == 84e6 and len(grown) == len(two)
    assert total("dense/Relu") == 24e3 and total("softmax/Exp") == 48e3
    assert total("softmax/Sum") == pytest.approx(21.6e3)
    assert total("") == pytest.approx(5e3 + (10e3 - 5e3) * 23)  # the split pass: its totals extrapolated together
    assert min(k["bytes"] for k in grown) > 0


def test_a_recurrent_layer_in_the_whole_model_is_priced_as_its_gpu_kernel_not_the_cpu_programs_loop():
    from tbs.predictions.whole import without_layers
    names = ["lstm", "dense"]
    kernels = [{"kind": "memory", "bytes": 1e6, "op": "jit(pure)/m/lstm/transpose"},
               {"kind": "memory", "bytes": 8.0, "op": ""},  # before the loop: not the loop's own
               {"kind": "gemm", "m": 32, "n": 512, "k": 128, "flops": 4e6, "bytes": 3e5, "repeat": 300,
                "op": "jit(pure)/m/lstm/while/body/closed_call/lstm_cell/dot_general"},
               {"kind": "memory", "bytes": 8.0, "op": "", "repeat": 300},  # the loop's counter: no layer's name
               {"kind": "memory", "bytes": 9e6, "op": "jit(pure)/m/lstm/while/body/dynamic_update_slice", "repeat": 300},
               {"kind": "gemm", "m": 32, "n": 1, "k": 128, "flops": 8e3, "bytes": 1e4, "op": "jit(pure)/m/dense/dot"},
               {"kind": "memory", "bytes": 8.0, "op": "", "repeat": 4}]  # another loop's, after another layer's
    kept = without_layers(kernels, ["lstm"], names)
    assert kept == [kernels[1], kernels[5], kernels[6]]
    assert without_layers(kernels, [], names) == kernels
    import tbs
    from conftest import ROOT
    predicted = tbs.predict(ROOT / "profiles" / "cpu" / "rnn_sa" / "inference", ["h200"]).predictions
    for batch, rows in predicted.groupby("batch_size"):
        model = rows[rows["layer"] == "(model)"].iloc[0]
        lstm = rows[rows["layer"] == "lstm"].iloc[0]
        assert "lstm priced as the layer" in model["method"]
        assert "older tbs" not in model["method"]  # recorded before kernel_rules, but no BatchNorm to fold
        assert lstm["median_s"] < model["median_s"] < 1.5 * lstm["median_s"]  # the rest is a few small Denses
        assert lstm["in_model_s"] == lstm["median_s"] and model["low_s"] < model["median_s"] < model["high_s"]


def test_the_whole_model_fit_minimises_a_capped_mean_error_so_one_table_far_off_does_not_pull_it():
    import numpy as np
    bench = _benchmark_module("whole_model")
    work = np.array([1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3])
    launches = np.array([100.0, 200.0, 300.0, 400.0, 500.0, 600.0])
    kernel_s, host_s = bench.KERNELS_S[40], bench.OVERHEADS_S[80]
    published = work + kernel_s * launches + host_s
    published[-2:] *= 3.0  # two rows from a table 3x off the others (the T4's two tables are 1.7x apart)
    parts = {(0.0, 1.0): (work, launches), (0.0, 0.5): (2 * work, launches)}
    fitted = bench.fit(parts, published, np.ones(len(work), bool))
    assert fitted == (0.0, 1.0, kernel_s, host_s)  # the four agreeing rows, exactly: the far rows cost the cap each
    near, far = np.log(1.1), np.log(30.0)  # a far row costs the cap, not its whole error
    assert bench.fit_loss(np.ones((2, 1)), np.array([[1.1], [30.0]]))[0] == pytest.approx((near + bench.LOSS_CAP) / 2)
    assert bench.LOSS_CAP < far
