"""DynamicRubric on one 16 GB accelerator (Colab's L4 / T4, a TPU v5e-1): Qwen3-0.6B in every
role, LoRA on the policy and the generator, bf16 compute.

The paper's settings (`jaxrubric.config.paper_recipe`: K = 8 answers, beta = 0.01 against the
frozen base, lambda = 1, Nectar anchor lists) at the lengths and batch of
`jaxrubric.config.one_chip_recipe`; rank-16 LoRA on every projection trains 1.7% of each
trained role's weights, so AdamW holds only the adapters and the KL reference is the base
itself. Check the fit, then train:

    jaxrubric plan --config configs/colab_qwen3_0p6b_dynamic_rubric.py --mesh data=1 \
        --device-memory 15GiB
    jaxrubric train --config configs/colab_qwen3_0p6b_dynamic_rubric.py --workdir W

A T4 has no bf16 matrix units (XLA runs bf16 there, slowly); prefer an L4 or a TPU runtime.
Export the policy merged (`jaxrubric export --workdir W --out P`) or as a PEFT adapter over
Qwen/Qwen3-0.6B (`... --adapter`).
"""

from jaxrubric.config import one_chip_recipe


def get_config():
    return one_chip_recipe("Qwen/Qwen3-0.6B", chat_template_kwargs={"enable_thinking": False})
