"""The slices the 8B recipes are sized for, and what sizing one for a slice changes.

A recipe (`configs/qwen3_8b_dynamic_rubric.py`, ...) is the papers' settings; a slice is the
chips a user rents. Sizing for a slice sets the mesh and the settings that change memory,
never results (micro-batches: the same samples and the same optimiser step, in pieces), and,
where full fine-tuning cannot fit, LoRA (which does change the training: it is a recipe of its
own, named by the slice). A config file takes the slice after a colon:

    jaxrubric plan --config configs/qwen3_8b_dynamic_rubric.py:v5e-16 --topology v5e:4x4

What the TPU and GPU compilers say of each recipe at each slice's settings (`jaxrubric plan
--topology`, `benchmarks/scale_table.py`), fits or not, is in docs/scale.md with its command.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from jaxrubric.models.config import LORA_TARGETS


@dataclasses.dataclass(frozen=True)
class Slice:
    """Chips a recipe is sized for: what `jaxrubric plan --topology` compiles for, the memory
    of one chip, the mesh, and the settings that make the round fit there."""

    topology: str  # `jaxrubric plan --topology` name
    device_memory: str  # one chip's, as `--device-memory` takes it
    mesh: tuple[tuple[str, int], ...]
    rollout_micro_batches: int
    update_micro_batches: int
    lora_rank: int = 0  # 0: full fine-tuning; else rank-r LoRA on every projection
    # A program per stage (`config.stage_programs`): where the round as one program does not
    # fit, because the compiler packs every stage's buffers into one layout.
    stage_programs: bool = False

    @property
    def chips(self) -> int:
        out = 1
        for _, size in self.mesh:
            out *= size
        return out


# Decoding is tensor-parallel over the chips that shard the weights (`sharding.decoding_rules`):
# the 8B models' 8 kv heads divide among 4 or 8 of them, so the 16 chips of a v5e-16 are two
# groups of 8 (`data=2`). Update micro-batches leave each micro-batch at least one prompt per
# chip holding the batch (a chip with none would repeat another's rows). On a v5p-8 the
# DynamicRubric round as one program needs 87.9 GiB a chip and its largest stage program 80.2
# (docs/scale.md).
SLICES: dict[str, Slice] = {
    "v5p-8": Slice("v5p:2x2x1", "95GiB", (("fsdp", 4),), 8, 16, stage_programs=True),
    "8xH100": Slice("8xH100", "80GiB", (("fsdp", 8),), 8, 8),
    "v6e-8": Slice("v6e:2x4", "32GiB", (("fsdp", 8),), 8, 8, lora_rank=16),
    "v5e-16": Slice("v5e:4x4", "16GiB", (("data", 2), ("fsdp", 8)), 8, 4, lora_rank=16),
}
DEFAULT_SLICE = "v5p-8"


def slice_named(name: str) -> Slice:
    """The slice called `name`, or a ValueError listing the slices."""
    if name not in SLICES:
        raise ValueError(f"no slice {name!r}; the recipes are sized for {', '.join(SLICES)}")
    return SLICES[name]


def sized_for(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
    """`config` (a papers' recipe) sized for slice `name`: its mesh, its micro-batches, a
    program per stage where one round program does not fit and, on a slice where full
    fine-tuning does not fit, LoRA on the policy and the generator (fp32
    adapters over a bf16 base, 10x the full-fine-tuning learning rates, as LoRA wants)."""
    chosen = slice_named(name)
    for axis in ("data", "fsdp", "tensor"):
        config.mesh[axis] = dict(chosen.mesh).get(axis, 1)
    config.round.rollout_micro_batches = chosen.rollout_micro_batches
    config.round.update_micro_batches = chosen.update_micro_batches
    config.stage_programs = chosen.stage_programs
    if chosen.lora_rank:
        for role in ("policy", "generator"):
            config[role].lora.rank = chosen.lora_rank
            config[role].lora.alpha = 2.0 * chosen.lora_rank
            config[role].lora.targets = ",".join(LORA_TARGETS)
            config[role].param_dtype = "float32"  # the adapters (the base stays in bfloat16)
        config.optim.policy_lr *= 10
        config.optim.generator_lr *= 10
    return config
