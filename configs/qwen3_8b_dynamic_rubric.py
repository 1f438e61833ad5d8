"""DynamicRubric paper recipe on Qwen3-8B (policy, rubric generator and verifier).

K = 8, beta = 0.01, AdamW lr 1e-6 (policy) / 5e-6 (generator), lambda = 1; the settings live in
`jaxrubric.config.paper_recipe`, sized for the slice named after a colon
(`jaxrubric.recipes.SLICES`; default v5p-8). Checkpoints are HF folders or hub ids; the data is
Nectar (`{prompt, answers: [{answer, rank}]}`), by hub name or a local JSONL/parquet copy:

    jaxrubric train --config configs/qwen3_8b_dynamic_rubric.py --workdir gs://BUCKET/run \
        --config.policy.path=/ckpt/Qwen3-8B --config.generator.path=/ckpt/Qwen3-8B \
        --config.verifier.path=/ckpt/Qwen3-8B --config.data.train=/data/nectar.parquet
"""

from jaxrubric.config import paper_recipe
from jaxrubric.recipes import DEFAULT_SLICE, sized_for


def get_config(slice_name: str = DEFAULT_SLICE):
    config = paper_recipe("Qwen/Qwen3-8B", chat_template_kwargs={"enable_thinking": False})
    return sized_for(config, slice_name)
