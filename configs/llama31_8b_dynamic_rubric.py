"""DynamicRubric paper recipe on Llama-3.1-8B-Instruct (policy, rubric generator and verifier).

K = 8, beta = 0.01, AdamW lr 1e-6 (policy) / 5e-6 (generator), lambda = 1; the settings live in
`jaxrubric.config.paper_recipe`, sized for the slice named after a colon
(`jaxrubric.recipes.SLICES`; default v5p-8). Checkpoints are HF folders or hub ids; the data is
Nectar (`{prompt, answers: [{answer, rank}]}`), by hub name or a local JSONL/parquet copy:

    jaxrubric train --config configs/llama31_8b_dynamic_rubric.py --workdir gs://BUCKET/run \
        --config.policy.path=/ckpt/Llama-3.1-8B-Instruct --config.generator.path=/ckpt/Llama-3.1-8B-Instruct \
        --config.verifier.path=/ckpt/Llama-3.1-8B-Instruct --config.data.train=/data/nectar.parquet
"""

from jaxrubric.config import paper_recipe
from jaxrubric.recipes import DEFAULT_SLICE, sized_for


def get_config(slice_name: str = DEFAULT_SLICE):
    return sized_for(paper_recipe("meta-llama/Llama-3.1-8B-Instruct"), slice_name)
