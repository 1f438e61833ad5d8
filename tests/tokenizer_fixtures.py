"""Small real tokenizers, trained offline in seconds on the HealthBench test data.

Three flavours cover the vocabularies the rubric grammar must handle:
- ``byte_level_bpe()``: GPT-2 style (byte-level alphabet, GPT-2 pre-tokenisation regex);
- ``byte_level_bpe(use_regex=False)``: byte-level BPE merged across word and punctuation
  boundaries, so it learns tokens such as ``]Ġ``, ``[3``, ``3]Ġ``, ``.Ċ[`` and ``]ĠThe``;
- ``metaspace_bpe()``: Llama-2 style (``▁`` for spaces, ``<0xNN>`` byte fallback, newline
  only as ``<0x0A>``, a decoder that strips the leading space).
Each is a ``transformers.PreTrainedTokenizerFast`` with eos/pad and a ChatML chat template,
cached per process.
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

DATA = Path(__file__).parent / "data" / "healthbench_oss_eval_30examples.jsonl"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@functools.lru_cache(maxsize=None)
def healthbench_rows() -> tuple[dict, ...]:
    """The 30 HealthBench rows (chat prompt, physician rubric)."""
    with DATA.open(encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def healthbench_criteria() -> list[str]:
    """Every rubric criterion as one stripped line (newlines inside become spaces)."""
    return [" ".join(item["criterion"].split()) for row in healthbench_rows() for item in row["rubrics"]]


def synthetic_rubrics(n_lines: int = 400, seed: int = 0) -> list[str]:
    """Rubric documents of 2-8 lines ``[w] criterion``, weights in -10..10 without 0.

    Criteria are real HealthBench criteria or ``The answer mentions <words>.``, so BPE
    learns merges of brackets, weights, spaces, text and newlines.
    """
    rng = random.Random(seed)
    criteria = healthbench_criteria()
    words = " ".join(criteria).split()
    lines = []
    for _ in range(n_lines):
        w = rng.choice([w for w in range(-10, 11) if w])
        if rng.random() < 0.5:
            text = rng.choice(criteria)
        else:
            text = "The answer mentions " + " ".join(rng.choices(words, k=rng.randint(1, 4))) + "."
        lines.append(f"[{w}] {text}\n")
    docs, i = [], 0
    while i < len(lines):
        k = rng.randint(2, 8)
        docs.append("".join(lines[i:i + k]))
        i += k
    return docs


def corpus() -> list[str]:
    """Training text: HealthBench prompts and criteria plus synthetic rubrics."""
    texts = [m["content"] for row in healthbench_rows() for m in row["prompt"]]
    return texts + healthbench_criteria() + synthetic_rubrics()


def _wrap(tokenizer: Tokenizer, *, eos: str, pad: str) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=eos,
        pad_token=pad,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


@functools.lru_cache(maxsize=None)
def byte_level_bpe(use_regex: bool = True, vocab_size: int = 1500) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (eos ``<|endoftext|>``, pad ``<pad>``)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    return _wrap(tok, eos="<|endoftext|>", pad="<pad>")


@functools.lru_cache(maxsize=None)
def metaspace_bpe(vocab_size: int = 1000) -> PreTrainedTokenizerFast:
    """A Llama-2 style sentencepiece BPE: ids 0-3 special, 4-259 ``<0xNN>``, then pieces.

    Trained on text without newlines, so a newline is only ever the byte token ``<0x0A>``.
    """
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    tok.train_from_iterator([line for text in corpus() for line in text.splitlines()], trainer)
    spec = json.loads(tok.to_str())
    vocab = {piece: i if i < len(specials) else i + 256 for piece, i in spec["model"]["vocab"].items()}
    vocab.update({f"<0x{b:02X}>": len(specials) + b for b in range(256)})
    spec["model"].update(vocab=vocab, byte_fallback=True)
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0},
    ]}
    return _wrap(Tokenizer.from_str(json.dumps(spec)), eos="</s>", pad="<pad>")


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, folder: Path) -> Path:
    """Saves with ``save_pretrained`` so that ``AutoTokenizer.from_pretrained`` loads it."""
    tokenizer.save_pretrained(str(folder))
    return folder
