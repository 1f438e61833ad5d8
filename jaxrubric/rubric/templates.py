"""Prompt templates of the rubric loop, pre-tokenised so prompts are assembled on token ids.

Four prompts, in our own words after the papers' principles:

- the DynamicRubric generator sees the user prompt and the K candidate responses and writes
  atomic, binary, positively framed, self-contained criteria that separate the candidates;
- the GenRubric generator sees the prompt alone and writes positive items (weights 1..5) and
  negative items naming observable errors (weights -1..-5);
- the verifier sees the prompt, one response and one criterion and answers yes or no; the
  criterion comes last, so that the prompt and response form a prefix shared by every item;
- the rubric-induced response prompt (GenRubric) asks for an answer that satisfies a rubric.

Every prompt is one user message rendered by the tokenizer's chat template (or a plain
``User: ...`` / ``Assistant:`` format when it has none). A `TokenTemplate` is that rendering
with a unique marker in each slot, split on the markers, each constant piece tokenised on its
own: `assemble` then splices slot token ids between the constant segments inside jit.

Caveat: tokenising pieces separately need not give the ids of tokenising the whole string
(a BPE merge across a piece boundary is lost), but the ids decode to the same text, which is
what a model conditioned on them reads. `token_template` checks the constant segments decode
to the rendered text and refuses tokenizers that prepend a space to every encoded piece
(sentencepiece ``prepend_scheme="always"``), where that would not hold.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

Messages = list[dict[str, str]]

# "full": natural-language instructions for real LLMs; "compact": a few tagged lines for small
# models trained from scratch (the toy world), where every instruction token costs compute.
STYLES = ("full", "compact")

_FORMAT = (
    "Write at most {max_items} criteria, one per line, each in the form\n"
    "[w] criterion\n"
    "where w is the weight. Output only these lines and nothing else."
)


def dynamic_rubric_generator_messages(prompt: str, responses: Sequence[str], *,
                                      max_items: int = 16, style: str = "full") -> Messages:
    """DynamicRubric: a rubric that separates the given candidate responses; with no responses,
    the static baseline's rubric from the prompt alone."""
    _check_style(style)
    if style == "compact":
        return _user("rubric for: " + prompt + "\n" + "".join(f"a: {r}\n" for r in responses))
    if not responses:
        return genrubric_generator_messages(prompt, max_items=max_items, signed=False)
    shown = "\n\n".join(f"<response {k}>\n{r}\n</response {k}>"
                        for k, r in enumerate(responses, start=1))
    content = (
        "Write a grading rubric for the user prompt below. Several candidate responses to it are "
        "shown too: the rubric should capture the qualities that tell the better candidates "
        "from the worse ones.\n\n"
        "Every criterion must be:\n"
        "- atomic: it checks exactly one thing;\n"
        "- binary: a grader can answer it with a plain yes or no;\n"
        "- positive: it states something a good response does, so that \"yes\" is good;\n"
        "- self-contained: it makes sense on its own and never names a particular candidate "
        "(no \"Response 2\", no \"the first answer\");\n"
        "- discriminating: prefer qualities on which the candidates differ over ones they all "
        "share or all lack.\n"
        "Weight each criterion by how necessary it is, from 1 (nice to have) to 5 (essential).\n\n"
        f"User prompt:\n<prompt>\n{prompt}\n</prompt>\n\n"
        f"Candidate responses:\n{shown}\n\n" + _FORMAT.format(max_items=max_items)
    )
    return [{"role": "user", "content": content}]


def genrubric_generator_messages(prompt: str, *, max_items: int = 16, style: str = "full",
                                 signed: bool = True) -> Messages:
    """GenRubric: a rubric from the query alone, with penalties for observable errors
    (``signed=False``: positive criteria only, the static DynamicRubric baseline)."""
    _check_style(style)
    if style == "compact":
        return _user(f"rubric for: {prompt}\n")
    if not signed:
        return _user(
            "Write a grading rubric for the user prompt below, to judge any response to it.\n\n"
            "Every criterion states one quality a strong response shows, can be answered with a "
            "plain yes or no, and makes sense on its own. Weight each criterion by how necessary "
            "it is, from 1 (nice to have) to 5 (essential).\n\n"
            f"User prompt:\n<prompt>\n{prompt}\n</prompt>\n\n" + _FORMAT.format(max_items=max_items))
    content = (
        "Write a grading rubric for the user prompt below, to judge any response to it.\n\n"
        "Use two kinds of criteria:\n"
        "- positive criteria: qualities a strong response shows, weighted from 1 (minor) to 5 "
        "(essential);\n"
        "- negative criteria: concrete, observable errors a response could make (a wrong fact, "
        "an unsafe recommendation, an instruction it ignores), weighted from -1 (minor) to -5 "
        "(severe). State the error itself, so that \"yes, the response does this\" is bad.\n"
        "Every criterion checks exactly one thing, can be answered with a plain yes or no, and "
        "makes sense on its own.\n\n"
        f"User prompt:\n<prompt>\n{prompt}\n</prompt>\n\n" + _FORMAT.format(max_items=max_items)
    )
    return [{"role": "user", "content": content}]


def verifier_messages(prompt: str, response: str, criterion: str, *,
                      style: str = "full") -> Messages:
    """Verifier: does one response meet one criterion? The criterion comes last (shared prefix).

    ``criterion`` is spliced right after ``Criterion:``: rubric item tokens usually carry the
    separating space themselves (see `jaxrubric.rubric.grammar`).
    """
    _check_style(style)
    if style == "compact":
        return _user(f"q: {prompt}\na: {response}\nc:{criterion}\n")
    content = (
        "You are grading one response against one criterion. Read the user prompt and the "
        "response, then decide whether the response meets the criterion.\n"
        "Answer \"yes\" only if the criterion is fully met; if it is met only in part, or you "
        "cannot tell, answer \"no\". Some criteria describe an error: for those, \"yes\" means "
        "the response makes that error.\n\n"
        f"User prompt:\n<prompt>\n{prompt}\n</prompt>\n\n"
        f"Response:\n<response>\n{response}\n</response>\n\n"
        f"Criterion:{criterion}\n"
        "Does the response meet the criterion? Answer with one word: yes or no."
    )
    return [{"role": "user", "content": content}]


def induced_response_messages(prompt: str, rubric: str, *, style: str = "full") -> Messages:
    """GenRubric's rubric-induced response: answer the query so as to satisfy the rubric."""
    _check_style(style)
    if style == "compact":
        return _user(f"rubric:\n{rubric}\nq: {prompt}")
    content = (
        "Answer the user prompt below. A grading rubric for it is given too: each line is "
        "\"[w] criterion\"; a positive weight marks something a good answer does (higher is more "
        "important), a negative weight an error to avoid. Write the answer that meets as many "
        "positive criteria as you can, the most important first, and makes none of the errors. "
        "Do not mention the rubric.\n\n"
        f"Rubric:\n{rubric}\n\n"
        f"User prompt:\n{prompt}"
    )
    return [{"role": "user", "content": content}]


def _user(content: str) -> Messages:
    return [{"role": "user", "content": content}]


def _check_style(style: str) -> None:
    if style not in STYLES:
        raise ValueError(f"template style {style!r} is not one of {STYLES}")


# ----------------------------------------------------------------------------- host side


def render_chat(tokenizer: Any, messages: Messages,
                chat_template_kwargs: Mapping[str, Any] | None = None) -> str:
    """Messages through the chat template with the generation prompt (plain format without one).

    ``chat_template_kwargs`` passes template switches, e.g. ``enable_thinking=False`` (Qwen3).
    """
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             **(chat_template_kwargs or {}))
    turns = "".join(f"{m['role'].capitalize()}: {m['content']}\n\n" for m in messages)
    return turns + "Assistant:"


def slot_marker(name: str) -> str:
    """The placeholder text a slot is rendered as before the template is split."""
    return f"@@JAXRUBRIC_SLOT_{name}@@"


_MARKER = re.compile(r"@@JAXRUBRIC_SLOT_(\w+?)@@")


@dataclasses.dataclass(frozen=True)
class TokenTemplate:
    """A rendered prompt split at its slots: ``segments[i]`` precedes ``slots[i]``.

    ``len(segments) == len(slots) + 1``; ``pieces`` are the segments' texts. Hashable, so it
    can be a static argument of jitted functions.
    """

    slots: tuple[str, ...]
    segments: tuple[tuple[int, ...], ...]
    pieces: tuple[str, ...]

    def render(self, *texts: str) -> str:
        """The template's text with ``texts`` (one per slot, in order) in the slots."""
        if len(texts) != len(self.slots):
            raise ValueError(f"need {len(self.slots)} slot texts {self.slots}, got {len(texts)}")
        return "".join(p + t for p, t in zip(self.pieces, texts)) + self.pieces[-1]

    def head(self, num_slots: int) -> "TokenTemplate":
        """The template up to slot ``num_slots`` (exclusive): its first slots and segments.

        The verifier prefix is ``verifier.head(2)`` and its branch suffix
        ``verifier.segments[-1]``.
        """
        if not 0 <= num_slots <= len(self.slots):
            raise ValueError(f"num_slots {num_slots} outside 0..{len(self.slots)}")
        return TokenTemplate(self.slots[:num_slots], self.segments[:num_slots + 1],
                             self.pieces[:num_slots + 1])

    @property
    def constant_length(self) -> int:
        """Tokens in the constant segments together."""
        return sum(len(s) for s in self.segments)


def token_template(tokenizer: Any, messages: Messages, slots: Sequence[str],
                   chat_template_kwargs: Mapping[str, Any] | None = None) -> TokenTemplate:
    """Renders ``messages`` (with `slot_marker`s in them) and tokenises the pieces between slots.

    ``slots`` names the markers in the order the rendered text must show each of them, once.
    Raises ValueError when it does not, or when the constant segments do not decode back to
    their text.
    """
    text = render_chat(tokenizer, messages, chat_template_kwargs)
    found = list(_MARKER.finditer(text))
    names = [m.group(1) for m in found]
    if names != list(slots):
        raise ValueError(f"the rendered template shows the slots {names}, expected {list(slots)}")
    bounds = [0, *(x for m in found for x in m.span()), len(text)]
    pieces = tuple(text[bounds[2 * i]:bounds[2 * i + 1]] for i in range(len(found) + 1))
    segments = tuple(tuple(tokenizer.encode(p, add_special_tokens=False)) if p else ()
                     for p in pieces)
    joined = [i for seg in segments for i in seg]
    decoded = tokenizer.decode(joined, skip_special_tokens=False,
                               clean_up_tokenization_spaces=False)
    if decoded != "".join(pieces):
        raise ValueError("template pieces tokenised one by one do not decode to the rendered "
                         "text (a tokenizer that prepends a space to every encoded string?)")
    return TokenTemplate(tuple(names), segments, pieces)


def dynamic_rubric_generator_template(tokenizer: Any, num_responses: int, *,
                                      max_items: int = 16,
                                      chat_template_kwargs: Mapping[str, Any] | None = None,
                                      style: str = "full") -> TokenTemplate:
    """Slots ``prompt, response_1 .. response_K`` (``num_responses=0``: the static rubric)."""
    responses = [slot_marker(f"response_{k}") for k in range(1, num_responses + 1)]
    messages = dynamic_rubric_generator_messages(slot_marker("prompt"), responses,
                                                 max_items=max_items, style=style)
    slots = ("prompt", *(f"response_{k}" for k in range(1, num_responses + 1)))
    return token_template(tokenizer, messages, slots, chat_template_kwargs)


def genrubric_generator_template(tokenizer: Any, *, max_items: int = 16,
                                 chat_template_kwargs: Mapping[str, Any] | None = None,
                                 style: str = "full") -> TokenTemplate:
    """Slot ``prompt``."""
    messages = genrubric_generator_messages(slot_marker("prompt"), max_items=max_items,
                                            style=style)
    return token_template(tokenizer, messages, ("prompt",), chat_template_kwargs)


def verifier_template(tokenizer: Any,
                      chat_template_kwargs: Mapping[str, Any] | None = None,
                      style: str = "full") -> TokenTemplate:
    """Slots ``prompt, response, criterion``; all after the criterion is the branch suffix."""
    slots = ("prompt", "response", "criterion")
    template = token_template(tokenizer, verifier_messages(*map(slot_marker, slots), style=style),
                              slots, chat_template_kwargs)
    if not template.segments[-1]:
        raise ValueError("the verifier template has nothing after the criterion to answer at")
    return template


def induced_response_template(tokenizer: Any,
                              chat_template_kwargs: Mapping[str, Any] | None = None,
                              style: str = "full") -> TokenTemplate:
    """Slots ``rubric, prompt``."""
    messages = induced_response_messages(slot_marker("prompt"), slot_marker("rubric"),
                                         style=style)
    return token_template(tokenizer, messages, ("rubric", "prompt"), chat_template_kwargs)


# ------------------------------------------------------------------------------ jax side


class Packed(NamedTuple):
    """Packed token rows: ``tokens [..., L]``, ``lengths [...]`` and ``mask [..., L]`` (real)."""

    tokens: jax.Array
    lengths: jax.Array
    mask: jax.Array


def compact(tokens: ArrayLike, valid: ArrayLike, *, pad_id: int = 0,
            align: str = "left") -> Packed:
    """Moves the valid tokens of each row ``[..., P]`` together, in order, padding the rest.

    ``align="left"`` puts them first (right padding), ``"right"`` last (left padding, as
    sampling wants). Jittable: one scatter, static shapes.
    """
    if align not in ("left", "right"):
        raise ValueError(f"align must be 'left' or 'right', got {align!r}")
    tokens, valid = jnp.broadcast_arrays(jnp.asarray(tokens, jnp.int32), jnp.asarray(valid, bool))
    lead, width = tokens.shape[:-1], tokens.shape[-1]
    flat_tokens, flat_valid = tokens.reshape(-1, width), valid.reshape(-1, width)
    lengths = jnp.sum(flat_valid, axis=-1, dtype=jnp.int32)
    dest = jnp.cumsum(flat_valid, axis=-1, dtype=jnp.int32) - 1
    if align == "right":
        dest = dest + (width - lengths)[:, None]
    dest = jnp.where(flat_valid, dest, width)
    rows = jnp.arange(flat_tokens.shape[0])[:, None]
    out = jnp.full_like(flat_tokens, pad_id).at[rows, dest].set(flat_tokens, mode="drop")
    idx = jnp.arange(width)
    if align == "left":
        mask = idx[None, :] < lengths[:, None]
    else:
        mask = idx[None, :] >= (width - lengths)[:, None]
    return Packed(out.reshape(tokens.shape), lengths.reshape(lead), mask.reshape(tokens.shape))


def assemble(template: TokenTemplate, slot_tokens: Sequence[ArrayLike],
             slot_lengths: Sequence[ArrayLike], *, pad_id: int = 0,
             align: str = "left") -> Packed:
    """Splices slot tokens between the template's constant segments (jittable, static shapes).

    ``slot_tokens[i]`` is ``[..., L_i]`` holding ``slot_lengths[i] [...]`` real tokens first;
    leading dims broadcast (a prompt ``[B, 1, Lp]`` against responses ``[B, K, Lr]``). The
    result has static length ``template.constant_length + sum(L_i)``.
    """
    if len(slot_tokens) != len(template.slots) or len(slot_lengths) != len(template.slots):
        raise ValueError(f"need tokens and lengths for the slots {template.slots}")
    slot_tokens = [jnp.asarray(t, jnp.int32) for t in slot_tokens]
    slot_lengths = [jnp.asarray(n, jnp.int32) for n in slot_lengths]
    lead = jnp.broadcast_shapes(*(t.shape[:-1] for t in slot_tokens),
                                *(n.shape for n in slot_lengths))
    parts, valid = [], []
    for i, segment in enumerate(template.segments):
        if segment:
            parts.append(jnp.broadcast_to(jnp.asarray(segment, jnp.int32), (*lead, len(segment))))
            valid.append(jnp.ones((*lead, len(segment)), bool))
        if i < len(slot_tokens):
            tokens, length = slot_tokens[i], slot_lengths[i]
            width = tokens.shape[-1]
            parts.append(jnp.broadcast_to(tokens, (*lead, width)))
            valid.append(jnp.arange(width) < jnp.broadcast_to(length, lead)[..., None])
    return compact(jnp.concatenate(parts, axis=-1), jnp.concatenate(valid, axis=-1),
                   pad_id=pad_id, align=align)
