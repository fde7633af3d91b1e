"""MoeproxyCallback in a real (tiny) transformers Trainer, sending to a real uvicorn."""

from __future__ import annotations

import httpx
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")


class TinyDataset(torch.utils.data.Dataset):
    def __init__(self, n: int = 12, length: int = 8, vocab: int = 32):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def test_trainer_logs_reach_the_service(sqlite_live_server, tmp_path):
    live_server = sqlite_live_server
    from moeproxy.integrations import MoeproxyCallback

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=16,
    )
    model = transformers.LlamaForCausalLM(config)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        run_name="tiny-llama-sft",
        max_steps=3,
        logging_steps=1,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    callback = MoeproxyCallback(live_server.url, live_server.token, flush_interval_s=0.1)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=TinyDataset(), callbacks=[callback])
    trainer.train()

    headers = {"Authorization": f"Bearer {live_server.token}"}
    (listed,) = httpx.get(f"{live_server.url}/api/v1/runs", headers=headers).json()["runs"]
    run = httpx.get(f"{live_server.url}/api/v1/runs/{listed['id']}", headers=headers).json()  # with config
    assert run["name"] == "tiny-llama-sft" and run["framework"] == "trl" and run["status"] == "finished"
    assert run["config"]["training_args"]["learning_rate"] == 1e-3
    assert "peft" not in run["config"]  # a full model: triage reads its LR against full fine-tuning's
    metrics = httpx.get(f"{live_server.url}/api/v1/runs/{run['id']}/metrics", headers=headers).json()[
        "metrics"
    ]
    assert metrics["loss"]["steps"] == [1, 2, 3]
    assert metrics["grad_norm"]["steps"] == [1, 2, 3]
    assert metrics["learning_rate"]["steps"] == [1, 2, 3]
    assert "train_runtime" not in metrics  # end-of-training summary, not a step metric
    names = httpx.get(f"{live_server.url}/api/v1/runs/{run['id']}/metrics/names", headers=headers).json()[
        "names"
    ]
    canonical = {n["name"]: n["canonical"] for n in names}
    assert canonical["loss"] == "pg_loss" and canonical["grad_norm"] == "grad_norm"  # TRL aliases (SPEC 4)


def test_a_peft_models_adapters_go_into_the_runs_config():
    """``PeftModel.peft_config`` maps adapter names to their configs (peft is not installed here:
    a stand-in with the same attribute layout); the section is what settings_from_config reads."""
    from moeproxy.signatures.settings import settings_from_config

    from moeproxy.integrations.transformers import _peft_section

    class LoraConfig:
        peft_type, r, lora_alpha = "LORA", 16, 32

    class PeftModelLike:
        def __init__(self):
            self.peft_config = {"default": LoraConfig()}

    section = _peft_section(PeftModelLike())
    assert section == {"default": {"peft_type": "LORA", "r": 16, "lora_alpha": 32}}
    assert settings_from_config({"peft": section}).lora
    assert _peft_section(object()) == {}

