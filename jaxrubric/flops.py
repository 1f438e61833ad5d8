"""Model FLOPs of the co-evolution round, for MFU (model FLOPs utilisation, `jaxrubric.mfu`).

MFU says how much of the hardware a round uses, so it must count the work the *model* needs,
not what our implementation happens to execute. The convention is MaxText's
(`calculate_tflops_training_per_device`, after PaLM's appendix B):

- a matmul `[m, k] @ [k, n]` costs `2 m n k`; elementwise work (norms, RoPE, softmax, SiLU,
  sampling filters, the grammar mask) is not counted;
- attention costs `4 * heads * head_dim` per (query, key) pair per layer (`QK^T` and `AV`); a
  causal sequence of `T` tokens counts `T^2 / 2` pairs, half the square;
- the embedding lookup is a gather (free); the LM head costs `2 * hidden * vocab` per position
  actually projected, tied or untied, over the tokenizer's vocabulary (columns padded for
  sharding are overhead, not model work);
- a trained forward + backward counts 3x the forward (the backward is two matmuls per forward
  matmul); forwards recomputed by rematerialisation are not counted. A LoRA role's backward
  has no weight gradients of its frozen base: 2x the forward (the rank-r adapters' own
  matmuls, under 1% at the recipes' ranks, are not counted).

Round-level approximations (`round_flops_by_stage`), all from the round's static shapes as its
stages make them (`Method.round_shapes`, the round traced on abstract inputs):

- padding is counted: prompts, responses and rubrics are their static maximum lengths, as in
  the compiled program (MaxText counts padded sequences too);
- decoding is counted for the full budget (`response_tokens`, the grammar's longest rubric) even
  though the decode loop stops once every row has finished, so a round whose samples all end
  early gets an optimistic MFU;
- a decode step attends to the prompt and the tokens before it (`N * P + N^2 / 2` pairs for `N`
  new tokens after a `P`-token prompt); the implementation scores the whole cache and masks;
- the verifier encodes each (prompt, response) prefix once, causal, and every item branch
  attends to the prefix and causally to itself (two-part attention, as `verify` computes it:
  no scores between branches); a branch is its static slot, item padding included;
- the teacher-forced forwards (reference log-probs, the updates) run a GRPO group's shared
  prompt once under its samples (`round.share_prefix`, the default), each sample attending to
  it; without sharing, each sample's prompt again, as the round then does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from jaxrubric.models.config import ModelConfig
from jaxrubric.roles import Role

if TYPE_CHECKING:  # types only: FLOPs read a method's shapes, they never import a method
    from jaxrubric.methods.round_config import RoundConfig
    from jaxrubric.methods.shapes import RoundShapes


def forward_flops(cfg: ModelConfig, *, tokens: float, attention_pairs: float,
                  logit_tokens: float) -> float:
    """Forward FLOPs over `tokens` positions, of which `attention_pairs` (query, key) pairs are
    attended and `logit_tokens` positions are projected to the vocabulary.

    The three counts are separate because our forwards differ in exactly these: sampling
    projects only the last prompt position, the verifier only its answer positions, and tree
    or cached attention does not see a plain causal square.
    """
    d, hd = cfg.hidden_size, cfg.head_dim
    projections = d * hd * 2 * (cfg.num_heads + cfg.num_kv_heads)  # q and o; k and v (GQA)
    mlp = 3 * d * cfg.intermediate_size  # SwiGLU: gate, up, down
    per_token = 2 * cfg.num_layers * (projections + mlp)
    per_pair = 4 * cfg.num_layers * cfg.num_heads * hd
    per_logit = 2 * d * cfg.vocab_size
    return per_token * tokens + per_pair * attention_pairs + per_logit * logit_tokens


def forward_flops_per_token(cfg: ModelConfig, context: int, causal: bool = True) -> float:
    """Forward FLOPs per token of a `context`-token sequence, LM head included; a causal
    sequence counts half of the attention square (`context / 2` keys per query)."""
    keys = context / 2 if causal else context
    return forward_flops(cfg, tokens=1, attention_pairs=keys, logit_tokens=1)


def sampling_flops(cfg: ModelConfig, *, prompts: int, prompt_len: int, samples: int,
                   new_tokens: int) -> float:
    """`jaxrubric.sampling.sample`: a causal prefill of `prompts` prompts of `prompt_len`
    tokens (only the last position projected), then `new_tokens` decode steps for each of the
    `samples` rows continuing every prompt, each step attending to the prompt and the tokens
    decoded before it."""
    prefill = forward_flops(cfg, tokens=prompts * prompt_len,
                            attention_pairs=prompts * prompt_len**2 / 2, logit_tokens=prompts)
    rows = prompts * samples
    decode = forward_flops(
        cfg, tokens=rows * new_tokens,
        attention_pairs=rows * (new_tokens * prompt_len + new_tokens**2 / 2),
        logit_tokens=rows * new_tokens)
    return prefill + decode


def teacher_forced_flops(cfg: ModelConfig, *, rows: int, prompt_len: int,
                         completion_len: int) -> float:
    """`jaxrubric.methods.update.completion_logprobs`: one causal forward over prompt + completion
    per row, projecting the `completion_len` positions that predict the completion."""
    length = prompt_len + completion_len
    return forward_flops(cfg, tokens=rows * length, attention_pairs=rows * length**2 / 2,
                         logit_tokens=rows * completion_len)


def shared_teacher_forced_flops(cfg: ModelConfig, *, prompts: int, prompt_len: int,
                                samples: int, completion_len: int) -> float:
    """`jaxrubric.methods.update.shared_completion_logprobs`: per prompt, one causal forward over
    it and `samples` completions as branches, each attending to the prompt and causally to
    itself; the `completion_len` positions that predict each completion are projected."""
    tokens = prompt_len + samples * completion_len
    pairs = prompt_len**2 / 2 + samples * (completion_len * prompt_len + completion_len**2 / 2)
    return forward_flops(cfg, tokens=prompts * tokens, attention_pairs=prompts * pairs,
                         logit_tokens=prompts * samples * completion_len)


def tree_verify_flops(cfg: ModelConfig, *, rows: int, prefix_len: int, branches: int,
                      branch_len: int, readout_tokens: int) -> float:
    """`jaxrubric.rubric.verifier.verify`: per row, a causal prefix encoded once and
    `branches` branches of `branch_len` tokens (an item slot plus the answer suffix), each
    attending to the prefix and causally to itself (`Decoder.shared_prefix_hidden`); one
    answer position per branch is projected, onto the `readout_tokens` yes and no tokens only
    (`Decoder.token_logits`)."""
    tokens = prefix_len + branches * branch_len
    pairs = prefix_len**2 / 2 + branches * (branch_len * prefix_len + branch_len**2 / 2)
    readout = 2 * cfg.hidden_size * readout_tokens * rows * branches
    return forward_flops(cfg, tokens=rows * tokens, attention_pairs=rows * pairs,
                         logit_tokens=0) + readout


def round_flops_by_stage(models: Mapping[Role, ModelConfig], config: RoundConfig,
                         shapes: RoundShapes) -> dict[str, float]:
    """Model FLOPs of each stage of one round (`Method.round_shapes`), named `role/stage`:
    sampling, verification passes, the reference log-probs (a trained role with beta > 0) and
    the `num_updates` forward + backward passes of each trained role (with the forward KL the
    reference's vocabulary projection runs in each of them, its forward only up to the hidden
    states). `models` holds the three
    `Decoder.config`s (a setup holds only graph definitions)."""
    stages = {}
    for s in shapes.sampling:
        stages[f"{s.role}/sample"] = sampling_flops(
            models[s.role], prompts=s.prompts, prompt_len=s.prompt_len, samples=s.samples,
            new_tokens=s.new_tokens)
    for v in shapes.verification:
        stages[f"verifier/{v.name}"] = tree_verify_flops(
            models[Role.VERIFIER], rows=v.rows, prefix_len=v.prefix_len, branches=v.branches,
            branch_len=v.branch_len, readout_tokens=v.readout_tokens)
    for u in shapes.updates:
        if config.frozen(u.role):  # compiled behind a runtime switch, skipped
            continue
        if u.shared(config):
            forward = shared_teacher_forced_flops(
                models[u.role], prompts=u.rows // u.group, prompt_len=u.prompt_len,
                samples=u.group, completion_len=u.completion_len)
        else:
            forward = teacher_forced_flops(models[u.role], rows=u.rows, prompt_len=u.prompt_len,
                                           completion_len=u.completion_len)
        passes = 3 if models[u.role].lora is None else 2
        stages[f"{u.role}/update"] = passes * config.num_updates * forward
        role = config.roles[u.role]
        if role.beta > 0:
            stages[f"{u.role}/reference"] = forward
            if role.kl == "forward":  # its logits move into every update step
                logits = forward_flops(models[u.role], tokens=0, attention_pairs=0,
                                       logit_tokens=u.rows * u.completion_len)
                stages[f"{u.role}/reference"] -= logits
                stages[f"{u.role}/update"] += config.num_updates * logits
    return stages


def round_flops(models: Mapping[Role, ModelConfig], config: RoundConfig,
                shapes: RoundShapes) -> float:
    """Model FLOPs of one round: the sum of `round_flops_by_stage`."""
    return sum(round_flops_by_stage(models, config, shapes).values())
