"""Model FLOPs: a hand count, XLA's own count of the compiled forward and backward, the round's
shapes against the arrays the round builds, the peak table and MFU."""

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxrubric
from jaxrubric import coevolve, flops
from jaxrubric import genrubric_round as gr_round
from jaxrubric.models.transformer import Decoder
from jaxrubric.rubric import grammar as grammar_lib
from jaxrubric.rubric import templates as tpl
from jaxrubric.rubric import verifier as ver

TOKENIZER = Path(__file__).resolve().parents[1] / "configs" / "assets" / "tiny_tokenizer"
# XLA also counts elementwise work (norms, softmax, RoPE, SiLU) that model FLOPs leave out;
# on the tiny model that is a few percent of the matmuls.
XLA_TOLERANCE = 0.10


def _abstract_model(cfg) -> Decoder:
    """A model with parameter shapes but no weights: enough to compile it or build a setup."""
    return nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))


def _xla_flops(fn, *args) -> float:
    analysis = jax.jit(fn).lower(*args).compile().cost_analysis()
    if isinstance(analysis, list):  # older jax: one dict per program
        analysis = analysis[0]
    return float(analysis["flops"])


def test_per_token_forward_matches_a_hand_count():
    cfg = jaxrubric.tiny_config()  # D 64, F 128, 2 layers, 4 heads / 2 kv heads of 32, V 257
    per_layer = (64 * 4 * 32) * 2 + (64 * 2 * 32) * 2 + 3 * 64 * 128  # q, o; k, v; SwiGLU
    weights = 2 * 2 * per_layer
    head = 2 * 64 * 257
    attention_per_key = 4 * 2 * 4 * 32  # QK^T and AV, every layer and query head
    assert flops.forward_flops_per_token(cfg, 16, causal=False) == (
        weights + head + attention_per_key * 16)
    assert flops.forward_flops_per_token(cfg, 16) == weights + head + attention_per_key * 8
    # Tied embeddings cost the same: the lookup is a gather, the head a matmul either way.
    tied = cfg.replace(tie_word_embeddings=True)
    assert flops.forward_flops_per_token(tied, 16) == flops.forward_flops_per_token(cfg, 16)


def test_forward_and_backward_agree_with_xla():
    # Unrolled layers: XLA's cost analysis counts a scanned layer's loop body once.
    cfg = jaxrubric.tiny_config(scan_layers=False)
    graph, params = nnx.split(_abstract_model(cfg))
    batch, length = 2, 32
    tokens = jnp.zeros((batch, length), jnp.int32)
    # XLA computes the whole attention square (the causal mask only zeroes half of it), so it
    # is compared with the non-causal count.
    model = batch * length * flops.forward_flops_per_token(cfg, length, causal=False)

    forward = _xla_flops(lambda p, t: nnx.merge(graph, p)(t), params, tokens)
    assert 0 <= forward / model - 1 < XLA_TOLERANCE, (forward, model)

    def loss(p, t):
        return jax.nn.log_softmax(nnx.merge(graph, p)(t)).mean()

    train = _xla_flops(jax.grad(loss), params, tokens)
    assert abs(train / (3 * model) - 1) < XLA_TOLERANCE, (train, 3 * model)


def test_teacher_forced_projects_only_the_completion():
    cfg = jaxrubric.tiny_config(scan_layers=False)
    graph, params = nnx.split(_abstract_model(cfg))
    rows, prompt_len, completion_len = 3, 24, 8
    prompt = jnp.zeros((rows, prompt_len), jnp.int32)
    completion = jnp.zeros((rows, completion_len), jnp.int32)

    def logprobs(p, prompt, completion):
        return coevolve.completion_logprobs(nnx.merge(graph, p), prompt,
                                            jnp.ones_like(prompt, bool), completion,
                                            chunk_size=completion_len)

    xla = _xla_flops(logprobs, params, prompt, completion)
    length = prompt_len + completion_len
    full_square = flops.forward_flops(cfg, tokens=rows * length,
                                      attention_pairs=rows * length**2,
                                      logit_tokens=rows * completion_len)
    assert 0 <= xla / full_square - 1 < XLA_TOLERANCE, (xla, full_square)
    causal = flops.teacher_forced_flops(cfg, rows=rows, prompt_len=prompt_len,
                                        completion_len=completion_len)
    half = flops.forward_flops(cfg, tokens=0, attention_pairs=rows * length**2 / 2,
                               logit_tokens=0)
    assert causal == pytest.approx(full_square - half)


def test_tree_verification_counts_the_pairs_the_tree_mask_allows():
    cfg = jaxrubric.tiny_config()
    batch, responses, prefix_len, groups, items, item_len = 2, 3, 7, 2, 3, 4
    suffix = jnp.asarray([5, 6], jnp.int32)
    tokens, _, mask, _ = ver.tree_inputs(
        jnp.ones((batch, responses, prefix_len), jnp.int32),
        jnp.full((batch, responses), prefix_len), jnp.ones((batch, groups, items, item_len),
                                                           jnp.int32),
        jnp.full((batch, groups, items), item_len), suffix)
    rows, length = batch * responses, tokens.shape[-1]
    # The mask holds the diagonal too; the T^2/2 convention counts half of it.
    pairs = int(np.asarray(mask).sum()) - rows * length / 2
    expected = flops.forward_flops(cfg, tokens=rows * length, attention_pairs=pairs,
                                   logit_tokens=rows * groups * items)
    assert flops.tree_verify_flops(cfg, rows=rows, prefix_len=prefix_len,
                                   branches=groups * items,
                                   branch_len=item_len + 2) == pytest.approx(expected)


def _setup(method: str, round_config: coevolve.RoundConfig):
    tok = jaxrubric.load_tokenizer(str(TOKENIZER))
    cfg = jaxrubric.tiny_config("qwen3", vocab_size=len(tok), eos_token_ids=(tok.eos_token_id,),
                                pad_token_id=tok.pad_token_id)
    # A setup takes only the models' graphs and configs.
    model = _abstract_model(cfg)
    build = coevolve.build_setup if method == "dynamic_rubric" else gr_round.build_genrubric_setup
    setup = build(round_config, tok, model, model, model, max_items=3, max_item_tokens=6,
                  policy_optimizer=optax.adam(1e-3), generator_optimizer=optax.adam(1e-3))
    return setup, cfg


def _int(shape):
    return jax.ShapeDtypeStruct(shape, jnp.int32)


def test_round_shapes_are_the_shapes_the_round_builds():
    B, Lq, Lp, n, La = 2, 16, 32, 3, 8
    config = coevolve.RoundConfig(num_responses=4, num_rubrics=2, response_tokens=12)
    K, G, Lr = 4, 2, 12
    batch_shapes = {"prompt": (B, Lq), "policy_input": (B, Lp), "anchors": (B, n, La)}
    setup, cfg = _setup("dynamic_rubric", config)
    shapes = flops.round_shapes(setup, batch_shapes)
    assert flops.round_flops_from_setup(
        setup, batch_shapes, policy=cfg, generator=cfg, verifier=cfg
    ) == flops.round_flops(cfg, cfg, cfg, config, shapes)
    grammar = setup.grammar

    def built(prompt, responses, anchors, rubrics):
        gen = tpl.assemble(setup.generator_template,
                           [prompt, *(responses[:, k] for k in range(K))],
                           [jnp.ones(B, jnp.int32)] * (K + 1), align="right")
        prefix = ver.verifier_prefix(setup.verifier_template, prompt, jnp.ones(B, jnp.int32),
                                     responses, jnp.ones((B, K), jnp.int32))
        anchor_prefix = ver.verifier_prefix(setup.verifier_template, prompt,
                                            jnp.ones(B, jnp.int32), anchors,
                                            jnp.ones((B, n), jnp.int32))
        parsed = grammar_lib.parse_rubric_tokens(rubrics, grammar, 0)
        tree, *_ = ver.tree_inputs(prefix.tokens, prefix.lengths, parsed.items,
                                   parsed.item_lengths, setup.readout.suffix)
        return gen.tokens, prefix.tokens, anchor_prefix.tokens, parsed.items, tree

    gen, prefix, anchor_prefix, items, tree = jax.eval_shape(
        built, _int((B, Lq)), _int((B, K, Lr)), _int((B, n, La)),
        _int((B, G, grammar.max_rubric_tokens)))
    assert shapes == flops.RoundShapes(
        "dynamic_rubric", batch=B, policy_prompt=Lp, generator_prompt=gen.shape[-1],
        rubric=grammar.max_rubric_tokens, items=items.shape[2],
        branch=(tree.shape[-1] - prefix.shape[-1]) // (G * items.shape[2]),
        verifier_prefix=prefix.shape[-1], anchors=n, anchor_prefix=anchor_prefix.shape[-1])

    gr_setup, _ = _setup("genrubric", config)
    gr_shapes = flops.round_shapes(gr_setup, batch_shapes)
    # Signed weights ("-5") make GenRubric's longest rubric longer than DynamicRubric's.
    gr_rubric = gr_setup.grammar.max_rubric_tokens
    slots = {"rubric": _int((B, G, gr_rubric)), "prompt": _int((B, 1, Lq))}
    induced = jax.eval_shape(
        lambda *t: tpl.assemble(gr_setup.induced_template, t,
                                [jnp.ones((B, 1), jnp.int32)] * len(t), align="right").tokens,
        *(slots[s] for s in gr_setup.induced_template.slots))
    gr_gen = jax.eval_shape(lambda p: tpl.assemble(gr_setup.generator_template, [p],
                                                   [jnp.ones(B, jnp.int32)]).tokens,
                            _int((B, Lq)))
    assert (gr_shapes.method, gr_shapes.anchors) == ("genrubric", 0)
    assert gr_shapes.policy_prompt == induced.shape[-1]
    assert gr_shapes.generator_prompt == gr_gen.shape[-1]
    assert gr_shapes.verifier_prefix == prefix.shape[-1]


def test_round_flops_stages_follow_the_config():
    cfg = jaxrubric.tiny_config()
    shapes = flops.RoundShapes("dynamic_rubric", batch=2, policy_prompt=32, generator_prompt=200,
                               rubric=40, items=3, branch=9, verifier_prefix=60, anchors=3,
                               anchor_prefix=50)
    base = coevolve.RoundConfig(num_responses=4, num_rubrics=2, response_tokens=12)
    stages = flops.round_flops_by_stage(cfg, cfg, cfg, base, shapes)
    assert set(stages) == {"policy/sample", "generator/sample", "verifier/responses",
                           "verifier/anchors", "policy/reference", "policy/update",
                           "generator/reference", "generator/update"}
    policy_forward = flops.teacher_forced_flops(cfg, rows=8, prompt_len=32, completion_len=12)
    assert stages["policy/reference"] == policy_forward
    assert stages["policy/update"] == 3 * policy_forward
    assert stages["generator/update"] == 3 * flops.teacher_forced_flops(
        cfg, rows=4, prompt_len=200, completion_len=40)
    assert stages["policy/sample"] == flops.sampling_flops(cfg, prompts=2, prompt_len=32,
                                                           samples=4, new_tokens=12)
    assert stages["verifier/anchors"] == flops.tree_verify_flops(cfg, rows=6, prefix_len=50,
                                                                 branches=6, branch_len=9)
    assert flops.round_flops(cfg, cfg, cfg, base, shapes) == pytest.approx(sum(stages.values()))

    varied = coevolve.RoundConfig(num_responses=4, num_rubrics=2, response_tokens=12,
                                  policy_beta=0.0, num_updates=2, freeze_generator=True)
    stages = flops.round_flops_by_stage(cfg, cfg, cfg, varied, shapes)
    assert set(stages) == {"policy/sample", "generator/sample", "verifier/responses",
                           "verifier/anchors", "policy/update"}
    assert stages["policy/update"] == 6 * policy_forward

    gr_shapes = dataclasses.replace(shapes, method="genrubric", anchors=0, anchor_prefix=0)
    gr = flops.round_flops_by_stage(cfg, cfg, cfg, base, gr_shapes)
    assert "verifier/anchors" not in gr
    # GenRubric: one induced answer per (prompt, rubric group): B * G rows, one sample each.
    assert gr["policy/sample"] == flops.sampling_flops(cfg, prompts=4, prompt_len=32, samples=1,
                                                       new_tokens=12)
    assert gr["verifier/responses"] == flops.tree_verify_flops(cfg, rows=4, prefix_len=60,
                                                               branches=6, branch_len=9)


@pytest.mark.parametrize("kind, peak", [
    ("TPU v4", 275e12), ("TPU v5 lite", 197e12), ("TPU v5e", 197e12), ("TPU v5", 459e12),
    ("TPU v5p", 459e12), ("TPU v6 lite", 918e12), ("TPU v6e", 918e12),
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H200", 989e12), ("NVIDIA H200 NVL", 835e12), ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A100-SXM4-40GB", 312e12), ("NVIDIA A100 80GB PCIe", 312e12),
])
def test_peak_flops_of_known_devices(kind, peak):
    assert flops.peak_flops(kind) == peak


@pytest.mark.parametrize("kind", ["cpu", "TFRT_CPU_0", "TPU v4 lite", "TPU v3",
                                  "NVIDIA GH200 480GB", "NVIDIA H800", "Tesla V100-SXM2-16GB"])
def test_unknown_devices_have_no_peak(kind):
    assert flops.peak_flops(kind) is None


def test_mfu():
    # 4 H100s at 989 TFLOP/s for 2 s could do 7912 TFLOPs; 1978.0 TFLOPs is a quarter of it.
    assert flops.mfu(1978e12, 2.0, 4, "NVIDIA H100 80GB HBM3") == pytest.approx(0.25)
    assert flops.mfu(1e12, 1.0, 8, jax.devices()[0].device_kind) is None  # CPU
    with pytest.raises(ValueError, match="seconds > 0"):
        flops.mfu(1e12, 0.0, 1, "TPU v4")
    with pytest.raises(ValueError, match="num_devices >= 1"):
        flops.mfu(1e12, 1.0, 0, "TPU v4")
