"""Tiny DynamicRubric: random tiny Qwen3 policy, generator and verifier over the shipped tiny
tokenizer and toy anchor lists. A few rounds finish in minutes on 2 CPU cores; it proves the
plumbing (sampling -> rubrics -> verification -> two GRPO updates -> checkpoints), not learning.

    jaxrubric train --config configs/tiny_dynamic_rubric.py --config.rounds=2 --workdir W
"""

from jaxrubric.config import base_config


def tiny_config(method: str):
    """What the tiny configs of both methods share."""
    config = base_config(method)
    config.tokenizer = "assets/tiny_tokenizer"
    config.data.train = "assets/tiny_anchors.jsonl"
    for role, seed in (("policy", 1), ("generator", 2), ("verifier", 3)):
        config[role].path = ""  # empty: a tiny random model over the tokenizer's vocabulary
        config[role].seed = seed
    config.data.batch_size = 8  # a multiple of the devices the batch is split over
    config.data.prompt_tokens = 24
    config.data.policy_tokens = 40
    config.data.anchor_tokens = 12
    config.data.num_anchors = 3
    config.rubric.max_items = 3
    config.rubric.max_item_tokens = 6
    config.round.num_rubrics = 2
    config.round.response_tokens = 12
    config.round.logprob_chunk = 16
    config.optim.policy_lr = 1e-4
    config.optim.generator_lr = 1e-4
    config.rounds = 2
    return config


def get_config():
    config = tiny_config("dynamic_rubric")
    config.round.num_responses = 4
    return config
