"""GenRubric recipe on Llama-3.1-8B-Instruct (policy, rubric generator and verifier).

G = 4 signed rubric groups per query, beta = 0.01, AdamW lr 1e-6 (policy) / 5e-6 (generator);
the settings live in `jaxrubric.config.paper_recipe`, sized for the slice named after a colon
(`jaxrubric.recipes.SLICES`; default v5p-8).

SFT, then RL, as the paper trains the generator. First a supervised cold start of the
generator (`jaxrubric sft`) on rubrics: `{prompt, completion}` rows whose completion is a
rubric in the grammar, or HealthBench-schema rows, whose expert rubric becomes the completion;
its rate is `config.optim.generator_lr` unless `--lr` sets it, and it writes an HF folder.
Then GenRubric RL with the generator started from that folder. Checkpoints are HF folders or
hub ids; the RL data is Nectar (`{prompt, answers: [{answer, rank}]}`, of which GenRubric
reads the prompts), by hub name or a local JSONL/parquet copy:

    jaxrubric sft --config configs/llama31_8b_genrubric.py --data /data/rubrics.jsonl \
        --workdir /ckpt/sft --config.tokenizer=/ckpt/Llama-3.1-8B-Instruct \
        --config.generator.path=/ckpt/Llama-3.1-8B-Instruct
    jaxrubric train --config configs/llama31_8b_genrubric.py --workdir gs://BUCKET/run \
        --config.policy.path=/ckpt/Llama-3.1-8B-Instruct \
        --config.generator.path=/ckpt/sft/generator \
        --config.verifier.path=/ckpt/Llama-3.1-8B-Instruct --config.data.train=/data/nectar.parquet
"""

from jaxrubric.config import paper_recipe
from jaxrubric.recipes import DEFAULT_SLICE, sized_for


def get_config(slice_name: str = DEFAULT_SLICE):
    config = paper_recipe("meta-llama/Llama-3.1-8B-Instruct", method="genrubric")
    # The generator self-evolves against a fixed answering policy and judge (the paper's
    # setting); --config.round.policy.freeze=false trains the answerer too.
    config.round.policy.freeze = True
    return sized_for(config, slice_name)
