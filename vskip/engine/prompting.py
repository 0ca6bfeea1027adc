"""Turning a user request into the verifier's prompt token ids, through its chat template."""

from __future__ import annotations


def encode_chat(tokenizer, user_text: str, system: str | None = None) -> list[int]:
    """Token ids of a one-turn chat ending in the assistant's generation prompt.

    When ``system`` is None the template's own default applies (SmolLM2 inserts one). A template
    with a thinking switch (Qwen3's ``enable_thinking``) gets it off, as the paper runs its
    verifiers: the answer starts after an empty thinking block.
    """
    if not user_text or not user_text.strip():
        raise ValueError("the prompt is empty")
    messages = [{"role": "user", "content": user_text}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    if not getattr(tokenizer, "chat_template", None):
        return list(tokenizer(user_text)["input_ids"])
    return encode_messages(tokenizer, messages)


def encode_messages(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a chat (``role``/``content`` dicts) ending in the assistant's generation prompt,
    through the tokenizer's chat template (the thinking switch off, as :func:`encode_chat`)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this verifier's tokenizer has no chat template: use /v1/completions with a plain prompt")
    extra = {"enable_thinking": False} if _has_thinking_switch(tokenizer.chat_template) else {}
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **extra)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _has_thinking_switch(template) -> bool:
    texts = template.values() if isinstance(template, dict) else [template]
    return any("enable_thinking" in str(t) for t in texts)
