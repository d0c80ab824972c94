"""model.init_from with data prepared by an extended tokenizer: the embedding and head grow to a multiple of
model.pad_vocab_to, old rows as stored (the logits over the old vocabulary are the base model's), each new row the
mean of its base pieces' rows; the export loads in transformers with the extended tokenizer; RoPE keys may change."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from cpt_helpers import base_tokenizer, chinese_text, english_texts
from dlx.data.tokenizer_extend import extend_tokenizer
from dlx.errors import UserError
from dlx.model.hf import save_hf
from dlx.train.build.model import build_model
from dlx.train.launch import launch
from dlx.train.recipe import load_recipe
from dlx.train.rundir.trained import resolve_trained
from hf_helpers import BASE, write_hf_llama
from train_helpers import make_dataset

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("in_process_training")
CPU = torch.device("cpu")


def tokenized_dataset(folder: Path, tokenizer_json: Path, texts: list[str]) -> Path:
    from dataset_helpers import write_dataset

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    eos = tokenizer.token_to_id("<|endoftext|>")
    docs = [np.asarray([*tokenizer.encode(t).ids, eos]) for t in texts]
    splits = {"train": docs[:-1], "val": docs[-1:]}
    return write_dataset(
        folder,
        {split: [np.concatenate(d)] for split, d in splits.items()},
        tokenizer.get_vocab_size(),
        eos,
        documents={split: [len(d)] for split, d in splits.items()},
        tokenizer=tokenizer_json.read_text(),
    )


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("grow")
    base_data = make_dataset(root / "base-data")  # 300 tokens, byte-level BPE
    hf = root / "hf"
    write_hf_llama(hf, 300, tokenizer=base_data / "tokenizer.json")
    (root / "zh").mkdir()
    (root / "zh" / "a.txt").write_text(chinese_text(1500, seed=0), encoding="utf-8")
    extend_tokenizer(hf / "tokenizer.json", [str(root / "zh")], 40, root / "ext", 10**7)
    texts = [chinese_text(200, seed=s) for s in range(3)] + english_texts()
    data = tokenized_dataset(root / "ext-data", root / "ext" / "tokenizer.json", texts)
    return {"root": root, "hf": hf, "data": data, "ext": root / "ext" / "tokenizer.json"}


def from_hf(setup: dict[str, Path], *more: str) -> list[str]:
    return [*BASE, "--model.init_from", str(setup["hf"]), "--data.path", str(setup["data"]), *more]


def test_the_vocabulary_grows_to_a_multiple_of_pad_vocab_to(setup):
    assert load_recipe(None, from_hf(setup)).model.args.vocab_size == 384  # 340 rounded up to 64
    assert load_recipe(None, from_hf(setup, "--model.pad_vocab_to", "128")).model.args.vocab_size == 384
    assert load_recipe(None, from_hf(setup, "--model.pad_vocab_to", "1")).model.args.vocab_size == 340


def test_a_grown_vocabulary_validates_the_recipe_once(setup, monkeypatch):
    from dlx.train.config import RunConfig

    validations = []
    original = RunConfig.model_validate.__func__

    def counted(cls, *args, **kwargs):
        validations.append(1)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(RunConfig, "model_validate", classmethod(counted))
    assert load_recipe(None, from_hf(setup)).model.args.vocab_size == 384
    assert len(validations) == 1


def test_old_logits_are_the_base_models_and_new_rows_the_mean_of_their_pieces(setup):
    config = load_recipe(None, from_hf(setup))
    grown = build_model(config, CPU, resolve_trained(setup["hf"], "model.init_from")).eval()
    base = transformers.LlamaForCausalLM.from_pretrained(setup["hf"], dtype=torch.float32).eval()
    tokens = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = grown(tokens)
        assert logits.shape[-1] == 384
        torch.testing.assert_close(logits[..., :300], base(tokens).logits, atol=1e-6, rtol=0)
    base_tok, ext_tok = Tokenizer.from_file(str(setup["hf"] / "tokenizer.json")), Tokenizer.from_file(str(setup["ext"]))
    old_embedding = base.model.embed_tokens.weight.detach()
    old_head = base.lm_head.weight.detach()
    for new_id in (300, 321, 339):
        pieces = [t.id for t in base_tok.model.tokenize(ext_tok.id_to_token(new_id))]
        assert len(pieces) >= 2 and max(pieces) < 300
        torch.testing.assert_close(grown.tok_embeddings.weight[new_id], old_embedding[pieces].mean(0))
        torch.testing.assert_close(grown.output.weight[new_id], old_head[pieces].mean(0))
    torch.testing.assert_close(grown.tok_embeddings.weight[340:], old_embedding.mean(0).expand(44, -1))


def test_the_grown_export_round_trips_through_transformers(setup, tmp_path):
    config = load_recipe(None, from_hf(setup))
    grown = build_model(config, CPU, resolve_trained(setup["hf"], "model.init_from")).eval()
    out = save_hf(grown, tmp_path / "export", tokenizer=setup["ext"])
    hf = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 384
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    text = chinese_text(2, seed=7)[:40]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids == Tokenizer.from_file(str(setup["ext"])).encode(text).ids and max(ids) >= 300
    with torch.no_grad():
        torch.testing.assert_close(hf(torch.tensor([ids])).logits, grown(torch.tensor([ids])), atol=1e-5, rtol=0)


def test_a_run_grows_states_old_to_new_and_may_change_rope(setup, tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = from_hf(setup, "--train.max_steps", "1", "--model.rope_theta", "40000", "--data.num_workers", "0")
    assert launch(None, args, run_dir, resume=False) == 0
    header = capsys.readouterr().out
    assert "changed at init_from: rope_theta 10000.0 → 40000.0, vocab_size 300 → 384" in header
    assert "vocab_size: 384" in (run_dir / "config.yaml").read_text()


def test_a_tokenizer_that_is_not_an_extension_is_refused(setup, tmp_path):
    tokenizer = base_tokenizer(tmp_path / "other.json", vocab_size=500)  # other merges, other ids
    json_text = tokenizer.read_text().replace("<|begin_of_text|>", "<|endoftext|>")  # the eos tokenized_dataset uses
    tokenizer.write_text(json_text)
    other = tokenized_dataset(tmp_path / "other", tokenizer, english_texts())
    with pytest.raises(UserError) as error:
        load_recipe(None, [*BASE, "--model.init_from", str(setup["hf"]), "--data.path", str(other)])
    message = str(error.value)
    assert "was prepared with a tokenizer that is neither model.init_from's" in message and "\n" not in message
    assert "`dlx tokenizer extend`" in message


def test_the_chinese_continuation_recipe_changes_rope_at_init_from(tmp_path):
    from hf_helpers import LLAMA32_1B_CONFIG

    (tmp_path / "config.json").write_text(json.dumps(LLAMA32_1B_CONFIG))
    recipe = Path(__file__).parents[2] / "recipes" / "llama3.2-1b-continue-zh.yaml"
    args = load_recipe(recipe, ["--model.init_from", str(tmp_path)]).model.args
    assert (args.rope_theta, args.max_seq_len, args.vocab_size) == (1_000_000.0, 4096, 128256)
    assert args.rope_scaling is not None and args.rope_scaling.factor == 32.0
    with pytest.raises(UserError, match=r"model\.vocab_size is 1000 but the weights .* have vocab_size 128256"):
        load_recipe(recipe, ["--model.init_from", str(tmp_path), "--model.vocab_size", "1000"])


@pytest.mark.distributed
def test_each_fsdp_rank_fills_its_rows_of_the_grown_vocabulary(setup, tmp_path):
    from test_parallel import TESTS, torchrun

    report = tmp_path / "report.json"
    args = [str(setup["hf"]), str(setup["ext"]), "384", str(report)]
    result, _ = torchrun(args, tmp_path, script=TESTS / "grow_shards.py")
    assert result.returncode == 0, result.stderr[-6000:]
    assert json.loads(report.read_text()) == {"difference": 0.0, "rows": 384}


def test_a_dataset_prepared_into_a_bucket_grows_the_vocabulary_as_its_local_twin(setup, tmp_path, monkeypatch):
    """`dlx prepare --tokenizer EXTENDED --out s3://…` then model.init_from with that URL as data.path: the recipe
    reads the extension from the dataset's mirror, so the model grows and fills its new rows as from the same corpus
    prepared into a folder, and a run trains from the bucket."""
    from journey_helpers import User, write_jsonl
    from s3_helpers import apply_env, make_bucket, s3_server

    texts = [chinese_text(200, seed=s) for s in range(6)] + english_texts()
    corpus = write_jsonl(tmp_path / "zh.jsonl", [{"text": text} for text in texts])
    prepare = [str(corpus), "--tokenizer", str(setup["ext"]), "--val-documents", "1", "--no-progress"]
    with s3_server() as server:
        make_bucket(server, "grow")
        user = User(tmp_path / "user", server.env())
        user.dlx("prepare", *prepare, "--out", "s3://grow/zh")
        user.dlx("prepare", *prepare, "--out", str(tmp_path / "twin"))
        apply_env(server, monkeypatch)
        cache = ["--data.cache_dir", str(tmp_path / "cache")]
        bucket = [*BASE, "--model.init_from", str(setup["hf"]), "--data.path", "s3://grow/zh", *cache]
        local = [*BASE, "--model.init_from", str(setup["hf"]), "--data.path", str(tmp_path / "twin")]
        remote_config, local_config = load_recipe(None, bucket), load_recipe(None, local)
        assert remote_config.model.args.vocab_size == local_config.model.args.vocab_size == 384
        trained = resolve_trained(setup["hf"], "model.init_from")
        grown, twin = (build_model(config, CPU, trained) for config in (remote_config, local_config))
        torch.testing.assert_close(grown.tok_embeddings.weight, twin.tok_embeddings.weight, atol=0, rtol=0)
        one_step = [*bucket, "--train.max_steps", "1", "--data.num_workers", "0"]
        assert launch(None, one_step, tmp_path / "run", resume=False) == 0
        assert "vocab_size: 384" in (tmp_path / "run" / "config.yaml").read_text()

        # the bucket's tokenizer.json changed in place (same size): a fresh machine refuses it in one line
        import boto3

        client = boto3.client("s3", endpoint_url=server.server_url, region_name="us-east-1")
        stored = client.get_object(Bucket="grow", Key="zh/tokenizer.json")["Body"].read()
        changed = stored.replace(b'"type"', b'"tYpe"', 1)
        assert len(changed) == len(stored) != 0 and changed != stored
        client.put_object(Bucket="grow", Key="zh/tokenizer.json", Body=changed)
        fresh = [arg if arg != str(tmp_path / "cache") else str(tmp_path / "fresh-cache") for arg in one_step]
        with pytest.raises(UserError) as refused:
            launch(None, fresh, tmp_path / "refused", resume=False)
        message = str(refused.value)
        assert "s3://grow/zh/tokenizer.json does not match the checksum in its manifest" in message
        assert "\n" not in message and not (tmp_path / "refused" / "checkpoints").exists()
