"""What torch.compile compiled, as the run's log says it: new entries of dynamo's compilation records since the last
look (a backward graph an entry of its own), one line per look and one per recompile with its first failed guard."""

from __future__ import annotations

from types import SimpleNamespace

from dlx.metrics import compiles
from dlx.metrics.compiles import Compiled, CompileLog, describe, short_path


def entry(name: str | None, seconds: float = 1.0, reason: str | None = None, backward_us: int | None = None):
    return SimpleNamespace(
        co_name=name,
        co_filename="/x/src/dlx/model/llama.py" if name else None,
        co_firstlineno=166,
        entire_frame_compile_time_s=seconds if name else None,
        recompile_reason=reason,
        inductor_fx_local_cache_hit_count=1,
        inductor_fx_local_cache_miss_count=0,
        aotautograd_local_cache_hit_count=0,
        aotautograd_local_cache_miss_count=2,
        backward_cumulative_compile_time_us=backward_us,
    )


def test_take_returns_what_was_compiled_since_the_last_look(monkeypatch):
    records = [entry("before")]
    monkeypatch.setattr(CompileLog, "_entries", staticmethod(lambda: list(records)))
    log = CompileLog()
    assert log.take() == []
    records += [entry("forward", 2.5), entry(None, backward_us=1_500_000), entry(None)]
    taken = log.take()
    assert taken == [
        Compiled("forward (dlx/model/llama.py:166)", 2.5, None, 1, 2),
        Compiled("backward graph", 1.5, None, 0, 0),
    ]
    records.append(entry("forward", 0.5, "0/0: GLOBAL_STATE changed: grad_mode \n more"))
    (again,) = log.take()
    assert again.recompile.startswith("0/0: GLOBAL_STATE changed: grad_mode")
    records.append(entry("more"))
    del records[:5]  # torch keeps the last 64: the one seen last is gone, so everything present is new
    records.append(entry("other"))
    assert [c.function.split(" ")[0] for c in log.take()] == ["more", "other"]


def test_describe_names_each_recompile_with_its_first_failed_guard():
    first = Compiled("forward (dlx/model/llama.py:166)", 6.1, None, 0, 2)
    again = Compiled("forward (dlx/model/llama.py:166)", 0.2, "0/0: GLOBAL_STATE changed: grad_mode\nmore", 2, 0)
    assert describe([], "by step 1") == []
    assert describe([first, again], "in the evaluation at step 3") == [
        "compile in the evaluation at step 3: 2 graph(s) in 6.3 s (inductor/AOTAutograd cache: 2 hit(s), 2 miss(es)), "
        "1 recompile(s)",
        "recompiled in the evaluation at step 3: forward (dlx/model/llama.py:166) in 0.2 s, because 0/0: "
        "GLOBAL_STATE changed: grad_mode",
    ]


def test_a_file_is_named_from_the_package_it_is_in():
    assert short_path("/venv/lib/python3.11/site-packages/torch/nn/modules/module.py") == "torch/nn/modules/module.py"
    assert short_path("/work/src/dlx/model/llama.py") == "dlx/model/llama.py"
    assert short_path("<string>") == "<string>"
    assert compiles.first_line(None) == "(no reason given by torch)"
