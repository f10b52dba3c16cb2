"""GGUF tokenizer metadata -> tokenizer.json and tokenizer_config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.errors import ModelLoadError
from engine.loading.gguf_config import write_json

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> how text is split before BPE. "gpt2" is GPT-2's own regex; "digits"
# splits every digit first, as llama.cpp does for these (and SmolLM2's tokenizer.json does).
_BYTE_LEVEL_SPLITS = {
    "default": "gpt2",
    "gpt-2": "gpt2",
    "gpt2": "gpt2",
    "smollm": "digits",
    "starcoder": "digits",
    "refact": "digits",
    "llama3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}
_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values


def write_tokenizer(src: Path, metadata: dict[str, Any], out: Path, max_len: int) -> None:
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if metadata.get("tokenizer.ggml.model") == "gpt2" and pre in _BYTE_LEVEL_SPLITS:
        _write_byte_level_tokenizer(metadata, out, _BYTE_LEVEL_SPLITS[pre], max_len)
    else:
        _write_tokenizer_via_transformers(src, metadata, out)


def _write_byte_level_tokenizer(
    metadata: dict[str, Any], out: Path, split: str, max_len: int
) -> None:
    # Built directly with `tokenizers` from the metadata we already parsed: transformers'
    # gguf_file path re-reads the whole file and takes ~3.5 s on the default model.
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )

    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    types: list[int] = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges", [])]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=split is _LLAMA3_SPLIT))
    if split in ("gpt2", "digits"):  # GPT-2's regex, which ByteLevel runs itself
        steps = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        if split == "digits":
            steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
    else:  # the model's own regex first, then only the byte-to-unicode mapping
        steps = [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    tok.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    # Control tokens (<|im_start|>...) and user-defined ones must match whole, never be split.
    kinds = list(zip(tokens, types, strict=False))
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in kinds if k == _CONTROL]
    )
    tok.add_tokens([AddedToken(t, normalized=False) for t, k in kinds if k == _USER_DEFINED])

    def token(key: str) -> str | None:
        i = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    bos, eos = token("bos"), token("eos")
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", False)) and bos is not None
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    if add_bos or add_eos:
        # The post-processor is what adds them, for any transformers version.
        pieces = ([f"{bos}:0"] if add_bos else []) + ["$A:0"] + ([f"{eos}:0"] if add_eos else [])
        specials = [(t, vocab[t]) for t, on in ((bos, add_bos), (eos, add_eos)) if on]
        tok.post_processor = processors.TemplateProcessing(
            single=" ".join(pieces),
            pair=" ".join(pieces + [p.replace("A:0", "B:1").replace(":0", ":1") for p in pieces]),
            special_tokens=list(dict.fromkeys(specials)),
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(str(out / "tokenizer.json"))

    tok_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": token("unknown"),
        "pad_token": token("padding"),
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
    }
    if template := metadata.get("tokenizer.chat_template"):
        tok_config["chat_template"] = template
    write_json(out / "tokenizer_config.json", tok_config)


def _write_tokenizer_via_transformers(src: Path, metadata: dict[str, Any], out: Path) -> None:
    # Slow (re-reads the file), but covers sentencepiece vocabularies (Mistral, Llama 2).
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        tok.save_pretrained(str(out))
    except Exception as e:  # transformers raises many types here; the user needs one line
        reason = " ".join(str(e).split())[:200]
        raise ModelLoadError(f"{src}: cannot build a tokenizer from this GGUF ({reason})") from e
    config_path = out / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text(encoding="utf-8"))
    if (template := metadata.get("tokenizer.chat_template")) and not tok_config.get(
        "chat_template"
    ):
        tok_config["chat_template"] = template  # older transformers look for it here only
        write_json(config_path, tok_config)
