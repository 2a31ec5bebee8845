"""What tasks need from a tokenizer, and the two the project uses.

* :class:`PromptTokenizer`: the protocol a task's prompts and rewards need (encode, decode);
* :class:`CharTokenizer`: the tiny-lm tier's character-level tokenizer (no hub, no model file);
* :func:`chat_prompt_ids`: ChatML prompt ids through an HF tokenizer's chat template (SmolLM2).

Tasks import tokenizers from here, never from a backend.

A character-level tokenizer for the tiny-lm tier (no hub, no `tokenizers` model file).

One token per character of a fixed alphabet (digits, arithmetic operators, space, the characters
of ``\\boxed{}``, lowercase letters and a little punctuation) plus four specials at fixed ids:
``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2, ``<unk>`` = 3. The vocabulary is saved as a small
JSON file next to the model (``save`` / ``load``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "<unk>")
DEFAULT_CHARS: str = "0123456789" + "+-*/=?()., :" + "\\{}" + "abcdefghijklmnopqrstuvwxyz"
"""55 tokens in all with the specials (an LM vocabulary well under 64)."""

VOCAB_FILE = "char_vocab.json"


class PromptTokenizer(Protocol):
    """What a task needs from a tokenizer."""

    def encode(self, text: str, *args: Any, **kwargs: Any) -> list[int]: ...

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str: ...


class CharTokenizer:
    """Maps text to token ids one character at a time.

    ``encode`` maps characters outside the alphabet to ``<unk>`` (``strict=True`` raises instead);
    ``decode`` drops the specials by default."""

    def __init__(self, chars: str = DEFAULT_CHARS) -> None:
        if len(set(chars)) != len(chars):
            raise ValueError("duplicate characters in the tokenizer alphabet")
        self.chars = chars
        self.id_to_token: list[str] = list(SPECIAL_TOKENS) + list(chars)
        self.token_to_id: dict[str, int] = {t: i for i, t in enumerate(self.id_to_token)}
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = 0, 1, 2, 3
        self.special_ids = frozenset(range(len(SPECIAL_TOKENS)))

    @property
    def vocab_size(self) -> int:
        return len(self.id_to_token)

    def __len__(self) -> int:
        return self.vocab_size

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and other.chars == self.chars

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False, strict: bool = False) -> list[int]:
        ids = [self.bos_id] if add_bos else []
        for ch in text:
            i = self.token_to_id.get(ch)
            if i is None or i in self.special_ids:
                if strict:
                    raise ValueError(f"character {ch!r} is not in the tokenizer alphabet")
                i = self.unk_id
            ids.append(i)
        if add_eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        out = []
        for i in ids:
            i = int(i)
            if skip_special_tokens and i in self.special_ids:
                continue
            out.append(self.id_to_token[i] if 0 <= i < self.vocab_size else SPECIAL_TOKENS[3])
        return "".join(out)

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict:
        return {"type": "char", "specials": list(SPECIAL_TOKENS), "chars": self.chars}

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / VOCAB_FILE
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    @classmethod
    def load(cls, directory: str | Path) -> CharTokenizer:
        path = Path(directory)
        if path.is_dir():
            path = path / VOCAB_FILE
        data = json.loads(path.read_text())
        if data.get("type") != "char" or tuple(data.get("specials", ())) != SPECIAL_TOKENS:
            raise ValueError(f"{path}: not a CharTokenizer vocabulary")
        return cls(data["chars"])


def chat_prompt_ids(tokenizer: Any, question: str | Sequence[dict[str, str]], system: str | None = None) -> list[int]:
    """Token ids of a ChatML prompt ending with the assistant header (``add_generation_prompt``).

    ``question`` is the user message text, or a full list of ``{"role", "content"}`` messages
    (e.g. an OpenR1 ``prompt`` cell); ``system`` prepends a system message (SmolLM2's template
    inserts its default system prompt when there is none)."""
    if isinstance(question, str):
        messages: list[dict[str, str]] = [{"role": "user", "content": question}]
    else:
        messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in question]
    if system is not None:
        messages = [{"role": "system", "content": system}] + [m for m in messages if m["role"] != "system"]
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys") and "input_ids" in out:  # transformers 5 returns a BatchEncoding
        out = out["input_ids"]
    if out and isinstance(out[0], list):
        out = out[0]
    return [int(i) for i in out]
