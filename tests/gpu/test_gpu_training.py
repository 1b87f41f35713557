"""`make gpu-smoke`, part 1, training: `harness train generator --max-steps 2` and `harness train policy --max-steps
2` on CUDA (transformers generation, bf16, gradient checkpointing), with tiny models built from a config here and
Nectar-shaped rows written here (nothing downloads), the peak memory recorded against the plan's estimate.
Skipped without CUDA; the rows are checked on any machine (they must pass Appendix B's filters)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="the train extra (trl) is not installed")

from gpu.test_gpu_smoke import _record  # noqa: E402

WORDS = ("river mountain garden letter window market engine silver planet orange basket ladder candle marble "
         "harbor pencil violin forest bridge castle meadow rocket blanket mirror signal lantern feather compass "
         "thunder island velvet anchor glacier canyon saddle whistle").split()
LAYERS, HIDDEN, HEADS, KV_HEADS = 8, 1024, 16, 8
"""Big enough that weights, optimizer state and activations show in CUDA's counters (about 0.1 B parameters)."""
PROMPT_TOKENS, COMPLETION_TOKENS, BATCH = 512, 256, 4


def nectar_rows(count: int, seed: int = 0) -> list[dict]:
    """Nectar-shaped rows of random words: 7 ranked answers of 40-60 words each, a prompt of about 80 characters,
    none broken, repetitive, a refusal or boilerplate (so Appendix B's filters keep every row)."""
    rng = random.Random(seed)

    def sentence(words: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."

    rows = []
    for i in range(count):
        question = f"Question {i}: {sentence(10)} Please explain it in a short paragraph."
        answers = [{"answer": " ".join(sentence(10) for _ in range(rng.randint(4, 6))), "model": f"m{k}",
                    "rank": float(k + 1)} for k in range(7)]
        rng.shuffle(answers)
        rows.append({"prompt": f"\n\nHuman: {question}\n\nAssistant: ", "answers": answers, "turns": 1,
                     "num_responses": 7, "source": ["sharegpt"], "good_natured": True})
    return rows


def _model(path: Path) -> Path:
    """A Qwen3-shaped random causal LM with the tests' byte-level tokenizer (rubric grammars read it)."""
    import torch
    from tiny_models import tiny_tokenizer
    from transformers import AutoModelForCausalLM, Qwen3Config

    from tiny_models import CORPUS

    tok = tiny_tokenizer(CORPUS, vocab_size=400, specials=["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"],
                         bos="<|im_start|>", byte_level=True)
    config = Qwen3Config(vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=3 * HIDDEN,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         head_dim=HIDDEN // HEADS, max_position_embeddings=4096, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, tie_word_embeddings=False)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def _data(tmp_path: Path, rows: int) -> Path:
    folder = tmp_path / "data" / "nectar"
    folder.mkdir(parents=True)
    (folder / "rlaif.jsonl").write_text("".join(json.dumps(r) + "\n" for r in nectar_rows(rows)))
    return folder.parent


def _config(tmp_path: Path, what: str, model: Path) -> Path:
    spec = f"hf:{model}"
    common = {"model": spec, "output_dir": str(tmp_path / what), "verifier": spec, "verify_mode": "per_item",
              "grpo": {"num_generations": BATCH, "per_device_train_batch_size": BATCH,
                       "max_completion_length": COMPLETION_TOKENS, "learning_rate": 1e-6, "epochs": 1,
                       "bf16": True, "gradient_checkpointing": True, "report_to": []}}
    if what == "generator":
        config = {**common, "data": {"limit": 2, "sets": {"policy": spec, "set_size": 3, "max_tokens": 64}}}
    else:
        config = {**common, "generator": spec, "gen_max_tokens": 160, "data": {"limit": 2}}
    path = tmp_path / f"{what}.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def test_the_rows_pass_appendix_bs_filters(tmp_path: Path):
    """Every written row is kept by B.1 and B.2 (checked on any machine: the GPU runs below need them)."""
    from training.data import GeneratorRules, PolicyRules, read_nectar

    data = _data(tmp_path, 4)
    rows = list(read_nectar(data / "nectar" / "rlaif.jsonl"))
    for rules in (GeneratorRules(), PolicyRules()):
        for row in rows:
            dropped = [name for name, rule in rules.rules().items() if rule(row)]
            assert not dropped, (type(rules).__name__, row.id, dropped)


@pytest.mark.gpu
@pytest.mark.parametrize("what", ["generator", "policy"])
def test_two_training_steps_on_cuda_stay_within_the_plan(tmp_path: Path, what: str):
    import torch
    from typer.testing import CliRunner

    from harness.commands.cli import app
    from harness.plan import activation_gib

    model = _model(tmp_path / "base")
    config = _config(tmp_path, what, model)
    torch.cuda.reset_peak_memory_stats()
    done = CliRunner().invoke(app, ["train", what, "--config", str(config), "--data-dir", str(_data(tmp_path, 2)),
                                    "--max-steps", "2"])
    assert done.exit_code == 0, done.output[-3000:]
    peak = torch.cuda.max_memory_allocated() / 2**30
    log = [json.loads(line) for line in (tmp_path / what / "train_log.jsonl").read_text().splitlines()]
    assert sum("loss" in line for line in log) == 2
    params = sum(p.numel() for p in
                 __import__("transformers").AutoModelForCausalLM.from_pretrained(str(model)).parameters())
    shape = json.loads((model / "config.json").read_text())
    planned_activations = activation_gib(shape, batch=BATCH, prompt_tokens=PROMPT_TOKENS,
                                         completion_tokens=COMPLETION_TOKENS, checkpointing=True)
    # The trained model's bf16 weights, fp32 master copy, gradients and Adam moments (16 bytes a parameter, as the
    # plan counts them for ZeRO-3 on one process), its frozen copies' weights (generator, verifier: 2 bytes each).
    planned_state = params * (16 + 2 * 2) / 2**30
    _record(f"train_{what}", {"peak_gib": peak, "planned_activations_gib": planned_activations,
                              "planned_state_gib": planned_state, "parameters": params})
    assert peak <= 1.5 * (planned_state + planned_activations), (peak, planned_state, planned_activations)
