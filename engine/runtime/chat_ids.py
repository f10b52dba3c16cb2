"""Chat prompts that hold an earlier answer's own token ids.

An answer stored as text and rendered again through the chat template is re-tokenized, and
the tokenizer may split it otherwise than the model generated it (" foo" + "bar" comes back
as " foobar"). The KV of that turn is of the generated ids, so the next prompt would share
it only up to the answer's start. A message with "token_ids" is pinned: the template renders
a unique sentinel as its content, the text around the sentinels is encoded as
apply_chat_template(tokenize=True) encodes a whole prompt (no added special tokens), and the
pinned ids go in the sentinels' places.
"""

from __future__ import annotations

import re
import uuid

PINNED = "token_ids"  # the message key of an answer's generated ids (templates ignore it)


def pinned_chat_ids(
    tokenizer, messages: list[dict], add_generation_prompt: bool, extra: dict
) -> list[int] | None:
    """The prompt's ids with each pinned message's ids in place of its content; None when
    no message is pinned, or the template did not render each sentinel once, in order (it
    dropped or changed a content): the caller then renders the text as it is."""
    pinned = [i for i, m in enumerate(messages) if m.get(PINNED)]
    if not pinned:
        return None
    tag = uuid.uuid4().hex
    sentinel = {i: f"\x00pinned-{tag}-{i}\x00" for i in pinned}
    rendered = [
        {k: v for k, v in m.items() if k != PINNED}
        | ({"content": sentinel[i]} if i in sentinel else {})
        for i, m in enumerate(messages)
    ]
    text = tokenizer.apply_chat_template(
        rendered, add_generation_prompt=add_generation_prompt, tokenize=False, **extra
    )
    parts = re.split("(" + "|".join(map(re.escape, sentinel.values())) + ")", text)
    if parts[1::2] != list(sentinel.values()):
        return None
    ids: list[int] = []
    for k, part in enumerate(parts):
        if k % 2:
            ids += [int(t) for t in messages[pinned[k // 2]][PINNED]]
        elif part:
            ids += tokenizer(part, add_special_tokens=False)["input_ids"]
    return ids


def chat_template_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True,
                      tools: list[dict] | None = None) -> list[int]:  # fmt: skip
    """The chat template's tokens; `tools` (JSON schemas) for templates that take them. A
    message with "token_ids" keeps exactly those ids (pinned_chat_ids)."""
    extra = {"tools": tools} if tools else {}
    pinned = pinned_chat_ids(tokenizer, messages, add_generation_prompt, extra)
    if pinned is not None:
        return pinned
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, **extra
    )
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # BatchEncoding in newer transformers
        ids = ids["input_ids"]
    return list(ids)
