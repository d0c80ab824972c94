"""`dlx plan`: the estimator's arithmetic, sharding, and bad input."""

import json

import pytest

from dlx.errors import UserError
from dlx.metrics.estimate import TrainingShape, activation_bytes_per_token_per_layer, max_micro_batch, plan_memory
from dlx.model import resolve_model_args


def test_state_bytes_follow_the_documented_rule():
    args = resolve_model_args("debug")  # 158,016 parameters
    rope = 2 * 128 * 16 * 4  # cos and sin, fp32 (max_seq_len, head_dim)
    plain = plan_memory(args, TrainingShape(seq_len=32, micro_batch=2, precision="fp32"))
    assert plain.params == 158_016
    assert plain.weights_gb == pytest.approx((158_016 * 4 + rope) / 1e9)
    assert plain.grads_gb == pytest.approx(158_016 * 4 / 1e9)
    assert plain.optimizer_gb == pytest.approx(158_016 * 8 / 1e9)
    # one chunk (all 64 tokens): the fp32 logits, overwritten by their log-softmax then the gradient; the hidden
    # states, their gradient and the final norm's input; the output weight's gradient
    assert plain.logits_gb == pytest.approx((64 * 512 * 4 + 64 * 37 + 64 * 64 * 12 + 4 * 512 * 64) / 1e9)
    bf16 = plan_memory(args, TrainingShape(seq_len=32, micro_batch=2, precision="bf16"))
    assert bf16.weights_gb == pytest.approx((158_016 * 6 + rope) / 1e9)  # and autocast's bf16 copies
    # bf16 logits, their fp32 copy (overwritten by the log-softmax then the gradient), the gradient cast to bf16
    assert bf16.logits_gb == pytest.approx((64 * 512 * 8 + 64 * 37 + 64 * 64 * 8 + 4 * 512 * 64) / 1e9)
    for strategy, stage in (("fsdp", 2), ("deepspeed", 3)):
        sharded = plan_memory(
            args, TrainingShape(32, 2, precision="fp32", strategy=strategy, zero_stage=stage, world_size=4)
        )
        assert sharded.weights_gb == pytest.approx((158_016 * 4 / 4 + rope) / 1e9)  # the RoPE tables stay whole
        assert sharded.grads_gb * 4 == pytest.approx(plain.grads_gb)
        assert sharded.optimizer_gb * 4 == pytest.approx(plain.optimizer_gb)
    zero1 = plan_memory(args, TrainingShape(32, 2, precision="fp32", strategy="deepspeed", zero_stage=1, world_size=4))
    assert (zero1.weights_gb, zero1.grads_gb) == (plain.weights_gb, plain.grads_gb)
    assert zero1.optimizer_gb * 4 == pytest.approx(plain.optimizer_gb)
    zero2 = plan_memory(args, TrainingShape(32, 2, precision="fp32", strategy="deepspeed", zero_stage=2, world_size=4))
    assert (zero2.weights_gb, zero2.grads_gb * 4) == (plain.weights_gb, pytest.approx(plain.grads_gb))
    ddp = plan_memory(args, TrainingShape(32, 2, precision="fp32", strategy="ddp", world_size=4))
    assert ddp.grads_gb == pytest.approx(2 * plain.grads_gb)  # gradients plus DDP's buckets


def test_activation_terms_and_checkpointing():
    args = resolve_model_args("debug")  # d=64, f=176, kv dim 32, 4 heads
    shape = TrainingShape(seq_len=16, micro_batch=1, precision="bf16")
    d, f, k, h = 64, 176, 32, 4
    expected = 2 * (4 * d + 4) + 4 * d + 2 * (d + 2 * k) + 2 * d + 4 * h + 8 * f
    assert activation_bytes_per_token_per_layer(args, shape) == expected
    cpu = TrainingShape(seq_len=16, micro_batch=1, precision="bf16", device_type="cpu")
    assert activation_bytes_per_token_per_layer(args, cpu) == expected + 2 * 4 * d  # composite rms_norm
    fp32 = TrainingShape(seq_len=16, micro_batch=1, precision="fp32")  # CUDA fp32: k and v repeated
    assert (
        activation_bytes_per_token_per_layer(args, fp32) == 2 * (4 * d + 4) + 8 * d + 4 * 3 * d + 4 * d + 4 * h + 16 * f
    )
    full = plan_memory(args, TrainingShape(16, 1, activation_checkpointing="full"))
    none = plan_memory(args, shape)
    assert full.activations_gb < none.activations_gb


def test_max_micro_batch_is_the_largest_that_fits():
    args = resolve_model_args("llama3.2-1b")
    shape = TrainingShape(seq_len=2048, micro_batch=1)
    best = max_micro_batch(args, shape, budget_gb=80)
    assert (
        plan_memory(args, TrainingShape(2048, best)).total_gb
        <= 80
        < plan_memory(args, TrainingShape(2048, best + 1)).total_gb
    )
    assert max_micro_batch(args, shape, budget_gb=1) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"micro_batch": 0}, "micro-batch must be a positive integer"),
        ({"precision": "fp8"}, "unknown precision 'fp8'"),
        ({"strategy": "zero3"}, "unknown strategy 'zero3'"),
        ({"strategy": "deepspeed", "zero_stage": 4}, "zero-stage must be 1, 2 or 3"),
        ({"tp": 2, "world_size": 3}, r"--world-size 3 must be a multiple of --tp 2"),
        ({"tp": 2, "world_size": 4, "strategy": "deepspeed"}, "deepspeed does not combine with --tp"),
    ],
)
def test_bad_values_are_one_line_errors(kwargs, message):
    with pytest.raises(UserError, match=message):
        TrainingShape(**{"seq_len": 16, "micro_batch": 1, **kwargs})


def test_plan_cli_predicts_step_time_per_rank_under_sharding():
    from typer.testing import CliRunner

    from dlx.cli.app import _register_commands, app

    if not app.registered_commands:  # another test may have registered them in this process
        _register_commands()
    argv = [
        "plan",
        "llama3.2-1b",
        "--seq-len",
        "2048",
        "--micro-batch",
        "4",
        "--grad-accum",
        "2",
        "--gpu",
        "H100",
        "--mfu",
        "0.5",
        "--strategy",
        "deepspeed",
        "--zero-stage",
        "3",
        "--world-size",
        "8",
        "--json",
    ]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    tokens = 4 * 2048 * 2 * 8
    assert summary["tokens_per_step"] == tokens
    expected = summary["flops_per_token_attention"] * tokens / (989.4e12 * 0.5 * 8)
    assert summary["predicted_step_s"] == pytest.approx(expected)
    rope = 2 * 8192 * 64 * 4
    assert summary["weights_gb"] == pytest.approx((1_235_814_400 * 6 / 8 + rope) / 1e9)
    assert summary["peak_phase"] in ("forward", "backward", "optimizer")


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_activation_count_equals_what_a_block_saves_on_cpu(precision):
    """The bytes of every distinct storage a block keeps for backward (its weights, autocast's weight copies and the
    RoPE tables aside), per token, are exactly the estimate's count for CPU kernels."""
    import torch

    from dlx.model.llama import TransformerBlock
    from dlx.model.rope import rope_tables

    args = resolve_model_args("debug")
    block, tokens = TransformerBlock(args), 3 * 16  # 48 rows: no weight has a 48, so weight copies are told apart
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    cos, sin = (table[:16].to(dtype) for table in rope_tables(args))
    weight_shapes = {shape for p in block.parameters() for shape in (p.shape, p.shape[::-1])}
    constants = {t.untyped_storage().data_ptr() for t in (*block.parameters(), cos, sin)}
    saved: dict[int, int] = {}

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in constants and tensor.shape not in weight_shapes:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    x = torch.randn(3, 16, args.dim, requires_grad=True)
    autocast = torch.autocast("cpu", dtype=dtype, enabled=precision != "fp32")
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t), autocast:
        block(x, cos, sin)
    shape = TrainingShape(seq_len=16, micro_batch=3, precision=precision, device_type="cpu")
    assert sum(saved.values()) / tokens == activation_bytes_per_token_per_layer(args, shape)


def test_tensor_parallelism_divides_what_it_shards():
    """tp divides the matmul weights, the embedding, the logits and the activations but the gathered matmul inputs;
    the norm weights stay whole; the data-parallel ranks are world size ÷ tp."""
    args = resolve_model_args("debug")  # 158,016 parameters, 5 · 64 of them norm weights
    norms, p, d, f, h = 5 * 64, 4, 64, 176, 4
    plain = plan_memory(args, TrainingShape(32, 2, precision="fp32"))
    for tp in (2, 4):
        shape = TrainingShape(32, 2, precision="fp32", world_size=tp, tp=tp)
        sharded = plan_memory(args, shape)
        assert sharded.weights_gb == pytest.approx((((158_016 - norms) / tp + norms) * 4 + 2 * 128 * 16 * 4) / 1e9)
        assert sharded.logits_gb * tp == pytest.approx(2 * 32 * 512 * 12 / 1e9)  # the whole logits' vocab shards
        assert sharded.tokens_per_step == plain.tokens_per_step  # one replica
        per_token = (2 * (4 * d + 4) + p * 3 * d + p * d + 4 * h + 4 * p * f) / tp + 2 * p * d  # CUDA fp32
        assert activation_bytes_per_token_per_layer(args, shape) == pytest.approx(per_token)
    fsdp_tp = plan_memory(args, TrainingShape(32, 2, precision="fp32", strategy="fsdp", world_size=8, tp=2))
    assert fsdp_tp.optimizer_gb == pytest.approx(((158_016 - norms) / 2 + norms) * 8 / 4 / 1e9)
    assert fsdp_tp.tokens_per_step == 4 * plain.tokens_per_step
    ddp_tp = plan_memory(args, TrainingShape(32, 2, precision="fp32", strategy="ddp", world_size=4, tp=2))
    assert ddp_tp.grads_gb == pytest.approx(((158_016 - norms) / 2 + norms) * 4 / 1e9)  # FSDP2 hybrid: no buckets


def test_plan_cli_refuses_a_tp_that_does_not_divide_the_heads():
    from typer.testing import CliRunner

    from dlx.cli.app import _register_commands, app

    if not app.registered_commands:
        _register_commands()
    result = CliRunner().invoke(app, ["plan", "llama3-8b", "--tp", "3"])
    assert isinstance(result.exception, UserError)  # `dlx` prints it as one line and exits 2
    assert str(result.exception) == "--tp 3 must divide the model's n_heads (32); pick a tp that does (e.g. 1, 2, 4, 8)"
    result = CliRunner().invoke(app, ["plan", "llama3-8b", "--tp", "8", "--json"])  # world size defaults to tp
    assert result.exit_code == 0 and json.loads(result.output)["tokens_per_step"] == 2048, result.output


def test_the_peak_is_the_weights_and_optimizer_plus_the_largest_phase():
    """The documented phases, counted by hand for the debug model (untied, fp32 on CUDA: k and v repeated)."""
    from dlx.metrics.estimate import _state_bytes, phase_peaks

    args = resolve_model_args("debug")  # d=64, f=176, 4 heads, vocab 512, 2 layers, 158,016 parameters
    d, f, h, vocab, tokens = 64, 176, 4, 512, 64
    shape = TrainingShape(seq_len=32, micro_batch=2, precision="fp32")
    per_layer = (2 * (4 * d + 4) + 4 * 3 * d + 4 * d + 4 * h + 16 * f + 8 * d) * tokens
    kept = tokens * d * (4 + 4) + 4 * vocab * d  # hidden gradient, final norm input; the output weight's gradient
    loss_forward = tokens * (vocab * 4 + 37) + tokens * d * 4 + kept  # fp32 logits; 37: per-token scalars
    batch, grads, residual = 16 * tokens, 158_016 * 4, 4 * d * tokens
    plan = plan_memory(args, shape)
    state = _state_bytes(args, 158_016, shape)
    phases = phase_peaks(args, shape, state)
    assert phases["forward"] == batch + 2 * per_layer + loss_forward
    start = batch + 2 * per_layer + kept + residual
    end = batch + grads + residual + per_layer  # untied: no dense embedding gradient beside the output's
    assert phases["backward"] == max(start, end)
    assert phases["optimizer"] == grads
    peak = max(phases.values())
    assert plan.total_gb == pytest.approx((158_016 * 12 + 2 * 128 * 16 * 4 + peak) / 1e9)
    assert plan.peak_phase == max(phases, key=phases.get)
    terms = plan.weights_gb + plan.grads_gb + plan.optimizer_gb + plan.activations_gb + plan.logits_gb
    assert plan.total_gb < terms  # the terms are never all alive at once
    # from the second micro-step of an accumulation the gradients are there during forward
    accumulated = phase_peaks(args, TrainingShape(seq_len=32, micro_batch=2, precision="fp32", grad_accum=2), state)
    assert accumulated["forward"] == phases["forward"] + grads


@pytest.mark.parametrize(("precision", "checkpointing"), [("fp32", "full"), ("bf16", "none")])
def test_estimate_covers_the_live_tensor_peak_of_dlx_steps_on_cpu(precision, checkpointing):
    """Three steps of a small model through dlx's own builders and step, under torch.profiler's allocator events: the
    estimate is at or above the largest sum of live tensor bytes, and within 15 % of it (deterministic: tensor bytes,
    not the process's resident set, whose allocator slack BENCHMARKS.md measures)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from dlx.metrics.timing import PhaseTimer
    from dlx.parallel.distributed import DistEnv
    from dlx.precision import build_precision
    from dlx.train.build.data import build_train_loader
    from dlx.train.build.step_plan import plan_steps
    from dlx.train.config import build_config
    from dlx.train.loop.trainer import accumulate_gradients
    from dlx.train.run import build_run_strategy, meta_model

    model = {"preset": "debug", "dim": 128, "vocab_size": 2048, "max_seq_len": 64, "tie_embeddings": True}
    config = build_config(
        {
            "model": model,
            "data": {"path": "synthetic", "seq_len": 64, "micro_batch_size": 2},
            "train": {"max_steps": 3, "precision": precision, "device": "cpu"},
            "parallel": {"activation_checkpointing": checkpointing},
            "log": {"progress": False},
        }
    )
    cpu, env = torch.device("cpu"), DistEnv()
    run_precision = build_precision(precision, cpu)
    loader = build_train_loader(config, cpu)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        plan = plan_steps(config, loader.batches_per_epoch, loader.windows_per_epoch, 1)
        strategy = build_run_strategy(meta_model(config), config, cpu, env, run_precision, plan)
        for _ in range(3):
            accumulate_gradients(strategy.train_model, loader, 1, run_precision, PhaseTimer(cpu), strategy).item()
            strategy.optimizer_step()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    shape = TrainingShape(64, 2, precision=precision, activation_checkpointing=checkpointing, device_type="cpu")
    estimate = plan_memory(config.model.args, shape).total_gb * 1e9
    assert peak <= estimate <= 1.15 * peak, (estimate, peak)
