"""The sampler against transformers' greedy decoding, teacher forcing and its own targets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hf_fixtures import make_hf_model, save_hf_model
from scipy import stats

import jaxrubric
from jaxrubric import sampling
from jaxrubric import sharding as shd
from jaxrubric.models.transformer import MASKED_LOGIT, KVCache, SampleCache

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21], [22]]


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def checkpoint(request, tmp_path_factory):
    """A random transformers model and the folder it is saved in."""
    hf = make_hf_model(request.param, seed=1)
    return hf, save_hf_model(hf, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def pair(checkpoint):
    hf, folder = checkpoint
    return hf, jaxrubric.load_pretrained(folder)


@pytest.mark.slow
def test_greedy_equals_transformers_generate(pair):
    hf, model = pair
    out = sampling.generate(model, PROMPTS, max_new_tokens=10, temperature=0.0,
                            stop_token_ids=[], rng=jax.random.key(0))
    assert out.tokens.shape == (len(PROMPTS), 1, 10)
    for i, prompt in enumerate(PROMPTS):
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False,
                          eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        assert np.asarray(out.tokens[i, 0]).tolist() == ref, i


def _teacher_forced_logprobs(model, prompt, completion):
    ids = jnp.asarray([list(prompt) + list(completion)])
    logp = jax.nn.log_softmax(model(ids)[0], axis=-1)
    n = len(prompt)
    return np.asarray(logp[n - 1:n - 1 + len(completion)][np.arange(len(completion)),
                                                          np.asarray(completion)])


def test_samples_reading_the_prompt_once_equal_samples_on_their_own_copies(pair):
    """`Decoder.decode_step` (each prompt's cache once, each sample's own tokens apart) against
    the plain cache: each sample prefills its own copy of the prompt and writes its tokens
    into it. Left-padded prompts of different lengths, three samples each, distinct tokens."""
    _, model = pair
    samples, steps = 3, 4
    ids, lengths = sampling.left_pad(PROMPTS, 16)
    ids, lengths = jnp.asarray(ids), jnp.asarray(lengths)
    mask = jnp.arange(16)[None] >= (16 - lengths)[:, None]
    new = jnp.asarray(np.random.RandomState(0).randint(3, 200, (len(PROMPTS) * samples, steps)))
    positions = jnp.repeat(lengths, samples)[:, None]

    @jax.jit
    def shared():
        prompts, _ = sampling.prefill(model, ids, mask)
        cache, out = SampleCache.empty(prompts, samples, steps), []
        for t in range(steps):
            hidden, cache = model.decode_step(new[:, t:t + 1], positions + t, prompts, cache)
            out.append(model.logits(hidden)[:, 0])
        return jnp.stack(out, 1)

    @jax.jit
    def copied():
        cache = KVCache.empty(model.config, len(PROMPTS) * samples, 16 + steps)
        _, cache = model.hidden_states(jnp.repeat(ids, samples, 0),
                                       attention_mask=jnp.repeat(mask, samples, 0), cache=cache)
        out = []
        for t in range(steps):
            hidden, cache = model.hidden_states(new[:, t:t + 1], positions=positions + t,
                                                cache=cache)
            out.append(model.logits(hidden)[:, 0])
        return jnp.stack(out, 1)

    np.testing.assert_allclose(shared(), copied(), atol=2e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("temperature, top_k", [(1.3, 50), (1.0, None)])
def test_logprobs_equal_teacher_forcing(pair, temperature, top_k):
    _, model = pair
    out = sampling.generate(model, PROMPTS[:3], num_samples=2, max_new_tokens=8,
                            temperature=temperature, top_k=top_k, rng=jax.random.key(1))
    for i, prompt in enumerate(PROMPTS[:3]):
        for k in range(2):
            n = int(out.lengths[i, k])
            completion = np.asarray(out.tokens[i, k, :n])
            ref = _teacher_forced_logprobs(model, prompt, completion)
            np.testing.assert_allclose(np.asarray(out.logprobs[i, k, :n]), ref, atol=1e-5)
            sampled = np.asarray(out.sampling_logprobs[i, k, :n])
            if top_k is None:  # sampled from the model itself: one log-softmax serves both
                np.testing.assert_array_equal(sampled, np.asarray(out.logprobs[i, k, :n]))
            else:  # the tempered, top-k distribution's: different
                assert not np.allclose(sampled, ref)


@pytest.mark.slow
def test_the_model_distribution_path_equals_the_filtered_path(pair):
    """At temperature 1 without filters the sampler skips filtering and the second
    log-softmax; over the same distribution (top-k = the whole vocabulary) the general path
    samples the same tokens with the same log-probs."""
    _, model = pair
    kwargs = dict(num_samples=3, max_new_tokens=8, temperature=1.0, rng=jax.random.key(4))
    plain = sampling.generate(model, PROMPTS, **kwargs)
    general = sampling.generate(model, PROMPTS, top_k=model.config.vocab_size, **kwargs)
    np.testing.assert_array_equal(np.asarray(plain.tokens), np.asarray(general.tokens))
    for field in ("logprobs", "sampling_logprobs"):
        np.testing.assert_allclose(np.asarray(getattr(plain, field)),
                                   np.asarray(getattr(general, field)), atol=1e-6)


@pytest.mark.slow
def test_top_k_one_is_greedy(pair):
    _, model = pair
    greedy = sampling.generate(model, PROMPTS, max_new_tokens=6, temperature=0.0,
                               stop_token_ids=[], rng=jax.random.key(0))
    top1 = sampling.generate(model, PROMPTS, max_new_tokens=6, temperature=0.7, top_k=1,
                             stop_token_ids=[], rng=jax.random.key(5))
    np.testing.assert_array_equal(np.asarray(greedy.tokens), np.asarray(top1.tokens))


@pytest.mark.slow
def test_same_rng_same_samples_and_padding_invariance(pair):
    _, model = pair
    kwargs = dict(max_new_tokens=7, temperature=1.0, num_samples=3, rng=jax.random.key(3))
    a = sampling.generate(model, PROMPTS, **kwargs)
    b = sampling.generate(model, PROMPTS, **kwargs)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    # A row's key is its own: its samples do not depend on how many rows follow it.
    first = sampling.generate(model, PROMPTS[:2], **kwargs)
    np.testing.assert_array_equal(np.asarray(first.tokens), np.asarray(a.tokens[:2]))
    alone = sampling.generate(model, [PROMPTS[1]], max_new_tokens=7, temperature=0.0,
                              stop_token_ids=[], rng=jax.random.key(0))
    batch = sampling.generate(model, PROMPTS, max_new_tokens=7, temperature=0.0,
                              stop_token_ids=[], rng=jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(alone.tokens[0]), np.asarray(batch.tokens[1]))


def test_padded_array_input_equals_lists(pair):
    _, model = pair
    width = max(map(len, PROMPTS))
    array = np.zeros((len(PROMPTS), width), np.int32)
    for i, p in enumerate(PROMPTS):
        array[i, :len(p)] = p
    kwargs = dict(max_new_tokens=5, temperature=0.0, rng=jax.random.key(0), stop_token_ids=[])
    a = sampling.generate(model, array, prompt_lengths=[len(p) for p in PROMPTS], **kwargs)
    b = sampling.generate(model, PROMPTS, **kwargs)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))


def test_stop_tokens_end_rows_and_padding_follows(pair):
    _, model = pair
    greedy = sampling.generate(model, PROMPTS, max_new_tokens=8, temperature=0.0,
                               stop_token_ids=[], rng=jax.random.key(0))
    # Stop on the token row 0 produces at step 2: row 0 ends there with length 3.
    stop = int(greedy.tokens[0, 0, 2])
    out = sampling.generate(model, PROMPTS, max_new_tokens=8, temperature=0.0,
                            stop_token_ids=[stop], pad_id=0, rng=jax.random.key(0))
    tokens, lengths = np.asarray(out.tokens[:, 0]), np.asarray(out.lengths[:, 0])
    for i in range(len(PROMPTS)):
        ref = np.asarray(greedy.tokens[i, 0])
        hits = np.where(ref == stop)[0]
        expected = int(hits[0]) + 1 if hits.size else 8
        assert lengths[i] == expected
        assert bool(out.finished[i, 0]) == bool(hits.size)
        np.testing.assert_array_equal(tokens[i, :expected], ref[:expected])
        assert (tokens[i, expected:] == 0).all()
        assert (np.asarray(out.logprobs[i, 0, expected:]) == 0).all()


@pytest.mark.slow
def test_filtered_distributions_match_their_targets():
    """Chi-square: the first sampled token follows the tempered / top-k / top-p target."""
    cfg = jaxrubric.tiny_config("llama", vocab_size=12)
    model = jaxrubric.init_model(cfg, seed=9)
    # Sharpen the head so the distribution is far from uniform and filters bite.
    model.embed[...] = model.embed[...] * 40.0
    prompt = [3, 4, 5]
    logits = np.asarray(model(jnp.asarray([prompt]))[0, -1], np.float64)
    n = 4000
    for temperature, top_k, top_p in [(1.0, None, None), (0.7, None, None), (1.0, 4, None),
                                      (1.3, None, 0.8), (0.9, 5, 0.9)]:
        filtered = np.asarray(sampling.filter_logits(
            jnp.asarray(logits[None], jnp.float32), jnp.float32(temperature), top_k,
            None if top_p is None else jnp.float32(top_p)))[0].astype(np.float64)
        target = np.exp(filtered - filtered.max())
        target[filtered <= MASKED_LOGIT / 2] = 0
        target /= target.sum()
        out = sampling.generate(model, [prompt], num_samples=n, max_new_tokens=1,
                                temperature=temperature, top_k=top_k, top_p=top_p,
                                rng=jax.random.key(11))
        counts = np.bincount(np.asarray(out.tokens[0, :, 0]), minlength=cfg.vocab_size)
        support = target > 0
        assert counts[~support].sum() == 0, (temperature, top_k, top_p)
        # Pool rare bins so every expected count is >= 5.
        expected = n * target[support]
        observed = counts[support]
        rare = expected < 5
        if rare.any():
            expected = np.append(expected[~rare], expected[rare].sum())
            observed = np.append(observed[~rare], observed[rare].sum())
        if len(expected) > 1:
            expected = expected * observed.sum() / expected.sum()  # exact totals for scipy
            p = stats.chisquare(observed, expected).pvalue
            assert p > 1e-3, (temperature, top_k, top_p, p)
        # Nucleus: the kept set is the smallest prefix holding top_p of the tempered mass.
        if top_p is not None and top_k is None:
            tempered = np.exp((logits - logits.max()) / temperature)
            tempered /= tempered.sum()
            order = np.argsort(-tempered)
            keep = np.cumsum(tempered[order]) - tempered[order] < top_p
            assert set(order[keep]) == set(np.where(support)[0])


@pytest.mark.slow
def test_sharded_run_equals_single_device(pair):
    _, model = pair
    kwargs = dict(max_new_tokens=6, temperature=1.0, num_samples=2, rng=jax.random.key(7))
    single = sampling.generate(model, PROMPTS, **kwargs)
    mesh = shd.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    sharded = sampling.generate(model, PROMPTS[:3], mesh=mesh, **kwargs)  # 3 rows pad to 4
    np.testing.assert_array_equal(np.asarray(sharded.tokens), np.asarray(single.tokens[:3]))
    np.testing.assert_allclose(np.asarray(sharded.logprobs), np.asarray(single.logprobs[:3]),
                               atol=1e-5)


@pytest.mark.slow
def test_padded_vocabulary_samples_the_same(checkpoint):
    """Loaded for an 8-way tensor axis, the 300-token vocabulary is padded to 304: the padding
    is zero mass at the end of each row's cumulative distribution, so the samples are the
    same."""
    _, folder = checkpoint
    mesh = shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 8})
    padded = jaxrubric.load_pretrained(folder, mesh=mesh)
    model = jaxrubric.load_pretrained(folder)
    assert (model.config.padded_vocab_size, padded.config.padded_vocab_size) == (300, 304)
    kwargs = dict(max_new_tokens=6, temperature=0.8, top_p=0.9, num_samples=2,
                  rng=jax.random.key(8))
    want = sampling.generate(model, PROMPTS, **kwargs)
    got = sampling.generate(padded, PROMPTS, mesh=mesh, **kwargs)
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
    for field in ("logprobs", "sampling_logprobs"):
        np.testing.assert_allclose(np.asarray(getattr(got, field)),
                                   np.asarray(getattr(want, field)), atol=1e-5)


def test_lengths_in_one_bucket_compile_once(pair):
    _, model = pair
    before = sampling._decode._cache_size()
    for n, prompt in ((9, [3, 4]), (12, [3, 4, 5, 6, 7, 8, 9]), (16, [5] * 11)):
        sampling.generate(model, [prompt, prompt], max_new_tokens=n, temperature=0.5,
                          rng=jax.random.key(n))
    assert sampling._decode._cache_size() - before <= 1


def test_bad_arguments_are_named(pair):
    _, model = pair
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        sampling.generate(model, [[3], []], max_new_tokens=2, rng=jax.random.key(0))
    with pytest.raises(ValueError, match="top_p"):
        sampling.generate(model, [[3]], max_new_tokens=2, top_p=0.0, rng=jax.random.key(0))


@pytest.mark.slow
def test_grammar_constrained_samples_all_parse():
    """1000 rubric samples from a random model over a real trained BPE vocabulary all parse."""
    from helpers import check_against_text
    from tokenizer_fixtures import byte_level_bpe

    from jaxrubric.rubric import grammar as gr

    tok = byte_level_bpe()
    grammar = gr.build_rubric_grammar(tok, weights=range(1, 6), max_items=4, max_item_tokens=8)
    cfg = jaxrubric.tiny_config("llama", vocab_size=len(tok), vocab_multiple=128,
                                eos_token_ids=(tok.eos_token_id,))
    model = jaxrubric.init_model(cfg, seed=3)
    prompts = [tok(t)["input_ids"] for t in ("Rate the answer.", "Write criteria:", "x", "[3]")]
    out = sampling.generate(model, prompts, num_samples=250, temperature=1.0, grammar=grammar,
                            max_new_tokens=grammar.max_rubric_tokens, rng=jax.random.key(0),
                            pad_id=tok.pad_token_id)
    assert bool(out.finished.all()), "the grammar ends every rubric within its token budget"
    tokens = np.asarray(out.tokens).reshape(-1, out.tokens.shape[-1])
    parsed = jax.device_get(jax.jit(gr.parse_rubric_tokens, static_argnames="pad_id")(
        jnp.asarray(tokens), grammar, pad_id=tok.pad_token_id))
    counts = parsed.valid.sum(-1)
    assert tokens.shape[0] == 1000 and (counts >= 1).all() and (counts <= 4).all()
    assert set(np.unique(parsed.weights[parsed.valid])) <= set(range(1, 6))
    for i in range(tokens.shape[0]):
        check_against_text(tok, grammar, tokens[i], jax.tree.map(lambda x, i=i: x[i], parsed))
