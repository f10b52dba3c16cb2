"""A chat model with random weights and a real tokenizer: a tiny Llama (2 layers, 64 wide)
over SmolLM2's vocabulary, its tokenizer and chat template taken from the suite's converted
default model. It loads in a second and generates real token ids, which its tokenizer may
split otherwise when their text is encoded again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 49152,  # SmolLM2's
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def tiny_chat_model(directory: Path, tokenizer_dir: Path) -> str:
    """The --model argument (dummy:DIR) of the tiny model, written to `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, directory / name)
    (directory / "config.json").write_text(json.dumps(TINY))
    return f"dummy:{directory}"
