"""The attention backend choice: on a CPU it names the kernel SDPA ran; the header states the measured choice."""

from __future__ import annotations

import torch

from dlx.bench.attention import AttentionChoice, choose_attention_backend


def test_on_a_cpu_the_header_names_the_kernel_sdpa_ran():
    choice = choose_attention_backend(2, 4, 2, 64, 16, torch.device("cpu"))
    assert choice.backend == "scaled_dot_product_flash_attention_for_cpu"
    assert choice.header == (
        "attention: CPU, SDPA ran scaled_dot_product_flash_attention_for_cpu (no other kernel to choose from)"
    )


def test_the_header_states_every_contender_and_the_refusals():
    choice = AttentionChoice("flash", {"cudnn": None, "flash": 1.234, "flex": 1.5}, (8, 32, 8, 2048, 64))
    assert choice.header == (
        "attention: flash, the fastest fwd+bwd at (B, H, H_kv, T, D) = (8, 32, 8, 2048, 64): cudnn refused, "
        "flash 1.23 ms, flex 1.50 ms"
    )
