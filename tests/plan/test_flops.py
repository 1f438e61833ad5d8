"""Model FLOPs: a hand count, XLA's own count of the compiled forward and backward, the round's
shapes against the arrays the round builds, the peak table and MFU."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from helpers import TINY_TOKENIZER, abstract_models, build_setup, tiny_model_config

import jaxrubric
from jaxrubric import flops
from jaxrubric import mfu as mfu_lib
from jaxrubric.methods import DYNAMIC_RUBRIC, GENRUBRIC, update
from jaxrubric.methods.batches import batch_shapes, encode_batch
from jaxrubric.methods.dynamic_rubric import DynamicRubricConfig
from jaxrubric.methods.genrubric import GenRubricConfig
from jaxrubric.methods.round_config import RoleConfig, RoundConfig
from jaxrubric.methods.data import Frozen, RoleState, RoundState
from jaxrubric.methods.shapes import RoundShapes, Sampling, Update, Verification
from jaxrubric.roles import ROLES, Role
from jaxrubric.rubric import dense_tree
from jaxrubric.rubric import grammar as grammar_lib
from jaxrubric.rubric import templates as tpl
from jaxrubric.rubric import verifier as ver

# XLA also counts elementwise work (norms, softmax, RoPE, SiLU) that model FLOPs leave out;
# on the tiny model that is a few percent of the matmuls.
XLA_TOLERANCE = 0.10


def _abstract_model(cfg):
    """A model with parameter shapes but no weights: enough to compile it."""
    return abstract_models(cfg)[Role.POLICY]


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
        return update.completion_logprobs(nnx.merge(graph, p), prompt,
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


def test_shared_prefix_forward_computes_what_the_count_says():
    """XLA's FLOPs of the shared-prefix forward: the prefix once, each branch's scores to the
    prefix and to its own tokens (whole squares: the count's causal halves are masked, not
    skipped), so XLA = the count + the masked halves."""
    cfg = jaxrubric.tiny_config(scan_layers=False)
    graph, params = nnx.split(_abstract_model(cfg))
    prompts, prompt_len, samples, completion_len = 2, 24, 3, 8
    prompt = jnp.zeros((prompts, prompt_len), jnp.int32)
    completion = jnp.zeros((prompts, samples, completion_len), jnp.int32)

    def logprobs(p, prompt, completion):
        return update.shared_completion_logprobs(nnx.merge(graph, p), prompt,
                                               jnp.ones_like(prompt, bool), completion,
                                               chunk_size=completion_len)

    xla = _xla_flops(logprobs, params, prompt, completion)
    count = flops.shared_teacher_forced_flops(cfg, prompts=prompts, prompt_len=prompt_len,
                                              samples=samples, completion_len=completion_len)
    masked = flops.forward_flops(cfg, tokens=0, logit_tokens=0, attention_pairs=prompts * (
        prompt_len**2 / 2 + samples * completion_len**2 / 2))
    assert 0 <= xla / (count + masked) - 1 < XLA_TOLERANCE, (xla, count + masked)
    unshared = flops.teacher_forced_flops(cfg, rows=prompts * samples, prompt_len=prompt_len,
                                          completion_len=completion_len)
    assert count < unshared


def test_verification_computes_what_the_count_says():
    """XLA's FLOPs of `verify`: each prefix once, each branch's scores to the prefix and to its
    own slots (whole squares again, so XLA = the count + the masked halves), no scores between
    branches; the dense tree-masked forward it replaced computes the whole row's square. With
    unrolled layers XLA drops the last layer's output projection and MLP of the prefixes,
    which nothing reads (the count, like a scanned model, keeps them)."""
    cfg = jaxrubric.tiny_config(scan_layers=False)
    graph, params = nnx.split(_abstract_model(cfg))
    batch, responses, prefix_len, groups, items, item_len = 2, 3, 24, 2, 3, 6
    readout = ver.VerifierReadout(suffix=(5, 6), yes_ids=(7,), no_ids=(8,))
    rows, branches, branch_len = batch * responses, groups * items, item_len + 2
    inputs = (jnp.ones((batch, responses, prefix_len), jnp.int32),
              jnp.full((batch, responses), prefix_len),
              jnp.ones((batch, groups, items, item_len), jnp.int32),
              jnp.full((batch, groups, items), item_len))

    xla = _xla_flops(lambda p, *xs: ver.verify(nnx.merge(graph, p), readout, *xs,
                                               jnp.ones((batch, groups, items), bool)).p_yes,
                     params, *inputs)
    count = flops.tree_verify_flops(cfg, rows=rows, prefix_len=prefix_len, branches=branches,
                                    branch_len=branch_len, readout_tokens=2)
    masked = flops.forward_flops(cfg, tokens=0, logit_tokens=0, attention_pairs=rows * (
        prefix_len**2 / 2 + branches * branch_len**2 / 2))
    unread = rows * prefix_len * 2 * (64 * 4 * 32 + 3 * 64 * 128)  # o_proj, SwiGLU (D 64, F 128)
    expected = count + masked - unread
    assert abs(xla / expected - 1) < XLA_TOLERANCE, (xla, expected)

    dense = _xla_flops(lambda p, *xs: dense_tree.answer_logits(nnx.merge(graph, p), *xs,
                                                               readout.suffix), params, *inputs)
    length = prefix_len + branches * branch_len
    square = flops.forward_flops(cfg, tokens=rows * length, attention_pairs=rows * length**2,
                                 logit_tokens=rows * branches)
    assert 0 <= dense / square - 1 < XLA_TOLERANCE, (dense, square)
    assert xla < 0.75 * dense


def _setup(method: str, round_config: RoundConfig):
    tok = jaxrubric.load_tokenizer(str(TINY_TOKENIZER))
    cfg = tiny_model_config(tok)
    # A setup takes only the models' graphs and configs.
    return build_setup(method, round_config, tok, abstract_models(cfg)), cfg, tok


def _int(shape):
    return jax.ShapeDtypeStruct(shape, jnp.int32)


def _traced(method, setup, tok, B, Lq, Lp, n, La):
    """`method`'s round shapes, traced on abstract inputs of the tiny models (`_setup`)."""
    params = {role: nnx.state(abstract_models(tiny_model_config(tok))[role], nnx.Param)
              for role in ROLES}
    state = RoundState(RoleState(params[Role.POLICY], None), RoleState(params[Role.GENERATOR], None),
                       jax.ShapeDtypeStruct((), jnp.int32))
    frozen = Frozen(params[Role.VERIFIER], policy_ref=params[Role.POLICY],
                    generator_ref=params[Role.GENERATOR])
    data = types.SimpleNamespace(batch_size=B, prompt_tokens=Lq, policy_tokens=Lp,
                                 anchor_tokens=La, num_anchors=n)
    return method.round_shapes(setup, state, frozen, batch_shapes(tok, data), jax.random.key(0))


def test_round_shapes_are_the_shapes_the_round_builds():
    B, Lq, Lp, n, La = 2, 16, 32, 3, 8
    config = DynamicRubricConfig(num_responses=4, num_rubrics=2, response_tokens=12)
    K, G, Lr = 4, 2, 12
    setup, cfg, tok = _setup("dynamic_rubric", config)
    shapes = _traced(DYNAMIC_RUBRIC, setup, tok, B, Lq, Lp, n, La)
    models = dict.fromkeys(ROLES, cfg)
    assert flops.round_flops(models, config, shapes) == pytest.approx(
        sum(flops.round_flops_by_stage(models, config, shapes).values()))
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
        branches, _ = ver.branch_inputs(parsed.items, parsed.item_lengths, setup.readout.suffix)
        return gen.tokens, prefix.tokens, anchor_prefix.tokens, parsed.items, branches

    gen, prefix, anchor_prefix, items, branches = jax.eval_shape(
        built, _int((B, Lq)), _int((B, K, Lr)), _int((B, n, La)),
        _int((B, G, grammar.max_rubric_tokens)))
    rubric, M = grammar.max_rubric_tokens, items.shape[2]
    assert branches.shape[:2] == (B, G * M)
    branch, readout = branches.shape[-1], len(setup.readout.token_ids)
    assert shapes.sampling == (
        Sampling(Role.POLICY, "policy rollout", B, K, Lp, Lr),
        Sampling(Role.GENERATOR, "generator rollout", B, G, gen.shape[-1], rubric))
    assert shapes.verification == (
        Verification("responses", B * K, prefix.shape[-1], G * M, branch, readout),
        Verification("anchors", B * n, anchor_prefix.shape[-1], G * M, branch, readout))
    # Each prompt's G rubrics, and its K answers, share it (encoded once with share_prefix).
    assert shapes.updates == (Update(Role.GENERATOR, B * G, gen.shape[-1], rubric, G),
                              Update(Role.POLICY, B * K, Lp, Lr, K))

    # What a stage reads from another role: the batch's rows as `encode_batch` builds them,
    # and the responses (tokens, lengths, finished, log-probs twice, text lengths).
    host = encode_batch(tok, ["Sort 3 1 2.", "Reverse cat."], [["1 2 3"], ["tac"]],
                        prompt_tokens=Lq, policy_tokens=Lp, anchor_tokens=La,
                        num_anchors=n)
    row_bytes = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree)) // B  # noqa: E731
    assert set(shapes.reads) == {(Role.GENERATOR, 0), (Role.VERIFIER, 0), (Role.GENERATOR, 1),
                                 (Role.POLICY, 1)}  # the policy's rollout reads its own
    from_policy = {r.source: r for r in shapes.reads[Role.VERIFIER, 0]}[Role.POLICY]
    assert from_policy.bytes_per_prompt == (row_bytes(host.question) + row_bytes(host.anchors)
                                            + K * (12 * Lr + 5 + 4))

    gr_config = GenRubricConfig(num_rubrics=2, response_tokens=12)
    gr_setup, _, _ = _setup("genrubric", gr_config)
    gr_shapes = _traced(GENRUBRIC, gr_setup, tok, B, Lq, Lp, n, La)
    # Signed weights ("-5") make GenRubric's longest rubric longer than DynamicRubric's.
    gr_rubric = gr_setup.grammar.max_rubric_tokens
    assert gr_rubric > rubric
    slots = {"rubric": _int((B, G, gr_rubric)), "prompt": _int((B, 1, Lq))}
    induced = jax.eval_shape(
        lambda *t: tpl.assemble(gr_setup.induced_template, t,
                                [jnp.ones((B, 1), jnp.int32)] * len(t), align="right").tokens,
        *(slots[s] for s in gr_setup.induced_template.slots))
    gr_gen = jax.eval_shape(lambda p: tpl.assemble(gr_setup.generator_template, [p],
                                                   [jnp.ones(B, jnp.int32)]).tokens,
                            _int((B, Lq)))
    assert gr_shapes.sampling == (
        Sampling(Role.GENERATOR, "generator rollout", B, G, gr_gen.shape[-1], gr_rubric),
        Sampling(Role.POLICY, "policy rollout (induced responses)", B * G, 1,
                 induced.shape[-1], Lr))
    # No anchors: the induced responses alone, under the same verifier prefix.
    assert gr_shapes.verification == (
        Verification("induced responses", B * G, prefix.shape[-1], G * M, branch, readout),)
    assert gr_shapes.updates == (Update(Role.GENERATOR, B * G, gr_gen.shape[-1], gr_rubric, G),
                                 Update(Role.POLICY, B * G, induced.shape[-1], Lr))
    assert {(Role.POLICY, 0), (Role.VERIFIER, 0), (Role.GENERATOR, 1)} <= set(gr_shapes.reads)


# Hand-picked shapes: a policy prompt of 32, a generator prompt of 136 + 16 + 4 x 12 = 200, a
# rubric of 40, 3 items, branches of 6 + 3 = 9, verifier prefixes of 32 + 16 + 12 = 60
# (responses) and 32 + 16 + 2 = 50 (anchors), 2 prompts; GenRubric's generator prompt of
# 136 + 16 = 152 and induced prompt of 10 + 40 + 16 = 66.
DR_ROLLOUTS = (Sampling(Role.POLICY, "policy rollout", 2, 4, 32, 12),
               Sampling(Role.GENERATOR, "generator rollout", 2, 2, 200, 40))
DR_PASSES = (Verification("responses", 8, 60, 6, 9, 2),
             Verification("anchors", 6, 50, 6, 9, 2))
DR_UPDATES = {Role.GENERATOR: Update(Role.GENERATOR, 4, 200, 40, 2),
              Role.POLICY: Update(Role.POLICY, 8, 32, 12, 4)}


def dr_shapes(*roles: Role) -> RoundShapes:
    """DynamicRubric's hand-picked shapes with the updates of `roles` (default: both)."""
    roles = roles or (Role.GENERATOR, Role.POLICY)
    return RoundShapes(DR_ROLLOUTS, DR_PASSES, tuple(DR_UPDATES[r] for r in roles), {})


GR_SHAPES = RoundShapes(
    (Sampling(Role.GENERATOR, "generator rollout", 2, 2, 152, 40),
     Sampling(Role.POLICY, "policy rollout (induced responses)", 4, 1, 66, 12)),
    (Verification("induced responses", 4, 60, 6, 9, 2),),
    (Update(Role.GENERATOR, 4, 152, 40, 2), Update(Role.POLICY, 4, 66, 12)), {})


def test_round_flops_stages_follow_the_config():
    # A model per role, each of its own size: every stage must count its own role's model.
    models = {Role.POLICY: jaxrubric.tiny_config(), Role.GENERATOR: jaxrubric.tiny_config(
        num_layers=3), Role.VERIFIER: jaxrubric.tiny_config(num_layers=1, hidden_size=32)}
    policy, generator, verifier = (models[r] for r in (Role.POLICY, Role.GENERATOR,
                                                        Role.VERIFIER))
    base = DynamicRubricConfig(num_responses=4, num_rubrics=2, response_tokens=12)  # prompts shared
    shapes = dr_shapes()
    stages = flops.round_flops_by_stage(models, base, shapes)
    assert set(stages) == {"policy/sample", "generator/sample", "verifier/responses",
                           "verifier/anchors", "policy/reference", "policy/update",
                           "generator/reference", "generator/update"}
    policy_forward = flops.shared_teacher_forced_flops(policy, prompts=2, prompt_len=32,
                                                       samples=4, completion_len=12)
    assert stages["policy/reference"] == policy_forward
    assert stages["policy/update"] == 3 * policy_forward
    assert stages["generator/update"] == 3 * flops.shared_teacher_forced_flops(
        generator, prompts=2, prompt_len=200, samples=2, completion_len=40)
    unshared = dataclasses.replace(base, share_prefix=False)  # a row per sample
    rows = flops.round_flops_by_stage(models, unshared, shapes)
    assert rows["policy/update"] == 3 * flops.teacher_forced_flops(
        policy, rows=8, prompt_len=32, completion_len=12)
    assert rows["generator/update"] == 3 * flops.teacher_forced_flops(
        generator, rows=4, prompt_len=200, completion_len=40)
    assert stages["policy/sample"] == flops.sampling_flops(policy, prompts=2, prompt_len=32,
                                                           samples=4, new_tokens=12)
    assert stages["generator/sample"] == flops.sampling_flops(generator, prompts=2,
                                                              prompt_len=200, samples=2,
                                                              new_tokens=40)
    assert stages["verifier/responses"] == flops.tree_verify_flops(
        verifier, rows=8, prefix_len=60, branches=6, branch_len=9, readout_tokens=2)
    assert stages["verifier/anchors"] == flops.tree_verify_flops(
        verifier, rows=6, prefix_len=50, branches=6, branch_len=9, readout_tokens=2)
    assert flops.round_flops(models, base, shapes) == pytest.approx(sum(stages.values()))

    varied = DynamicRubricConfig(num_responses=4, num_rubrics=2, response_tokens=12, num_updates=2,
                                 policy=RoleConfig(beta=0.0), generator=RoleConfig(freeze=True))
    stages = flops.round_flops_by_stage(models, varied, dr_shapes(Role.POLICY))
    assert set(stages) == {"policy/sample", "generator/sample", "verifier/responses",
                           "verifier/anchors", "policy/update"}
    assert stages["policy/update"] == 6 * policy_forward
    # Behind a runtime switch the frozen generator's update is compiled but skipped: no FLOPs.
    switched = dataclasses.replace(varied, runtime_switches=True)
    assert flops.round_flops_by_stage(models, switched, dr_shapes()) == stages

    # The forward KL: the reference stops at its hidden states, and each update step projects
    # them to the vocabulary (2 prompts x G = 2 rubrics of 40 tokens, 2 steps).
    forward_kl = dataclasses.replace(
        base, generator=dataclasses.replace(base.generator, kl="forward"), num_updates=2)
    fk = flops.round_flops_by_stage(models, forward_kl, shapes)
    logits = 2 * generator.hidden_size * generator.vocab_size * 4 * 40
    generator_forward = flops.shared_teacher_forced_flops(generator, prompts=2, prompt_len=200,
                                                          samples=2, completion_len=40)
    assert fk["generator/reference"] == generator_forward - logits
    assert fk["generator/update"] == 6 * generator_forward + 2 * logits
    assert fk["policy/update"] == 6 * policy_forward

    gr_base = GenRubricConfig(num_rubrics=2, response_tokens=12)
    gr = flops.round_flops_by_stage(models, gr_base, GR_SHAPES)
    assert set(gr) == {"generator/sample", "policy/sample", "verifier/induced responses",
                       "generator/reference", "generator/update", "policy/reference",
                       "policy/update"}
    # GenRubric: one induced answer per (prompt, rubric group): B * G rows, one sample each.
    assert gr["policy/sample"] == flops.sampling_flops(policy, prompts=4, prompt_len=66,
                                                       samples=1, new_tokens=12)
    assert gr["verifier/induced responses"] == flops.tree_verify_flops(
        verifier, rows=4, prefix_len=60, branches=6, branch_len=9, readout_tokens=2)
    assert gr["generator/update"] == 3 * flops.shared_teacher_forced_flops(
        generator, prompts=2, prompt_len=152, samples=2, completion_len=40)
    # Each induced answer has its own prompt (its rubric group's): nothing to share.
    assert gr["policy/update"] == 3 * flops.teacher_forced_flops(
        policy, rows=4, prompt_len=66, completion_len=12)


@pytest.mark.parametrize("kind, peak", [
    ("TPU v4", 275e12), ("TPU v5 lite", 197e12), ("TPU v5e", 197e12), ("TPU v5", 459e12),
    ("TPU v5p", 459e12), ("TPU v6 lite", 918e12), ("TPU v6e", 918e12),
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H200", 989e12), ("NVIDIA H200 NVL", 835e12), ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A100-SXM4-40GB", 312e12), ("NVIDIA A100 80GB PCIe", 312e12),
])
def test_peak_flops_of_known_devices(kind, peak):
    assert mfu_lib.peak_flops(kind) == peak


@pytest.mark.parametrize("kind", ["cpu", "TFRT_CPU_0", "TPU v4 lite", "TPU v3",
                                  "NVIDIA GH200 480GB", "NVIDIA H800", "Tesla V100-SXM2-16GB"])
def test_unknown_devices_have_no_peak(kind):
    assert mfu_lib.peak_flops(kind) is None


def test_mfu():
    # 4 H100s at 989 TFLOP/s for 2 s could do 7912 TFLOPs; 1978.0 TFLOPs is a quarter of it.
    assert mfu_lib.mfu(1978e12, 2.0, 4, "NVIDIA H100 80GB HBM3") == pytest.approx(0.25)
    assert mfu_lib.mfu(1e12, 1.0, 8, jax.devices()[0].device_kind) is None  # CPU
    with pytest.raises(ValueError, match="seconds > 0"):
        mfu_lib.mfu(1e12, 0.0, 1, "TPU v4")
    with pytest.raises(ValueError, match="num_devices >= 1"):
        mfu_lib.mfu(1e12, 1.0, 0, "TPU v4")
