"""Reading what oneDNN ran from its verbose lines (the INT8 and bf16 evidence of an
inference record), on recorded line formats."""

from __future__ import annotations

from workflow_scripts.rank import inference


def test_onednn_verbose_lines_are_read_in_every_format():
    """oneDNN 3.x's ``v1`` lines (with and without a timestamp), 2.x's without the
    ``primitive`` marker; graph lines and reorders are not multiply-add kernels."""
    lines = [
        "onednn_verbose,v1,info,cpu,isa:Intel AVX-512 with Intel DL Boost",
        "onednn_verbose,v1,primitive,exec,cpu,convolution,brg_conv_fwd:avx512_core_vnni,"
        "forward_inference,src:u8::blocked:acdb::f0 wei:s8:ap:blocked:AcdB32a4b::f8:zpm1 "
        "bia:f32:a:blocked:a::f0 dst:u8::blocked:acdb::f0,attr,,mb1,0.1",
        "onednn_verbose,v1,1732600000.1,primitive,exec,cpu,matmul,brg_matmul:avx512_core_amx,"
        "undef,src:u8:a:blocked:ab::f0 wei:s8:ap:blocked:BA16a64b4a::f0 dst:f32,,,"
        "1x128:128x10,0.02",
        "onednn_verbose,exec,cpu,inner_product,brgemm:avx512_core_bf16,forward_inference,"
        "src_bf16::blocked:ab:f0 wei_bf16::blocked:AB16b64a2b:f0 dst_bf16::blocked:ab:f0,,,"
        "mb1,0.01",
        "onednn_verbose,v1,graph,exec,cpu,100045,quantized_convolution_post_ops,aten::dequantize,",
        "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:u8 dst:u8,,,"
        "1x3x32x32,0.003",
    ]
    got = inference.kernels(lines)
    assert got["isa"] == "Intel AVX-512 with Intel DL Boost"
    assert (got["heavy_primitives"], got["int8_primitives"], got["bf16_primitives"]) == (3, 2, 1)
    assert got["int8_isa"] == "AMX-INT8"
    assert inference.int8_isa(["brg_matmul:avx2_vnni"]) == "AVX-VNNI"
    assert inference.int8_isa(["gemm:jit:avx2"]) == "no VNNI/AMX"
