"""`jaxrubric plan`: will a training config fit in device memory, per device, before any run?

A co-evolution round holds three models, two optimiser states and the references at once, and
its rollouts and updates need KV caches and activations on top. This package answers from the
config alone, in seconds on a laptop CPU: no weights are loaded and no devices of the target
mesh are needed. Parameter shapes and their `logical_axes` come from the real model code
(`nnx.eval_shape` of `Decoder`), their per-device shards from `sharding.logical_to_spec` on an
abstract mesh, optimiser state from `optax`'s own `init` evaluated on those shards, and the
round's stages from its method's round itself, traced on those shapes (`Method.round_shapes`,
`plan.shapes`), so a method's plan is its own.

Memory is counted in two kinds:

- **state**, held for the whole round: policy and generator parameters, their AdamW states
  (two moments in the parameter dtype and a step count; gradient clipping keeps nothing),
  the reference copies of each role trained with beta > 0 (in the compute dtype when narrower
  than the parameters', as `train.reference_params` keeps them), the verifier's parameters
  and the batch;
- **phases**, one after another inside the round, each freeing its buffers before the next:
  the rollouts, the verifier passes, the generator update, the policy update. The peak is the
  state plus the largest phase, not the sum of all phases; this is also what XLA's buffer
  assignment reports as temporary memory (`--compile` compares the two).

With roles on sub-meshes (`config.submeshes`, `jaxrubric.placement`) a chip holds only the
state of the roles on its mesh and runs only their stages, each stage a program of its own, so
the plan has one section per mesh and fits when every mesh does. The batch lives on the
policy's mesh; a stage on another mesh also holds the inputs moved to it (`RoundShapes.reads`:
prompts, responses, rubrics, advantages: small next to the models). `--compile` then compiles
each stage program and sets XLA's numbers beside the plan's, per mesh.

Checked against XLA (`tests/plan/test_plan.py`, tiny config, CPU): arguments agree to the byte;
temporaries within 0.9-1.15x where XLA partitions as the rules intend (data-parallel mesh),
0.85x with the 8B recipes' memory settings (chunked attention, micro-batched rollouts and
updates, remat full; XLA:CPU allocates the gradient sum's zeros early). On an `fsdp` mesh
XLA may keep some activations whole over the batch (the model code puts no sharding
constraints on activations), and then needs more than the plan says: about twice as much on
the tiny config with fsdp=8.

`--topology NAME` compiles the round for a TPU slice that need not exist (the TPU compiler from
`libtpu`, on a CPU host), from shapes alone, and adds a roofline per stage. On the 8B recipes
the arguments agree (the same state) and XLA's temporaries are 1.7-5x the plan's, for the
reason above: the verifier's and rollouts' activations are whole over the batch on every
chip (README, "Will it fit?"). `--topology 8xH100` (H200, A100; 1-8 GPUs of one host) does
the same with XLA's GPU compiler (the CUDA plugin; no GPU, no NVIDIA library) from the GPU's
published figures (`gpu_targets/`, docs/gpu_plan.md).

Modules, each importing only those before it: `errors`; `meshes` (where the roles run, the
stage programs' names); `models` (model configs and parameter shards, offline); `shapes` (the
templates, tokenised or estimated, and the method's `RoundShapes`); `phases` (the per-stage
formulas); `memory` (`plan_memory`); `report` (sizes in and tables out); `topology` (a TPU
slice's or GPUs' devices and their peaks); `abstract` (the round's inputs as shapes, on any
devices); `hlo_cost` (FLOPs and bytes per stage from the compiled HLO); `roofline` (time
bounds); `compile` (the check against XLA); `cli` (the command).
"""

from jaxrubric.plan.cli import add_parser, main, run
from jaxrubric.plan.errors import PlanError
from jaxrubric.plan.memory import plan_memory
from jaxrubric.plan.meshes import parse_mesh
from jaxrubric.plan.report import format_plan, parse_bytes

__all__ = ["PlanError", "add_parser", "format_plan", "main", "parse_bytes", "parse_mesh",
           "plan_memory", "run"]
