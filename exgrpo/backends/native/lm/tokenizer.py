"""A character-level tokenizer for the tiny-lm tier (no hub, no `tokenizers` model file).

One token per character of a fixed alphabet (digits, arithmetic operators, space, the characters
of ``\\boxed{}``, lowercase letters and a little punctuation) plus four specials at fixed ids:
``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2, ``<unk>`` = 3. The vocabulary is saved as a small
JSON file next to the model (``save`` / ``load``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "<unk>")
DEFAULT_CHARS: str = "0123456789" + "+-*/=?()., :" + "\\{}" + "abcdefghijklmnopqrstuvwxyz"
"""55 tokens in all with the specials (an LM vocabulary well under 64)."""

VOCAB_FILE = "char_vocab.json"


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
