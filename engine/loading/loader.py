"""Model loading: a .gguf file, a Hugging Face checkpoint directory, or dummy weights.

GGUF files are dequantized once (engine.loading.gguf_checkpoint) into a cached checkpoint
directory, so every source ends up as config.json + safetensors + tokenizer files.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.config import ModelConfig
from engine.errors import ModelLoadError, ModelNotFoundError
from engine.models.causal_lm import CausalLM

# Real model shapes for benchmarks with random weights (`dummy:llama-3.1-8b`).
DUMMY_PRESETS: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "eos_token_id": [128001, 128008, 128009],
    },
    "smollm2-135m": {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
        "eos_token_id": 2,
    },
}


@dataclass(slots=True)
class ModelSource:
    kind: str  # "checkpoint" | "dummy"
    name: str  # what the user asked for, for messages
    path: Path | None = None  # checkpoint directory
    hf_config: dict[str, Any] | None = None


def resolve_source(
    model: str | os.PathLike | None, cache_dir: str | os.PathLike | None = None
) -> ModelSource:
    """Turn what the user passed to --model into a checkpoint directory or a dummy config.
    A GGUF is converted under `cache_dir` (default: paths.default_cache_dir())."""
    if model is None or str(model) in ("", "default"):
        from engine.loading.default_model import default_model_path

        model = default_model_path()
    name = str(model)
    if name.startswith("dummy"):
        return _dummy_source(name)
    from engine.loading import model_catalog, paths

    cache = paths.cache_dir(cache_dir)
    known = model_catalog.lookup(name)
    if known is not None and not Path(name).exists():
        from engine.loading.gguf_checkpoint import gguf_to_checkpoint

        files = model_catalog.verified_files(known, cache_dir=cache)
        root = cache / "gguf"
        if len(files) == 1:  # named after its file, as when the path is given
            return ModelSource("checkpoint", known.name, gguf_to_checkpoint(files[0], root))
        return ModelSource("checkpoint", known.name, gguf_to_checkpoint(files, root, known.name))
    path = Path(name).expanduser()
    if path.suffix == ".gguf" or (path.is_file() and _is_gguf(path)):
        from engine.loading.gguf_checkpoint import gguf_to_checkpoint

        return ModelSource("checkpoint", name, gguf_to_checkpoint(path, cache / "gguf"))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} has no config.json; not a Hugging Face checkpoint")
        return ModelSource("checkpoint", name, path)
    if path.exists():
        raise ModelLoadError(f"{path} is neither a .gguf file nor a checkpoint directory")
    cached = _hf_cache_snapshot(name)
    if cached is not None:
        return ModelSource("checkpoint", name, cached)
    raise ModelNotFoundError(
        f"model not found: {name} (not a known model name, a file, a directory, or a repo id "
        "in the local Hugging Face cache; `agentctx models` lists the known ones)"
    )


def _is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def _dummy_source(name: str) -> ModelSource:
    _, _, spec = name.partition(":")
    spec = spec or "smollm2-135m"
    if spec in DUMMY_PRESETS:
        return ModelSource("dummy", name, hf_config=dict(DUMMY_PRESETS[spec]))
    path = Path(spec).expanduser()
    config = path / "config.json" if path.is_dir() else path
    if not config.is_file():
        presets = ", ".join(DUMMY_PRESETS)
        raise ModelNotFoundError(
            f"unknown dummy model {spec!r}; use one of {presets} or a config.json path"
        )
    return ModelSource(
        "dummy", name, path if path.is_dir() else None, json.loads(config.read_text())
    )


def _hf_cache_snapshot(repo_id: str) -> Path | None:
    if repo_id.count("/") != 1:
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # not cached, or the hub library is absent: not a repo id we can use
        return None


def read_config(source: ModelSource) -> ModelConfig:
    if source.hf_config is not None:
        return ModelConfig.from_hf(source.hf_config)
    cfg = ModelConfig.from_file(source.path / "config.json")
    if cfg.tie_word_embeddings and _stores_head(source.path):
        # transformers unties a head that the checkpoint stores with other values than the
        # embedding; an untied copy of equal values computes the same logits, so untie it
        cfg.tie_word_embeddings = False
    return cfg


def engine_model_config(source: ModelSource, config) -> ModelConfig:
    """The model's config as an engine with EngineConfig `config` runs it (its RoPE scaling
    override applied): what Engine.load builds and what prompt counting takes the window of."""
    cfg = read_config(source)
    if config is not None and config.rope_scaling is not None:
        cfg = cfg.with_rope_scaling(config.rope_scaling)
    return cfg


def _stores_head(directory: Path) -> bool:
    from safetensors import SafetensorError, safe_open

    for file in sorted(directory.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                if "lm_head.weight" in f.keys():  # noqa: SIM118 - safe_open is not a dict
                    return True
        except (OSError, RuntimeError, SafetensorError) as e:  # truncated or corrupt
            raise ModelLoadError(f"cannot read {file}: {str(e).splitlines()[0]}") from None
    return False


def build_model(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> CausalLM:
    """Allocate the model on `device` without running any weight initialisation."""
    with torch.device("meta"):
        model = CausalLM(cfg)
    try:
        return model.to(dtype).to_empty(device=device).eval().requires_grad_(False)
    except (RuntimeError, MemoryError) as e:  # such as a config's typo of a vocabulary
        gb = cfg.num_params * torch.finfo(dtype).bits / 8e9
        raise ModelLoadError(
            f"cannot allocate the model's {gb:,.1f} GB of weights on {device}: "
            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None


def init_dummy_weights(model: CausalLM, seed: int = 0) -> None:
    gen = torch.Generator(device=model.embed_tokens.weight.device).manual_seed(seed)
    for name, p in model.named_parameters():
        if "norm" in name:
            p.fill_(1.0)
        elif name.endswith("bias"):
            p.zero_()
        else:
            p.normal_(0.0, 0.02, generator=gen)


def _target(name: str, cfg: ModelConfig) -> tuple[str, int, int] | None:
    """HF tensor name -> (our parameter, row start, row count) or None to skip it."""
    name = name.removeprefix("model.")
    if name.startswith("lm_head") and cfg.tie_word_embeddings:
        return None
    if "rotary_emb" in name:
        return None
    q, kv, i = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    fused = {
        "self_attn.q_proj": ("self_attn.qkv_proj", 0, q),
        "self_attn.k_proj": ("self_attn.qkv_proj", q, kv),
        "self_attn.v_proj": ("self_attn.qkv_proj", q + kv, kv),
        "mlp.gate_proj": ("mlp.gate_up_proj", 0, i),
        "mlp.up_proj": ("mlp.gate_up_proj", i, i),
    }
    for hf, (ours, start, rows) in fused.items():
        if f".{hf}." in name:
            return name.replace(hf, ours), start, rows
    return name, 0, -1


def load_checkpoint_weights(model: CausalLM, directory: Path) -> None:
    from safetensors import SafetensorError, safe_open

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{directory} has no .safetensors weights")
    params = dict(model.named_parameters())
    filled: dict[str, int] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open is not a dict
                    target = _target(key, model.cfg)
                    if target is None:
                        continue
                    ours, start, rows = target
                    if ours not in params:
                        raise ModelLoadError(f"{file.name}: unexpected tensor {key!r}")
                    tensor = f.get_tensor(key)
                    dest = params[ours] if rows < 0 else params[ours].narrow(0, start, rows)
                    if dest.shape != tensor.shape:
                        raise ModelLoadError(
                            f"{file.name}: {key} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}"
                        )
                    dest.copy_(tensor)
                    filled[ours] = filled.get(ours, 0) + tensor.numel()
        except (OSError, RuntimeError, SafetensorError) as e:  # truncated or corrupt
            raise ModelLoadError(f"cannot read {file}: {str(e).splitlines()[0]}") from None
    missing = [n for n, p in params.items() if filled.get(n, 0) != p.numel()]
    if missing:
        raise ModelLoadError(
            f"checkpoint {directory} lacks weights for {missing[0]} (+{len(missing) - 1} more)"
        )


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(source: ModelSource):
    """The checkpoint's tokenizer, or None for weights without one (the engine then takes ids)."""
    if source.path is None or not any((source.path / f).is_file() for f in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source.path))
    except Exception as e:  # transformers raises many types here
        raise ModelLoadError(
            f"cannot load the tokenizer from {source.path}: {str(e).splitlines()[0]}"
        ) from None
    # the engine checks lengths against the model's window itself; silence the tokenizer's warning
    tokenizer.model_max_length = 1 << 62
    return tokenizer
