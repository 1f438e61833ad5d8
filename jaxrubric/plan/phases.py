"""Per-device memory of each stage of a co-evolution round: the formulas `plan.memory` adds
up, one per kind of stage (a rollout, a verifier pass, a role's update).

Per-device sizes assume the round is partitioned as the sharding rules intend: batch rows
split over `data` x `fsdp`, attention heads, kv heads, MLP and vocabulary split over `tensor`
where the size divides. A stage split into micro-batches (`round.rollout_micro_batches` for
sampling and verification, `round.update_micro_batches` for the updates) holds one
micro-batch's rows at a time, so `r` below is the rows of one micro-batch per device. The
transient formulas (bytes per device; `r` rows per device, `T` query and `S` key positions,
`D` hidden, `h` / `kv` local heads, `hd` head dim, `f` local MLP width, `V` local padded
vocabulary, `c` bytes of the compute dtype, `L` layers, `Q` the model's `attention_chunk`):

- hidden states `act(T) = r T D c`; tree or causal mask `r T S` bytes (bool);
- attention of one layer `r h T S (4 + c)`: the einsum attention materialises float32 scores
  and compute-dtype probabilities, so this term grows as `T S`; with `0 < Q < T` it is one
  block's `r h Q S (4 + c)` plus the queries and outputs cut into blocks (`2 r T' h hd c`,
  T rounded up to a multiple of Q) and float32 keys and values `2 r S kv hd 4`;
- projections `r (T h + 2 S kv) hd c`; MLP `3 r T f c` (gate, up, their product);
- one layer's forward working set `W(T, S) = 2 act(T) + max(projections + attention, MLP)`;
- a rollout (`sampling.sample`: prefill the prompts into a cache of P slots, once per
  prompt, then decode N tokens for each of the samples into a cache of their own tokens):
  KV cache `rows T L 2 kv hd c` for T slots; its peak is the prompts' cache + the larger of
  the prefill (`W(P, P)` + mask) and the samples' cache with the decode step's logits and
  the weights of their inverse CDF (one uniform per row, so a micro-batch draws only its
  rows');
- a shared-prefix layer (`transformer._shared_prefix_layer`): a prefix of `P` tokens encoded
  once and `n` branches of `W` tokens continuing it, `Lt = P + n W` tokens in all: the masks
  `r (P^2 + n W^2)`, and `Ws = 2 act(Lt) + max(projections(Lt, Lt) + A, MLP(Lt))`, where `A`
  is the larger of the prefix's attention over itself (`r h P P (4 + c)`, chunked as above)
  and the branches' (`r h n W (P + W) (4 + c)`; with `0 < Q`, a block holds `max(1, Q // n)`
  positions of every branch, plus the branch queries and outputs cut into blocks and float32
  keys and values of all `Lt` tokens);
- a verifier pass (`rubric/verifier.py`): per row a prefix and `n = G M` item branches, one
  shared-prefix layer `Ws` + float32 logits at the `n` answer positions;
- an update on sequences of T tokens: gradients (the role's parameter shards), and with
  micro-batches their running sum of the same size, + the layers' saved activations +
  `2 W(T, T)` for the backward pass of one layer + the log-prob chunk `3 r C V 4` (float32
  logits, their exponentials and their cotangent; `C` = logprob_chunk; with the forward KL
  `5 r C V 4` and the reference's hidden states `act(rows, N)`) + one layer's weights
  gathered over `fsdp` in the compute dtype. Saved activations with remat `full`: `L act(T)`
  (each layer's input); with any other policy: `L (2 act(T) + projections + attention + MLP)`
  (every residual: an upper bound for the `dots_*` policies, which recompute the cheap
  element-wise ops), where chunked attention keeps only its blocks' copies (each block's
  probabilities are recomputed). A shared update (`round.share_prefix`: `r` prompts per
  device, each a prefix under its `n` completions as branches) counts `T = Lt`, its masks,
  `2 Ws` for the backward of one layer, the kept attention of both the prefix and the
  branches, and the log-prob chunk for its `r n` completions.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax.numpy as jnp

from jaxrubric.plan.models import RoleParams


@dataclasses.dataclass(frozen=True)
class Local:
    """Per-device model dimensions (the symbols of the module docstring)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    vocab: int
    c: int  # bytes of the compute dtype
    gathered_layer: int  # one layer's weights gathered over fsdp, compute dtype
    chunk: int  # the model's attention_chunk (0: dense attention)
    # The attention backend the target runs (`models.attention`): "xla" (the einsum forms),
    # "splash" (a fused kernel for causal and shared-prefix calls) or "cudnn" (fused for
    # causal calls; shared-prefix branches stay on the einsum form).
    backend: str = "xla"

    @classmethod
    def of(cls, params: RoleParams, tensor: int, backend: str = "xla") -> Local:
        m = params.config
        split = lambda x: x // tensor if x % tensor == 0 else x  # noqa: E731
        c = jnp.dtype(m.dtype).itemsize
        return cls(m.num_layers, m.hidden_size, split(m.num_heads), split(m.num_kv_heads),
                   m.head_dim, split(m.intermediate_size), split(m.padded_vocab_size), c,
                   params.layer_count // tensor * c, m.attention_chunk, backend)

    def fused(self, r: int, t: int, s: int) -> int:
        """A fused kernel's HBM temporaries (`models.attention.splash` / `cudnn`): scores stay
        on chip, so what is held is the queries, keys and values as the kernel takes them
        (padded, transposed: a copy of each), its output and the float32 log-sum-exp it keeps
        for the backward pass."""
        return (2 * r * (t * self.heads + 2 * s * self.kv_heads) * self.head_dim * self.c
                + r * t * self.heads * (self.head_dim * self.c + 4))

    def act(self, r: int, t: int) -> int:
        return r * t * self.hidden * self.c

    def chunked(self, t: int) -> bool:
        """Whether `t` queries go through `attention.chunked_attention`."""
        return 0 < self.chunk < t

    def blocks(self, r: int, t: int, s: int) -> int:
        """Chunked attention's copies besides the scores: the queries and the outputs cut
        into whole blocks, and float32 keys and values."""
        return self._block_copies(r, -(-t // self.chunk) * self.chunk, s)

    def _block_copies(self, r: int, queries: int, keys: int) -> int:
        """`queries` (whole blocks) and their outputs; float32 copies of `keys` keys and
        values."""
        return (2 * r * queries * self.heads * self.head_dim * self.c
                + 2 * r * keys * self.kv_heads * self.head_dim * 4)

    def attention(self, r: int, t: int, s: int) -> int:
        """One layer's attention temporaries: a fused kernel's (`fused`), else scores and
        probabilities of all queries, or of one block of them with the blocks' copies."""
        if self.backend != "xla":
            return self.fused(r, t, s)
        if not self.chunked(t):
            return r * self.heads * t * s * (4 + self.c)
        return r * self.heads * self.chunk * s * (4 + self.c) + self.blocks(r, t, s)

    def attention_saved(self, r: int, t: int, s: int) -> int:
        """What the backward pass keeps of one layer's attention without remat: the
        probabilities, or (chunked: each block's are recomputed) the blocks' copies; a fused
        kernel's inputs, output and log-sum-exp."""
        if self.backend != "xla" or not self.chunked(t):
            return self.attention(r, t, s)
        return self.blocks(r, t, s)

    def _branch_block(self, branches: int, length: int) -> int:
        """The positions of every branch one block of `attention.branch_attention` holds:
        `max(1, Q // branches)`, or all `length` when its queries stay one einsum."""
        rows = max(1, self.chunk // branches)
        return rows if 0 < self.chunk and rows < length else length

    def _branch_copies(self, r: int, prefix: int, branches: int, length: int) -> int:
        """Chunked `branch_attention`'s copies: the branch queries and outputs cut into whole
        blocks, float32 keys and values of the prefix and every branch."""
        rows = self._branch_block(branches, length)
        return self._block_copies(r, branches * rows * -(-length // rows),
                                  prefix + branches * length)

    def branch_attention(self, r: int, prefix: int, branches: int, length: int) -> int:
        """`attention.branch_attention`'s temporaries: the `length` queries of each of
        `branches` branches score the prefix's keys and their own; chunked, a block holds
        `max(1, Q // branches)` positions of every branch, with the blocks' copies. Splash runs
        the prefix and the branches as one kernel over their `prefix + branches x length`
        positions."""
        if self.backend == "splash":
            t = prefix + branches * length
            return self.fused(r, t, t)
        rows = self._branch_block(branches, length)
        scores = r * self.heads * branches * rows * (prefix + length) * (4 + self.c)
        return scores if rows == length else scores + self._branch_copies(
            r, prefix, branches, length)

    def branch_attention_saved(self, r: int, prefix: int, branches: int, length: int) -> int:
        """What the backward pass keeps of `branch_attention` without remat: the
        probabilities, or (chunked: each block's are recomputed) the blocks' copies."""
        if self.backend == "splash" or self._branch_block(branches, length) == length:
            return self.branch_attention(r, prefix, branches, length)
        return self._branch_copies(r, prefix, branches, length)

    def shared_working_set(self, r: int, prefix: int, branches: int, length: int) -> int:
        """Ws: one shared-prefix layer's forward at its largest moment. The prefix's attention
        and the branches' run one after the other, so it holds the larger of the two."""
        t = prefix + branches * length
        attention = self.branch_attention(r, prefix, branches, length)
        if self.backend != "splash":  # the prefix's attention runs first, on its own
            attention = max(self.attention(r, prefix, prefix), attention)
        return 2 * self.act(r, t) + max(self.projections(r, t, t) + attention,
                                        self.mlp_bytes(r, t))

    def projections(self, r: int, t: int, s: int) -> int:
        return r * (t * self.heads + 2 * s * self.kv_heads) * self.head_dim * self.c

    def mlp_bytes(self, r: int, t: int) -> int:
        return 3 * r * t * self.mlp * self.c

    def working_set(self, r: int, t: int, s: int) -> int:
        """W(T, S): one layer's forward, at its largest moment."""
        return 2 * self.act(r, t) + max(self.projections(r, t, s) + self.attention(r, t, s),
                                        self.mlp_bytes(r, t))

    def saved(self, r: int, t: int, remat: str, attention: int | None = None) -> int:
        """Activations the layers keep for the backward pass; `attention`: what one layer
        keeps of its attention without remat (default: causal attention over `t` tokens)."""
        if remat == "full":
            return self.layers * self.act(r, t)
        if attention is None:
            attention = self.attention_saved(r, t, t)
        every = (2 * self.act(r, t) + self.projections(r, t, t) + attention
                 + self.mlp_bytes(r, t))
        return self.layers * every

    @staticmethod
    def mask(r: int, t: int, s: int) -> int:
        """A bool per (query, key)."""
        return r * t * s

    def shared_masks(self, r: int, prefix: int, branches: int, length: int) -> int:
        """A shared-prefix layer's masks: the prefix's causal one, each branch's own."""
        return self.mask(r, prefix, prefix) + self.mask(r * branches, length, length)

    def kv_cache(self, rows: int, length: int) -> int:
        return rows * length * self.layers * 2 * self.kv_heads * self.head_dim * self.c


def rows_per_device(rows: int, ways: int) -> int:
    """The rows of the busiest device when `rows` are split `ways` ways."""
    return -(-rows // ways)


class Phase(NamedTuple):
    """One stage of the round: its items, its peak and how the items make the peak."""

    items: list[tuple[str, int]]
    total: int
    rule: str = "sum"


def summed(items: list[tuple[str, int]]) -> Phase:
    return Phase(items, sum(b for _, b in items))


def with_inputs(phase: Phase, inputs: list[tuple[str, int]]) -> Phase:
    """`phase` plus inputs its program receives from another mesh (roles on sub-meshes): they
    are the program's arguments, held from its start to its end."""
    if not inputs:
        return phase
    rule = phase.rule if phase.rule == "sum" else f"{phase.rule} + the moved inputs"
    return Phase(phase.items + inputs, phase.total + sum(b for _, b in inputs), rule)


def _rows_text(rows: int, micro_batches: int, unit: str = "rows") -> str:
    """`512 rows`, or `64 of 512 rows` when a micro-batch holds part of them."""
    return (f"{rows} {unit}" if micro_batches == 1
            else f"{rows // micro_batches} of {rows} {unit}")


def rollout_phase(loc: Local, prompt_rows: int, samples: int, prompt: int, new: int, ways: int,
                  micro_batches: int = 1, weights: int = 0) -> Phase:
    """`sampling.sample` inside the round: the prompts are prefilled into a cache of `prompt`
    slots, once per prompt; then each of the `samples` rows continuing a prompt decodes `new`
    tokens one at a time into a cache of its own tokens, reading its prompt's cache in place.
    The prefill's layer working set is gone before the decode starts, so the peak is the
    prompts' cache plus the larger of the two. Micro-batches do this for a share of the
    prompts at a time. `loc` and `ways` describe the decoding layout
    (`sharding.decoding_rules`), `weights` the copy of the role's weights laid out for it,
    held through the stage."""
    micro_prompts = prompt_rows // micro_batches
    rp = rows_per_device(micro_prompts, ways)
    r = rows_per_device(micro_prompts * samples, ways)
    prompt_cache = loc.kv_cache(rp, prompt)
    sample_cache = loc.kv_cache(r, new)
    step = 4 * r * (3 * loc.vocab + 3 * new)  # logits, filtered, CDF weights; tokens, log-probs
    prefill = loc.working_set(rp, prompt, prompt) + loc.mask(rp, prompt, prompt)
    prompts = _rows_text(prompt_rows, micro_batches, "prompts")
    items = [(f"KV cache of {prompts} x {prompt} tokens", prompt_cache),
             (f"KV cache of their samples: {_rows_text(prompt_rows * samples, micro_batches)} "
              f"x {new} tokens", sample_cache),
             ("decode step: logits, sampling weights, tokens, log-probs", step),
             (f"prefill: one layer over {prompts} x {prompt} tokens", prefill)]
    held, rule = (0, "") if not weights else (weights, "the decoding weights + ")
    if weights:
        items.insert(0, ("weights laid out for decoding (compute dtype)", weights))
    return Phase(items, held + prompt_cache + max(prefill, sample_cache + step),
                 f"{rule}the prompts' cache + the larger of the prefill and the decode")


def update_phase(loc: Local, params: RoleParams, rows: int, prompt_len: int,
                 completion_len: int, chunk: int, ways: int, micro_batches: int = 1,
                 group: int = 1, forward_kl: bool = False) -> Phase:
    """A GRPO update of one role on `rows` sequences (a prompt and a completion), one
    micro-batch of them at a time (their gradients summed into a second gradient-sized
    buffer). `group > 1`: each prompt is encoded once under its `group` completions
    (`round.share_prefix`), and micro-batches split the prompts. `forward_kl` (`round.<role>_kl
    = "forward"`): the reference's hidden states at every completion position are kept for
    the whole update, and each log-prob chunk also holds the reference's float32 log-softmax
    and its exponentials."""
    remat = params.config.remat
    items = [(f"gradients ({params.config.param_dtype})", params.bytes)]
    if micro_batches > 1:
        items.append((f"their sum over {micro_batches} micro-batches", params.bytes))
    if group > 1:  # the prompt a prefix, its completions branches (`Local.shared_working_set`)
        r = rows_per_device(rows // group // micro_batches, ways)
        length = prompt_len + group * completion_len
        what = (f"{_rows_text(rows // group, micro_batches, 'prompts')} x ({prompt_len} + "
                f"{group} x {completion_len}) tokens")
        kept = (loc.attention_saved(r, prompt_len, prompt_len)
                + loc.branch_attention_saved(r, prompt_len, group, completion_len))
        saved = (loc.saved(r, length, remat, kept)
                 + loc.shared_masks(r, prompt_len, group, completion_len))
        layer = loc.shared_working_set(r, prompt_len, group, completion_len)
        logit_rows = r * group
    else:
        r = rows_per_device(rows // micro_batches, ways)
        length = prompt_len + completion_len
        what = f"{_rows_text(rows, micro_batches)} x {length} tokens"
        saved = loc.saved(r, length, remat) + loc.mask(r, length, length)
        layer, logit_rows = loc.working_set(r, length, length), r
    logits = 3 + (2 if forward_kl else 0)  # float32 [rows, C, V] arrays per chunk
    if forward_kl:
        items.append((f"reference hidden states: {rows} rows x {completion_len} tokens",
                      loc.act(rows_per_device(rows, ways), completion_len)))
    return summed(items + [
        (f"saved activations (remat {remat}): {what}", saved),
        ("backward of one layer", 2 * layer),
        (f"log-prob chunk: {chunk} tokens x {loc.vocab} vocabulary",
         logits * logit_rows * chunk * loc.vocab * 4),
        ("one layer's weights gathered", loc.gathered_layer),
    ])


def verifier_phase(loc: Local, rows: int, prefix_len: int, branches: int, branch_len: int,
                   readout_tokens: int, ways: int, micro_batches: int = 1) -> Phase:
    """One shared-prefix forward per (prompt, answer): the prefix encoded once, every item a
    branch attending to it and causally to itself; the rows of one micro-batch of prompts at
    a time. The prefix's and the branches' attention run one after the other, so a layer
    holds the larger of their temporaries. Each item's answer position is projected onto the
    `readout_tokens` yes and no tokens only, for every row of the pass (the micro-batches'
    outputs are stacked)."""
    r = rows_per_device(rows // micro_batches, ways)
    layer = loc.shared_working_set(r, prefix_len, branches, branch_len)
    tokens = f"{prefix_len} + {branches} x {branch_len}"
    return summed([
        (f"masks: {_rows_text(rows, micro_batches)} x ({prefix_len}^2 + {branches} x "
         f"{branch_len}^2)", loc.shared_masks(r, prefix_len, branches, branch_len)),
        (f"one layer's forward over {tokens} tokens", layer + loc.gathered_layer),
        (f"answer logits: {branches} items per row x {readout_tokens} tokens",
         rows_per_device(rows, ways) * branches * readout_tokens * 4),
    ])
