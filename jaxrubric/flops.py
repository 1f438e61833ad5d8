"""Model FLOPs of the co-evolution round, and MFU (model FLOPs utilisation) against chip peaks.

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
  matmul); forwards recomputed by rematerialisation are not counted.

Round-level approximations (`round_flops_by_stage`), all from the round's static shapes:

- padding is counted: prompts, responses and rubrics are their static maximum lengths, as in
  the compiled program (MaxText counts padded sequences too);
- decoding is counted for the full budget (`response_tokens`, the grammar's longest rubric) even
  though the decode loop stops once every row has finished, so a round whose samples all end
  early gets an optimistic MFU;
- a decode step attends to the prompt and the tokens before it (`N * P + N^2 / 2` pairs for `N`
  new tokens after a `P`-token prompt); the implementation scores the whole cache and masks;
- the verifier counts the tree layout's needed pairs (prefix causal; each item branch attends
  to the prefix and causally to itself), not the dense masked `L x L` scores it computes;
- the teacher-forced forwards (reference log-probs, the updates) run each sample's prompt again,
  as the round does: no prefix is shared between the samples of one prompt.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Literal

from jaxrubric.coevolve import RoundConfig, RoundSetup
from jaxrubric.genrubric_round import GenRubricSetup
from jaxrubric.models.config import ModelConfig


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
    """`jaxrubric.coevolve.completion_logprobs`: one causal forward over prompt + completion
    per row, projecting the `completion_len` positions that predict the completion."""
    length = prompt_len + completion_len
    return forward_flops(cfg, tokens=rows * length, attention_pairs=rows * length**2 / 2,
                         logit_tokens=rows * completion_len)


def tree_verify_flops(cfg: ModelConfig, *, rows: int, prefix_len: int, branches: int,
                      branch_len: int) -> float:
    """`jaxrubric.rubric.verifier.verify`: per row, a causal prefix and `branches` branches of
    `branch_len` tokens (an item slot plus the answer suffix), each attending to the prefix and
    causally to itself; one answer position per branch is projected."""
    tokens = prefix_len + branches * branch_len
    pairs = prefix_len**2 / 2 + branches * (branch_len * prefix_len + branch_len**2 / 2)
    return forward_flops(cfg, tokens=rows * tokens, attention_pairs=rows * pairs,
                         logit_tokens=rows * branches)


@dataclasses.dataclass(frozen=True)
class RoundShapes:
    """The static lengths a round's FLOPs depend on besides its `RoundConfig`
    (built from a setup and the batch by `round_shapes`)."""

    method: Literal["dynamic_rubric", "genrubric"]
    batch: int  # B prompts
    policy_prompt: int  # the policy's prompt: chat-formatted (DynamicRubric) or rubric-induced
    generator_prompt: int  # the generator's assembled prompt
    rubric: int  # sampled rubric tokens: the grammar's longest rubric
    items: int  # M item slots per rubric
    branch: int  # one verifier tree branch: item slot + answer suffix
    verifier_prefix: int  # verifier prefix of a (prompt, response)
    anchors: int = 0  # anchor answers per prompt (DynamicRubric)
    anchor_prefix: int = 0  # verifier prefix of a (prompt, anchor answer)


def round_shapes(setup: RoundSetup, batch_shapes: Mapping[str, Sequence[int]]) -> RoundShapes:
    """The shapes of the round `setup` runs on a batch with these array shapes (the keys of
    `coevolve.encode_batch`: `prompt [B, Lq]`, `policy_input [B, Lp]`, `anchors [B, n, La]`).

    Assembled lengths are the templates' constant tokens plus their slots' static widths,
    exactly as `templates.assemble` builds them.
    """
    cfg, grammar = setup.config, setup.grammar
    batch, question = batch_shapes["prompt"]
    rubric = grammar.max_rubric_tokens
    prefix = setup.verifier_template.head(2).constant_length + question
    # The generator's slots: the question, then the responses it is shown (K for DynamicRubric,
    # none for GenRubric or a static rubric).
    shown = len(setup.generator_template.slots) - 1
    common = dict(
        batch=batch, rubric=rubric, items=grammar.max_items,
        branch=grammar.max_item_tokens + len(setup.readout.suffix),
        verifier_prefix=prefix + cfg.response_tokens,
        generator_prompt=(setup.generator_template.constant_length + question
                          + shown * cfg.response_tokens))
    if isinstance(setup, GenRubricSetup):
        return RoundShapes(
            "genrubric",
            policy_prompt=setup.induced_template.constant_length + rubric + question, **common)
    _, anchors, anchor_len = batch_shapes["anchors"]
    return RoundShapes("dynamic_rubric", policy_prompt=batch_shapes["policy_input"][1],
                       anchors=anchors, anchor_prefix=prefix + anchor_len, **common)


def round_flops_by_stage(policy: ModelConfig, generator: ModelConfig, verifier: ModelConfig,
                         config: RoundConfig, shapes: RoundShapes) -> dict[str, float]:
    """Model FLOPs of each stage of one round, named `role/stage`: sampling, verification,
    the reference log-probs (a role with beta > 0 that is not frozen) and the `num_updates`
    forward + backward passes of each trained role."""
    b, g = shapes.batch, config.num_rubrics
    if shapes.method == "genrubric":  # one policy answer per rubric group, under that rubric
        policy_prompts, samples = b * g, 1
    else:  # K answers per prompt
        policy_prompts, samples = b, config.num_responses
    responses = policy_prompts * samples
    branches = g * shapes.items
    stages = {
        "policy/sample": sampling_flops(policy, prompts=policy_prompts,
                                        prompt_len=shapes.policy_prompt, samples=samples,
                                        new_tokens=config.response_tokens),
        "generator/sample": sampling_flops(generator, prompts=b,
                                           prompt_len=shapes.generator_prompt, samples=g,
                                           new_tokens=shapes.rubric),
        "verifier/responses": tree_verify_flops(verifier, rows=responses,
                                                prefix_len=shapes.verifier_prefix,
                                                branches=branches, branch_len=shapes.branch),
    }
    if shapes.anchors:
        stages["verifier/anchors"] = tree_verify_flops(
            verifier, rows=b * shapes.anchors, prefix_len=shapes.anchor_prefix,
            branches=branches, branch_len=shapes.branch)
    trained = (
        ("generator", generator, config.freeze_generator, config.generator_beta,
         b * g, shapes.generator_prompt, shapes.rubric),
        ("policy", policy, config.freeze_policy, config.policy_beta,
         responses, shapes.policy_prompt, config.response_tokens),
    )
    for role, cfg, frozen, beta, rows, prompt_len, completion_len in trained:
        if frozen:
            continue
        forward = teacher_forced_flops(cfg, rows=rows, prompt_len=prompt_len,
                                       completion_len=completion_len)
        if beta > 0:
            stages[f"{role}/reference"] = forward
        stages[f"{role}/update"] = 3 * config.num_updates * forward
    return stages


def round_flops(policy: ModelConfig, generator: ModelConfig, verifier: ModelConfig,
                config: RoundConfig, shapes: RoundShapes) -> float:
    """Model FLOPs of one round: the sum of `round_flops_by_stage`."""
    return sum(round_flops_by_stage(policy, generator, verifier, config, shapes).values())


def round_flops_from_setup(setup: RoundSetup, batch_shapes: Mapping[str, Sequence[int]], *,
                           policy: ModelConfig, generator: ModelConfig,
                           verifier: ModelConfig) -> float:
    """Model FLOPs of one round of `setup` (either method) on a batch with `batch_shapes`;
    the model configs are the three `Decoder.config`s (a setup holds only graph definitions)."""
    return round_flops(policy, generator, verifier, setup.config,
                       round_shapes(setup, batch_shapes))


# Dense (not sparse) bf16 peak FLOP/s of one JAX device. TPU: Google Cloud TPU system
# architecture pages, per chip (cloud.google.com/tpu/docs/v4, v5e, v5p, v6e); a v4 / v5p chip is
# one JAX device (megacore), v5e / v6e chips have one TensorCore. NVIDIA: the product datasheets
# list bf16 Tensor Core FLOPS "with sparsity"; dense is half of that.
PEAK_FLOPS: dict[str, float] = {
    "TPU v4": 275e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v6e": 918e12,  # Trillium
    "NVIDIA A100": 312e12,  # SXM4 and PCIe, 40 and 80 GB (624 with sparsity)
    "NVIDIA H100 SXM": 989e12,  # 1,979 with sparsity
    "NVIDIA H100 PCIe": 756e12,  # 1,513 with sparsity
    "NVIDIA H100 NVL": 835e12,  # 1,671 with sparsity
    "NVIDIA H200": 989e12,  # SXM, 1,979 with sparsity
    "NVIDIA H200 NVL": 835e12,  # 1,671 with sparsity
}

# `jax.devices()[0].device_kind` (lowercased) -> PEAK_FLOPS key; first match wins. JAX names a
# v5p "TPU v5" (or "TPU v5p"), a v5e "TPU v5 lite", a v6e "TPU v6 lite"; CUDA names an H100 SXM
# "NVIDIA H100 80GB HBM3". Unknown kinds (CPU, GH200, H800, ...) get no peak rather than a guess.
_DEVICE_KINDS = (
    (r"tpu v4", "TPU v4"),
    (r"tpu v5 ?(lite|e)", "TPU v5e"),
    (r"tpu v5p?", "TPU v5p"),
    (r"tpu v6 ?(lite|e)", "TPU v6e"),
    (r".*\ba100\b.*", "NVIDIA A100"),
    (r".*\bh100\b.*\bpcie\b.*", "NVIDIA H100 PCIe"),
    (r".*\bh100\b.*\bnvl\b.*", "NVIDIA H100 NVL"),
    (r".*\bh100\b.*", "NVIDIA H100 SXM"),
    (r".*\bh200\b.*\bnvl\b.*", "NVIDIA H200 NVL"),
    (r".*\bh200\b.*", "NVIDIA H200"),
)


def peak_flops(device_kind: str) -> float | None:
    """Dense bf16 peak FLOP/s of one device of this `device_kind`, None when unknown."""
    kind = device_kind.strip().lower()
    for pattern, key in _DEVICE_KINDS:
        if re.fullmatch(pattern, kind):
            return PEAK_FLOPS[key]
    return None


def mfu(model_flops: float, seconds: float, num_devices: int, device_kind: str
        ) -> float | None:
    """Model FLOPs utilisation: `model_flops` done in `seconds` on `num_devices` devices, as a
    fraction of their bf16 peak (whatever the compute dtype, as is the convention); None when
    the device's peak is unknown (e.g. CPU)."""
    if seconds <= 0 or num_devices < 1:
        raise ValueError(f"need seconds > 0 and num_devices >= 1, got {seconds}, {num_devices}")
    peak = peak_flops(device_kind)
    return None if peak is None else model_flops / (seconds * num_devices * peak)
