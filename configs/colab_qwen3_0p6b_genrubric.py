"""GenRubric on one 16 GB accelerator (Colab's L4 / T4, a TPU v5e-1): Qwen3-0.6B in every role,
LoRA on the rubric generator, bf16 compute.

The generator writes G = 4 signed rubric groups per query and self-evolves against a fixed
answering policy and judge (the paper's setting: `round.policy.freeze`; with
`--config.round.policy.freeze=false` the policy trains too, through its own LoRA adapters), at
the lengths and batch of `jaxrubric.config.one_chip_recipe`. Check the fit, then train:

    jaxrubric plan --config configs/colab_qwen3_0p6b_genrubric.py --mesh data=1 \
        --device-memory 15GiB
    jaxrubric train --config configs/colab_qwen3_0p6b_genrubric.py --workdir W
"""

from jaxrubric.config import one_chip_recipe


def get_config():
    config = one_chip_recipe("Qwen/Qwen3-0.6B", "genrubric", update_micro_batches=4,
                             chat_template_kwargs={"enable_thinking": False})
    config.round.policy.freeze = True
    return config
