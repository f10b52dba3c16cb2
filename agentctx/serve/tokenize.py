"""POST /tokenize, as vLLM has it: {"model", "prompt"} counts a text's tokens,
{"model", "messages", "tools", "add_generation_prompt"} those of a chat prompt in the
model's template, either as {"count", "max_model_len", "tokens"}. A remote backend packs
with it (agentctx.remote.tokens), so its budget is the engine's own count."""

from __future__ import annotations

from agentctx.serve.openai_schema import ApiError, parse_chat


def tokenize(engine, body) -> dict:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if engine.tokenizer is None:
        raise ApiError(400, "this model has no tokenizer")
    if "messages" in body:
        req = parse_chat({**body, "model": body.get("model") or "-"}, engine.max_model_len)
        prompt = body.get("add_generation_prompt", True)
        if not isinstance(prompt, bool):
            raise ApiError(400, "'add_generation_prompt' must be true or false",
                           "add_generation_prompt")  # fmt: skip
        try:
            ids = engine.chat_tokens(req.messages, add_generation_prompt=prompt, tools=req.tools)
        except Exception as e:  # jinja's errors, and the template's own raise_exception
            raise ApiError(400, f"the chat template cannot render these messages: {e}",
                           "messages") from None  # fmt: skip
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise ApiError(400, "'prompt' (a string) or 'messages' is required", "prompt")
        ids = engine.tokenizer.encode(
            prompt, add_special_tokens=body.get("add_special_tokens") is True
        )
    return {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": list(ids)}
