"""GenRubric recipe on Llama-3.1-8B-Instruct (policy, rubric generator and verifier).

G = 4 signed rubric groups per query, beta = 0.01, AdamW lr 1e-6 (policy) / 5e-6
(generator); the settings live in `jaxrubric.config.paper_recipe`. Checkpoints are HF
folders or hub ids; the data is Nectar (`{prompt, answers: [{answer, rank}]}`), by hub name or a local JSONL/parquet copy:

    jaxrubric train --config configs/llama31_8b_genrubric.py --workdir gs://BUCKET/run \
        --config.policy.path=/ckpt/Llama-3.1-8B-Instruct --config.generator.path=/ckpt/Llama-3.1-8B-Instruct \
        --config.verifier.path=/ckpt/Llama-3.1-8B-Instruct --config.data.train=/data/nectar.parquet
"""

from jaxrubric.config import paper_recipe


def get_config():
    config = paper_recipe("meta-llama/Llama-3.1-8B-Instruct", method="genrubric",
                          update_micro_batches=32)
    # The generator self-evolves against a fixed answering policy and judge (the paper's
    # setting); --config.round.freeze_policy=false trains the answerer too.
    config.round.freeze_policy = True
    return config
