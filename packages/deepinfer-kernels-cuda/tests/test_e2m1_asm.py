"""The packed E2M1 decode's PTX (`e2m1_asm.e2m1_bf16x2_asm`) for each variant the kernels use, byte for
byte the strings dequant.py and cache_quant.py carried inline before the generator (commit 32e9c0d; their
arithmetic is checked by test_moe_layouts and the GPU tests): pinned by SHA-256 and length."""

import hashlib

import pytest

from deepinfer_kernels_cuda import cache_quant, dequant
from deepinfer_kernels_cuda.e2m1_asm import e2m1_bf16x2_asm

INLINE = {  # (bytes per instance, times 2^126 inside) -> (sha256, length) of the former inline string
    (2, False): ("7b1124b61ec7defc5eee9e51ae2261b96f4579c2aeed1c19649cc3b8fb837054", 300),  # dequant, MMA
    (4, False): ("cc135102c8ab5285a81f40f822d3e17e430ee024ccaabc16f04f62b466f31708", 553),  # dequant, GEMV
    (4, True): ("6f8c648c6d7ec64d34d6e5dab0eadf0814b80e1fafe12e3e352d564935be6466", 687),  # FP4 KV cache
}


def fingerprint(ptx: str) -> tuple[str, int]:
    return hashlib.sha256(ptx.encode()).hexdigest(), len(ptx)


@pytest.mark.parametrize(("num_bytes", "times_2pow126"), list(INLINE))
def test_generator_emits_the_former_inline_ptx(num_bytes, times_2pow126):
    assert fingerprint(e2m1_bf16x2_asm(num_bytes, times_2pow126)) == INLINE[num_bytes, times_2pow126]


def test_kernels_use_the_generated_ptx():
    assert dequant._E2M1_BF16X2_ASM2.value == e2m1_bf16x2_asm(2, times_2pow126=False)
    assert dequant._E2M1_BF16X2_ASM4.value == e2m1_bf16x2_asm(4, times_2pow126=False)
    assert cache_quant._E2M1_BF16X2_ASM.value == e2m1_bf16x2_asm(4, times_2pow126=True)


def test_rejects_other_widths():
    with pytest.raises(ValueError, match="2 or 4 bytes per instance, got 3"):
        e2m1_bf16x2_asm(3, False)
