"""The kernel classifier and short names, on kernel names copied from real profiles."""

from __future__ import annotations

import pytest

from lmscope.measure.kernel_categories import CATEGORIES, classify, short_name

REAL_NAMES = [
    ("ampere_sgemm_128x64_tn", "matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_"
     "kernel__5x_cublas", "matmul"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_s161616gemm_bf16_16x16_128x2_tn_align8>", "matmul"),
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NTT", "matmul"),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false>", "matmul"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
     "std::array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3>)", "elementwise"),
    ("void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast<"
     "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float>>>"
     "(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)", "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, "
     "float, float>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, "
     "float, float, float>, unsigned int, float, 4, 4>)", "reduction"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
     "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)", "reduction"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("Memset (Device)", "memcpy"),
    ("Memcpy DtoD (Device -> Device)", "memcpy"),
    ("Memcpy HtoD (Pageable -> Device)", "memcpy"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
     "(at::native::ADAM_MODE)1, false>, float*, double, double, double, double, double, bool, float*, "
     "float*>(T1, T2, T3...)", "optimizer"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
     "cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, true, "
     "false, false, true, true, false, false>(flash::Flash_fwd_params)", "attention"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, "
     "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)", "attention"),
    ("_attn_fwd", "attention"),
    ("triton_per_fused__to_copy_mean_mul_pow_rsqrt_0", "reduction"),
    ("triton_poi_fused_mul_silu_1", "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
     "std::array<char*, 1> >(int, at::native::FillFunctor<float>, std::array<char*, 1>)", "elementwise"),
    ("void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<float, 4, "
     "at::native::templates::cuda::normal_and_transform<float, float, 4>(...)", "elementwise"),
    ("aten::mm", "matmul"),
    ("aten::mkldnn_convolution", "matmul"),
    ("aten::convolution_backward", "matmul"),
    ("aten::_conj", "other"),
    ("autograd::engine::evaluate_function: EmbeddingBackward0", "other"),
    ("SoftmaxBackward0", "other"),
    ("torch::autograd::AccumulateGrad", "other"),
    ("aten::_softmax", "reduction"),
    ("aten::add_", "elementwise"),
    ("aten::view", "other"),
    ("aten::resolve_conj", "other"),
    ("aten::as_strided_", "other"),
    ("aten::_fused_adamw_", "optimizer"),
    ("some_unknown_kernel_xyz", "other"),
]


@pytest.mark.parametrize(("name", "category"), REAL_NAMES)
def test_classify_real_kernel_names(name: str, category: str) -> None:
    assert classify(name) == category


def test_every_category_is_reachable() -> None:
    assert {category for _, category in REAL_NAMES} == set(CATEGORIES)


@pytest.mark.parametrize(
    ("name", "short"),
    [
        ("ampere_sgemm_128x64_tn", "ampere_sgemm_128x64_tn"),
        (REAL_NAMES[5][0], "vectorized_elementwise_kernel (CUDAFunctor_add)"),
        (REAL_NAMES[6][0], "elementwise_kernel (MulFunctor)"),
        (REAL_NAMES[7][0], "reduce_kernel (MeanOps)"),
        (REAL_NAMES[8][0], "cunn_SoftMaxForward (SoftMaxForwardEpilogue)"),
        (REAL_NAMES[9][0], "ncclDevKernel_AllReduce_Sum_f32_RING_LL"),
        (REAL_NAMES[2][0], "cutlass_80_wmma_tensorop_s161616gemm_bf16_16x16_128x2_tn_align8"),
        (REAL_NAMES[13][0], "multi_tensor_apply_kernel (FusedAdamMathFunctor)"),
        ("Memcpy DtoD (Device -> Device)", "Memcpy DtoD"),
        ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::(anonymous namespace)::"
         "silu_kernel(at::TensorIteratorBase &)::[lambda() (instance 1)]>(int, T2, T3)",
         "vectorized_elementwise_kernel (silu_kernel)"),
        ("aten::mm", "mm"),
    ],
)
def test_short_names_drop_templates_but_keep_the_functor(name: str, short: str) -> None:
    assert short_name(name) == short


def test_short_name_is_cut_to_width() -> None:
    name = "k" * 200
    assert short_name(name, width=40) == "k" * 37 + "..."
    assert len(short_name(REAL_NAMES[1][0], width=30)) == 30
