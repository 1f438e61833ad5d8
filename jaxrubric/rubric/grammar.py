"""The rubric grammar: a token-level finite-state machine that keeps a generator inside the
rubric format, and a jittable parser of what it generates.

Format, defined on the bytes of the decoded text (one item per line)::

    rubric := item{1..M} END          item := "[" WEIGHT "]" " " TEXT "\\n"

- ``WEIGHT`` is the decimal spelling ``str(w)`` of one of the configured integer weights (no
  ``+``, no leading zeros, ``-`` for negatives).
- ``TEXT`` (the criterion) is non-empty, well-formed UTF-8 without ``\\n`` or ``\\r``, and
  its first byte is not ASCII whitespace, so exactly one space separates ``]`` from it.
  Everything else, ``[`` and ``]`` included, is criterion text. At most
  ``max_item_tokens`` (Li) tokens carry an item's text.
- ``END`` is the end token (a special token, e.g. eos). It is allowed only at the start of
  a line after at least one complete item; after M items it is the only choice.

Tokens never mix criterion text with weight syntax (``[``, digits, ``-``, ``]``): a token
may carry criterion text with the whitespace around it (``Ġthe``, ``.Ċ``), or structure
only (``[``, ``3]Ġ``, ``Ċ[``), but not ``]Ġthe`` or ``.Ċ[``. So an item's tokens are
exactly the tokens that carry its text, and they decode to the criterion with at most the
separating space in front and the newline behind. Pre-tokenisation regexes (GPT-2,
Llama 3, Qwen) never produce the excluded merges when they tokenise a rubric, so a model
loses nothing; where one would, it spells it in two tokens. Special tokens other than the
end token are never allowed.

Tokens are read as bytes: each token's text is decoded after a fixed one-letter anchor
token (sentencepiece decoders strip a leading space from the first token, so a lone
``▁the`` would decode to ``the``). Tokens that are not valid UTF-8 on their own (pieces
of a multi-byte character: GPT-2 byte tokens, ``<0xNN>`` byte fallback) are recovered as
raw bytes and allowed inside criterion text, where the automaton tracks UTF-8 so that
every character is completed before the line ends (a dangling byte would make decoders
disagree: byte fallback swallows a newline that follows one).

Machine: a byte automaton of the format whose states encode the line position and, from
``]`` on, the weight (the states "after ``]``", "after the space", "in text" and the
UTF-8 continuation states exist per weight), so the parser reads an item's weight off the
state. The token automaton's state is ``(byte state c, items completed m, text tokens in
the current item t)``, packed in one int32. Its transitions are stored factored:
``table[c, token_class[v]]`` holds what the byte automaton does with token ``v`` from
``c`` (next byte state, whether the token carries text, completes an item, how many
continuation bytes are still owed), and m and t are checked and updated with arithmetic.
Tokens whose bytes act alike share a class (all plain words do), so the table has about
a thousand columns for a 150k vocabulary rather than one per token; a dense ``[S, V]``
table over all ``(c, m, t)`` would have C·(M+1)·(Li+1) rows (65k for weights 1..5,
M=16, Li=64).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# Byte classes: the automaton's alphabet. Digits 0..9 are classes _DIGIT0 .. _DIGIT0 + 9.
(_LBRACK, _RBRACK, _MINUS, _SPACE, _NEWLINE, _WS, _CR, _ASCII,
 _CONT_80, _CONT_90, _CONT_A0, _LEAD2, _LEAD_E0, _LEAD3, _LEAD_ED, _LEAD_F0, _LEAD4, _LEAD_F4,
 _BAD, _DIGIT0) = range(20)
_NUM_CLASSES = _DIGIT0 + 10
_CONTINUATIONS = (_CONT_80, _CONT_90, _CONT_A0)
_NOT_FIRST_TEXT = (_SPACE, _NEWLINE, _WS, _CR)


def _byte_classes() -> bytes:
    """A 256-byte translation table from byte value to byte class."""
    table = bytearray([_ASCII] * 128 + [_BAD] * 128)
    for char, cls in (("[", _LBRACK), ("]", _RBRACK), ("-", _MINUS), (" ", _SPACE),
                      ("\n", _NEWLINE), ("\t", _WS), ("\x0b", _WS), ("\x0c", _WS), ("\r", _CR)):
        table[ord(char)] = cls
    for digit in range(10):
        table[ord("0") + digit] = _DIGIT0 + digit
    for first, last, cls in ((0x80, 0x8F, _CONT_80), (0x90, 0x9F, _CONT_90), (0xA0, 0xBF, _CONT_A0),
                             (0xC2, 0xDF, _LEAD2), (0xE0, 0xE0, _LEAD_E0), (0xE1, 0xEF, _LEAD3),
                             (0xED, 0xED, _LEAD_ED), (0xF0, 0xF0, _LEAD_F0), (0xF1, 0xF3, _LEAD4),
                             (0xF4, 0xF4, _LEAD_F4)):
        table[first:last + 1] = bytes([cls]) * (last + 1 - first)
    return bytes(table)


_BYTE_CLASS = _byte_classes()
# A well-formed multi-byte UTF-8 character acts exactly like one plain ASCII byte (text
# where text may be, rejected elsewhere), and so does a run of plain ASCII bytes; folding
# both keeps the number of distinct token classes small.
_MULTIBYTE_CHAR = re.compile(
    rb"[\xc2-\xdf][\x80-\xbf]|\xe0[\xa0-\xbf][\x80-\xbf]|[\xe1-\xec\xee\xef][\x80-\xbf]{2}"
    rb"|\xed[\x80-\x9f][\x80-\xbf]|\xf0[\x90-\xbf][\x80-\xbf]{2}|[\xf1-\xf3][\x80-\xbf]{3}"
    rb"|\xf4[\x80-\x8f][\x80-\xbf]{2}"
)
_ASCII_RUN = re.compile(bytes([_ASCII]) + b"+")

# Per-weight block of byte states: after "]", after the space, in text, then UTF-8
# continuation states (offset: bytes still owed, {continuation class: next offset}).
_AFTER_CLOSE, _AFTER_SPACE, _IN_TEXT, _BLOCK = 0, 1, 2, 10
_PENDING = {
    3: (1, dict.fromkeys(_CONTINUATIONS, _IN_TEXT)),
    4: (2, dict.fromkeys(_CONTINUATIONS, 3)),
    5: (2, {_CONT_A0: 3}),  # after E0
    6: (2, {_CONT_80: 3, _CONT_90: 3}),  # after ED
    7: (3, dict.fromkeys(_CONTINUATIONS, 4)),
    8: (3, {_CONT_90: 4, _CONT_A0: 4}),  # after F0
    9: (3, {_CONT_80: 4}),  # after F4
}
_LEADS = {_LEAD2: 3, _LEAD3: 4, _LEAD_E0: 5, _LEAD_ED: 6, _LEAD4: 7, _LEAD_F0: 8, _LEAD_F4: 9}

# Table entry: next byte state << 4 | owed bytes << 2 | carries text << 1 | completes item.
_FORBIDDEN = -1
# Token classes 0 and 1: never allowed (special, unknown, empty) and the end token.
_CLASS_NEVER, _CLASS_END = 0, 1


def _gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of the GPT-2 byte-level alphabet (bytes shown as printable characters)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    mapping = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            mapping[chr(256 + extra)] = b
            extra += 1
    return mapping


_UNICODE_TO_BYTE = _gpt2_unicode_to_byte()
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["table", "token_class", "state_weight"],
    meta_fields=["weights", "max_items", "max_item_tokens", "end_token_id", "num_line_states"],
)
@dataclasses.dataclass(frozen=True, eq=False)
class RubricGrammar:
    """The token automaton of the rubric format (a pytree: tables are leaves, sizes static).

    Built on the host with numpy tables; ``jax.device_put(grammar)`` gives the device copy
    that ``apply_grammar``, ``advance`` and ``parse_rubric_tokens`` use inside jit.

    Byte states: 0 is the start of a line, ``1 .. num_line_states - 1`` the weight prefixes
    after ``[`` (1 is just ``[``), then a block of 10 per weight (in ``weights`` order:
    after ``]``, after the space, in text, 7 UTF-8 continuation states); the last two are
    FINAL (end token read) and DEAD (a forbidden token was read).
    """

    table: Any  # [C, K] int32 entries (see _FORBIDDEN), per byte state and token class
    token_class: Any  # [V] int32
    state_weight: Any  # [C] int32: the weight a byte state carries (0 where none)
    weights: tuple[int, ...]
    max_items: int
    max_item_tokens: int
    end_token_id: int
    num_line_states: int

    @property
    def vocab_size(self) -> int:
        return self.token_class.shape[0]

    @property
    def num_byte_states(self) -> int:
        return self.table.shape[0]

    @property
    def final_byte_state(self) -> int:
        return self.num_byte_states - 2

    @property
    def dead_byte_state(self) -> int:
        return self.num_byte_states - 1

    @property
    def num_states(self) -> int:
        """Size of the packed token-level state space C·(M+1)·(Li+1)."""
        return self.num_byte_states * (self.max_items + 1) * (self.max_item_tokens + 1)

    @property
    def start_state(self) -> int:
        """Packed state before the first token (line start, no items, no text)."""
        return 0

    @property
    def max_rubric_tokens(self) -> int:
        """Longest token sequence the grammar admits, end token included (a safe Lrub)."""
        return max_rubric_tokens(self.weights, self.max_items, self.max_item_tokens)


class ParsedRubric(NamedTuple):
    """Token-level parse of generated rubrics; leading dims are those of the tokens.

    Only complete items (newline read before any violation) are valid; other rows hold
    pad ids, length 0 and weight 0. ``token_item`` gives, per generated token, the item
    whose text it carries (-1 for structure, padding and tokens of invalid items): the
    per-token credit assignment of token-level GRPO.
    """

    items: jax.Array  # [..., M, Li] int32
    item_lengths: jax.Array  # [..., M] int32
    weights: jax.Array  # [..., M] int32
    valid: jax.Array  # [..., M] bool
    token_item: jax.Array  # [..., L] int32
    complete: jax.Array  # [...] bool: the end token was read and nothing was forbidden


# ----------------------------------------------------------------------------- host side


def token_bytes(tokenizer: Any) -> list[bytes | None]:
    """The bytes each token id adds to decoded text; None for ids never to be generated.

    Accepts a ``transformers`` fast tokenizer, a ``tokenizers.Tokenizer``, or a sequence
    whose entry ``i`` is token ``i``'s text (str or bytes; None to forbid it). Special
    tokens and ids whose bytes cannot be recovered map to None.
    """
    if isinstance(tokenizer, Sequence) and not isinstance(tokenizer, (str, bytes)):
        return [t.encode("utf-8") if isinstance(t, str) else t for t in tokenizer]
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not hasattr(backend, "decode_batch"):
        raise TypeError(f"need a fast tokenizer or a list of token strings, got {type(tokenizer)}")
    vocab = backend.get_vocab(with_added_tokens=True)
    special = {i for i, tok in backend.get_added_tokens_decoder().items() if tok.special}
    special |= set(getattr(tokenizer, "all_special_ids", ()))
    pieces: list[str | None] = [None] * (max(vocab.values()) + 1)
    for piece, i in vocab.items():
        pieces[i] = piece
    anchor, prefix = _anchor(backend, vocab, special)
    ids = [i for i, piece in enumerate(pieces) if piece is not None and i not in special]
    texts = backend.decode_batch([[anchor, i] for i in ids], skip_special_tokens=False)
    out: list[bytes | None] = [None] * len(pieces)
    for i, text in zip(ids, texts):
        if text.startswith(prefix):
            out[i] = _recover_bytes(pieces[i], text[len(prefix):])
    return out


def _anchor(backend: Any, vocab: dict[str, int], special: set[int]) -> tuple[int, str]:
    """A one-letter token whose decoded text simply concatenates with what follows it."""
    for letter in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ":
        i = vocab.get(letter)
        if i is not None and i not in special:
            if backend.decode([i, i], skip_special_tokens=False) == letter * 2:
                return i, letter
    raise ValueError("the vocabulary has no single-letter token to decode tokens after")


def _recover_bytes(piece: str, text: str) -> bytes | None:
    """Bytes of a token from its decoded text, or from its piece where that is partial UTF-8."""
    if "\ufffd" not in text:
        return text.encode("utf-8")
    fallback = _BYTE_FALLBACK.fullmatch(piece)
    if fallback:
        return bytes([int(fallback.group(1), 16)])
    if all(ch in _UNICODE_TO_BYTE for ch in piece):
        data = bytes(_UNICODE_TO_BYTE[ch] for ch in piece)
        if data.decode("utf-8", errors="replace") == text:
            return data
    return None


def _class_string(piece: bytes) -> bytes:
    """A token's bytes as byte classes, with characters and ASCII runs folded (see above)."""
    return _ASCII_RUN.sub(bytes([_ASCII]), _MULTIBYTE_CHAR.sub(b"a", piece).translate(_BYTE_CLASS))


class _ByteAutomaton(NamedTuple):
    """The format over byte classes; row ``C`` is a scratch absorbing reject state."""

    delta: np.ndarray  # [C + 1, K] next state
    text: np.ndarray  # [C + 1, K] the byte is criterion text
    syntax: np.ndarray  # [C + 1, K] the byte is weight syntax ([, digits, -, ])
    owed: np.ndarray  # [C + 1] continuation bytes a state still needs
    state_weight: np.ndarray  # [C] int32
    num_line_states: int


def _byte_automaton(weights: tuple[int, ...]) -> _ByteAutomaton:
    """Line start, a trie of weight spellings after "[", a block of states per weight."""
    spellings = [str(w) for w in weights]
    prefixes = sorted({s[:k] for s in spellings for k in range(len(s) + 1)}, key=lambda p: (len(p), p))
    trie = {p: 1 + k for k, p in enumerate(prefixes)}  # "" is state 1: just read "["
    num_line = 1 + len(trie)
    num_states = num_line + _BLOCK * len(weights) + 2  # + FINAL, DEAD (no byte edges)
    reject = num_states
    delta = np.full((num_states + 1, _NUM_CLASSES), reject, np.int32)
    text = np.zeros(delta.shape, bool)
    syntax = np.zeros(delta.shape, bool)
    owed = np.zeros(num_states + 1, np.int32)
    state_weight = np.zeros(num_states, np.int32)

    def edge(state: int, classes: Iterable[int], nxt: int, *, is_text: bool = False,
             is_syntax: bool = False) -> None:
        classes = list(classes)
        delta[state, classes], text[state, classes], syntax[state, classes] = nxt, is_text, is_syntax

    edge(0, [_LBRACK], trie[""], is_syntax=True)
    for prefix, state in trie.items():
        for ch in "-0123456789":
            if prefix + ch in trie:
                edge(state, [_BYTE_CLASS[ord(ch)]], trie[prefix + ch], is_syntax=True)
    plain = [c for c in range(_NUM_CLASSES) if c not in (_NEWLINE, _CR, _BAD, *_CONTINUATIONS, *_LEADS)]
    for k, (w, spelling) in enumerate(zip(weights, spellings)):
        base = num_line + _BLOCK * k
        state_weight[base:base + _BLOCK] = w
        edge(trie[spelling], [_RBRACK], base + _AFTER_CLOSE, is_syntax=True)
        edge(base + _AFTER_CLOSE, [_SPACE], base + _AFTER_SPACE)
        for start, allowed in ((_AFTER_SPACE, [c for c in plain if c not in _NOT_FIRST_TEXT]),
                               (_IN_TEXT, plain)):
            edge(base + start, allowed, base + _IN_TEXT, is_text=True)
            for lead, pending in _LEADS.items():
                edge(base + start, [lead], base + pending, is_text=True)
        edge(base + _IN_TEXT, [_NEWLINE], 0)
        for pending, (debt, moves) in _PENDING.items():
            owed[base + pending] = debt
            for cls, nxt in moves.items():
                edge(base + pending, [cls], base + nxt, is_text=True)
    return _ByteAutomaton(delta, text, syntax, owed, state_weight, num_line)


def _run_automaton(auto: _ByteAutomaton, class_strings: list[bytes]) -> tuple[np.ndarray, ...]:
    """Runs every class string from every byte state at once: (end state, has text, has syntax).

    Strings are processed longest first, so the strings still running at position p are a
    prefix of the order and each step is one slice-wide table lookup.
    """
    num_states = auto.delta.shape[0] - 1
    lengths = np.fromiter((len(s) for s in class_strings), np.int64, len(class_strings))
    order = np.argsort(-lengths, kind="stable")
    flat = np.frombuffer(b"".join(class_strings[i] for i in order), np.uint8)
    starts = np.concatenate([[0], np.cumsum(lengths[order])[:-1]]).astype(np.int64)
    ascending = lengths[order][::-1]
    running = len(order) - np.searchsorted(ascending, np.arange(lengths.max(initial=0)), side="right")
    state = np.repeat(np.arange(num_states, dtype=np.int32)[:, None], len(order), axis=1)
    has_text = np.zeros(state.shape, bool)
    has_syntax = np.zeros(state.shape, bool)
    for pos, count in enumerate(running):
        cls = flat[starts[:count] + pos]
        cur = state[:, :count]
        has_text[:, :count] |= auto.text[cur, cls]
        has_syntax[:, :count] |= auto.syntax[cur, cls]
        state[:, :count] = auto.delta[cur, cls]
    unsort = np.empty_like(order)
    unsort[order] = np.arange(len(order))
    return state[:, unsort], has_text[:, unsort], has_syntax[:, unsort]


# The item weights of each method's rubrics: DynamicRubric's positive importances, and
# GenRubric's signed ones (negative items penalise an observable error).
POSITIVE_WEIGHTS: tuple[int, ...] = (1, 2, 3, 4, 5)
SIGNED_WEIGHTS: tuple[int, ...] = (-5, -4, -3, -2, -1, 1, 2, 3, 4, 5)


def max_rubric_tokens(weights: Iterable[int], max_items: int, max_item_tokens: int) -> int:
    """Longest token sequence a grammar of these weights and sizes admits, end token included:
    per item `[`, the weight's digits, `]`, a space, up to Li text tokens and a newline."""
    weight_len = max(len(str(w)) for w in weights)
    per_item = 1 + weight_len + 1 + 1 + max_item_tokens + 1
    return max_items * per_item + 1


def build_rubric_grammar(
    tokenizer_or_vocab: Any,
    *,
    weights: Iterable[int] = POSITIVE_WEIGHTS,
    max_items: int = 16,
    max_item_tokens: int = 64,
    end_token_id: int | None = None,
) -> RubricGrammar:
    """Builds the token automaton of the rubric format for a vocabulary (host side, numpy).

    ``tokenizer_or_vocab`` is anything ``token_bytes`` accepts. ``end_token_id`` defaults to
    the tokenizer's eos id. Raises ValueError if the vocabulary cannot always finish a
    rubric: it needs single tokens for ``[``, ``]``, space, newline, and each character of
    the weights' spellings.
    """
    weights = tuple(int(w) for w in weights)
    if not weights or len(set(weights)) != len(weights):
        raise ValueError(f"weights must be distinct and non-empty, got {weights}")
    if max_items < 1 or max_item_tokens < 1:
        raise ValueError("max_items and max_item_tokens must be at least 1")
    if end_token_id is None:
        end_token_id = getattr(tokenizer_or_vocab, "eos_token_id", None)
        if end_token_id is None:
            raise ValueError("no end_token_id given and the tokenizer has no eos token")
    pieces = token_bytes(tokenizer_or_vocab)
    if not 0 <= end_token_id < len(pieces):
        raise ValueError(f"end_token_id {end_token_id} outside the vocabulary of {len(pieces)}")
    pieces[end_token_id] = None

    singles = {p for p in pieces if p is not None and len(p) == 1}
    needed = {b"[", b"]", b" ", b"\n"} | {ch.encode() for w in weights for ch in str(w)}
    if needed - singles:
        raise ValueError(f"vocabulary lacks single tokens for {sorted(needed - singles)}")

    classes: dict[bytes, int] = {}
    token_class = np.full(len(pieces), _CLASS_NEVER, np.int32)
    for i, piece in enumerate(pieces):
        if piece:
            token_class[i] = 2 + classes.setdefault(_class_string(piece), len(classes))
    token_class[end_token_id] = _CLASS_END

    auto = _byte_automaton(weights)
    num_states = auto.state_weight.shape[0]
    end, has_text, has_syntax = _run_automaton(auto, list(classes))
    ok = (end < num_states) & ~(has_text & has_syntax)
    if not all(bytes([b]) in singles for b in range(0x80, 0xC0)):
        ok &= auto.owed[end] == 0  # a started character could not always be finished
    state_ids = np.arange(num_states)
    line_phase = state_ids < auto.num_line_states
    item_phase = ~line_phase & (state_ids < num_states - 2)
    completes = item_phase[:, None] & line_phase[np.minimum(end, num_states - 1)]
    codes = (end << 4) | (auto.owed[end] << 2) | (has_text.astype(np.int32) << 1) | completes
    table = np.full((num_states, 2 + len(classes)), _FORBIDDEN, np.int32)
    table[:, 2:] = np.where(ok, codes, _FORBIDDEN)
    final, dead = num_states - 2, num_states - 1
    table[[0, final, dead], _CLASS_END] = [final << 4, final << 4, dead << 4]
    return RubricGrammar(
        table=table,
        token_class=token_class,
        state_weight=auto.state_weight,
        weights=weights,
        max_items=int(max_items),
        max_item_tokens=int(max_item_tokens),
        end_token_id=int(end_token_id),
        num_line_states=auto.num_line_states,
    )


# ------------------------------------------------------------------------------ jax side


def _unpack(state: jax.Array, g: RubricGrammar) -> tuple[jax.Array, jax.Array, jax.Array]:
    t = state % (g.max_item_tokens + 1)
    rest = state // (g.max_item_tokens + 1)
    return rest // (g.max_items + 1), rest % (g.max_items + 1), t


def _pack(c: jax.Array, m: jax.Array, t: jax.Array, g: RubricGrammar) -> jax.Array:
    return (c * (g.max_items + 1) + m) * (g.max_item_tokens + 1) + t


def _token_class(token: jax.Array, g: RubricGrammar) -> jax.Array:
    """Class of each token id; ids outside the vocabulary are never allowed."""
    known = (token >= 0) & (token < g.vocab_size)
    return jnp.where(known, jnp.asarray(g.token_class)[jnp.clip(token, 0, g.vocab_size - 1)], _CLASS_NEVER)


def _step(state: jax.Array, code: jax.Array, g: RubricGrammar) -> tuple[jax.Array, ...]:
    """Applies table entries to states: (allowed, next state, carries text, completes item).

    The table decides the byte automaton; here the counters are checked: an item holds at
    most Li text tokens (counting those a started character still needs), at most M items
    complete, after M items only the end token may follow, and the end token needs one
    complete item. A forbidden token leads to DEAD, keeping the counters.
    """
    c, m, t = _unpack(state, g)
    nxt, owed, text, done = code >> 4, (code >> 2) & 3, (code >> 1) & 1, code & 1
    m_new = m + done
    ok = (
        (code >= 0)
        & (t + text + owed <= g.max_item_tokens)
        & ((m_new < g.max_items) | (nxt == 0) | (nxt >= g.final_byte_state))
        & ((nxt != g.final_byte_state) | (m > 0))
    )
    moved = _pack(nxt, m_new, jnp.where(done == 1, 0, t + text), g)
    dead = _pack(g.dead_byte_state, m, t, g)
    return ok, jnp.where(ok, moved, dead), ok & (text == 1), ok & (done == 1)


def allowed_tokens(state: jax.Array, g: RubricGrammar, vocab_size: int | None = None) -> jax.Array:
    """Bool mask [..., vocab_size] of the tokens the grammar allows after ``state`` [...].

    Ids at or beyond the grammar's vocabulary (a model's padded vocabulary) are forbidden.
    """
    vocab_size = g.vocab_size if vocab_size is None else vocab_size
    if vocab_size < g.vocab_size:
        raise ValueError(f"logits cover {vocab_size} ids, the grammar needs {g.vocab_size}")
    state = jnp.asarray(state, jnp.int32)
    c, _, _ = _unpack(state, g)
    classes = jnp.pad(jnp.asarray(g.token_class), (0, vocab_size - g.vocab_size),
                      constant_values=_CLASS_NEVER)
    ok, _, _, _ = _step(state[..., None], jnp.asarray(g.table)[c[..., None], classes], g)
    return ok


def apply_grammar(logits: jax.Array, state: jax.Array, g: RubricGrammar) -> jax.Array:
    """Logits [..., V'] with forbidden tokens set to a very negative finite value (no NaN)."""
    mask = allowed_tokens(state, g, logits.shape[-1])
    neg = max(-1e9, float(jnp.finfo(logits.dtype).min) / 2)
    return jnp.where(mask, logits, jnp.asarray(neg, logits.dtype))


def advance(state: jax.Array, token: jax.Array, g: RubricGrammar) -> jax.Array:
    """Next packed state after ``token`` (same shape as ``state``).

    A forbidden token leads to the DEAD state; after the end token the state stays FINAL
    whatever follows, so padding does not matter.
    """
    state = jnp.asarray(state, jnp.int32)
    c, _, _ = _unpack(state, g)
    code = jnp.asarray(g.table)[c, _token_class(jnp.asarray(token, jnp.int32), g)]
    _, moved, _, _ = _step(state, code, g)
    return jnp.where(c == g.final_byte_state, state, moved)


def is_final(state: jax.Array, g: RubricGrammar) -> jax.Array:
    """Whether the end token has been read (a complete, well-formed rubric)."""
    return _unpack(jnp.asarray(state), g)[0] == g.final_byte_state


def is_rejected(state: jax.Array, g: RubricGrammar) -> jax.Array:
    """Whether a forbidden token has been read."""
    return _unpack(jnp.asarray(state), g)[0] == g.dead_byte_state


def parse_rubric_tokens(tokens: jax.Array, g: RubricGrammar, pad_id: int) -> ParsedRubric:
    """Parses generated rubric tokens [..., L] into items (jittable, static shapes).

    Runs the automaton along each sequence; a token belongs to item m when it carries
    text while m items are complete, and an item's weight is read from the byte state in
    which its newline arrives. Tokens after the end token are ignored.
    """
    tokens = jnp.asarray(tokens, jnp.int32)
    flat = tokens.reshape(-1, tokens.shape[-1])
    parsed = jax.vmap(lambda seq: _parse_one(seq, g, pad_id))(flat)
    lead = tokens.shape[:-1]
    return ParsedRubric(*(x.reshape(*lead, *x.shape[1:]) for x in parsed))


def _parse_one(tokens: jax.Array, g: RubricGrammar, pad_id: int) -> ParsedRubric:
    num_items, item_len = g.max_items, g.max_item_tokens
    classes = _token_class(tokens, g)

    def body(state, cls):
        c, m, t = _unpack(state, g)
        _, moved, text, done = _step(state, jnp.asarray(g.table)[c, cls], g)
        live = c != g.final_byte_state
        return jnp.where(live, moved, state), (c, m, t, text & live, done & live)

    last, (c, m, t, text, done) = jax.lax.scan(body, jnp.int32(0), classes)
    slot = jnp.where(done, m, num_items)
    valid = jnp.zeros(num_items, bool).at[slot].set(True, mode="drop")
    weights = jnp.zeros(num_items, jnp.int32).at[slot].set(jnp.asarray(g.state_weight)[c], mode="drop")
    kept = text & valid[jnp.minimum(m, num_items - 1)]
    row = jnp.where(kept, m, num_items)
    items = jnp.full((num_items, item_len), pad_id, jnp.int32).at[row, t].set(tokens, mode="drop")
    lengths = jnp.zeros(num_items, jnp.int32).at[row].add(1, mode="drop")
    return ParsedRubric(
        items=items,
        item_lengths=lengths,
        weights=weights,
        valid=valid,
        token_item=jnp.where(kept, m, -1),
        complete=is_final(last, g),
    )
