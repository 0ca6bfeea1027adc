"""Turning a user request into the verifier's prompt token ids, through its chat template."""

from __future__ import annotations


def encode_chat(tokenizer, user_text: str, system: str | None = None) -> list[int]:
    """Token ids of a one-turn chat ending in the assistant's generation prompt.

    When ``system`` is None the template's own default applies (SmolLM2 inserts one).
    """
    if not user_text or not user_text.strip():
        raise ValueError("the prompt is empty")
    messages = [{"role": "user", "content": user_text}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(user_text)["input_ids"])
