"""`jaxrubric plan --topology 8xH100`: compile-only GPUs from the shipped target configs, the
HLO walk's count of cuBLAS and cuDNN calls against hand counts, and the tiny round compiled
with XLA's GPU compiler. The compiling tests need the CUDA plugin (the gpu-plan extra, which
CI installs); no GPU and no NVIDIA library."""

import importlib.util
import os
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import SingleDeviceSharding

from jaxrubric import cuda_plugin, mfu, plan
from jaxrubric.config import load_config
from jaxrubric.plan import compile as plan_compile
from jaxrubric.plan import hlo_cost, topology

TINY = str(Path(__file__).resolve().parents[2] / "configs" / "tiny_dynamic_rubric.py")
GIB = 1024**3
NO_PLUGIN = ("XLA's GPU compiler comes with the CUDA plugin, not installed "
             "(pip install -e '.[gpu-plan]')")
# NVIDIA's datasheets: dense bf16 FLOP/s and HBM bytes/s of each GPU, and its memory.
DATASHEETS = {"H100": (989e12, 3.35e12, 80 * GIB), "H200": (989e12, 4.8e12, 141 * GIB),
              "A100": (312e12, 2.039e12, 80 * GIB)}


def needs_plugin() -> None:
    if not cuda_plugin.installed():
        pytest.skip(NO_PLUGIN)


@pytest.mark.parametrize("name, model, count", [("8xH100", "H100", 8), ("1xh200", "H200", 1),
                                                 ("4 x A100", "A100", 4)])
def test_gpu_names_read_their_target_config(name, model, count):
    target = topology.gpu_target(name)
    assert (target.model, target.count, target.memory) == (model, count, DATASHEETS[model][2])
    kind = re.search(r'device_description_str:\s*"([^"]*)"', target.config).group(1)
    bandwidth = int(re.search(r"memory_bandwidth:\s*(\d+)", target.config).group(1))
    # The kind the compiler's devices will carry maps to the datasheet's peaks, and the
    # config's bandwidth (what XLA's cost model reads) is the roofline's.
    assert (mfu.peak_flops(kind), mfu.hbm_bandwidth(kind)) == DATASHEETS[model][:2]
    assert bandwidth == DATASHEETS[model][1]
    assert topology.gpu_target("v5p:2x2x1") is None


def test_the_target_configs_ship_with_the_package():
    shipped = resources.files("jaxrubric.plan").joinpath("gpu_targets")
    assert sorted(p.name for p in shipped.iterdir()) == sorted(topology.GPU_TARGETS.values())
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"jaxrubric.plan" = ["gpu_targets/*.txtpb"]' in pyproject


@pytest.mark.parametrize("name, message", [
    ("9xH100", "9 GPUs; a GPU topology is one host of 1 to 8"),
    ("0xA100", "0 GPUs"),
    ("8xV100", "no GPU target config for this name; give NxMODEL with MODEL one of H100"),
    ("8xH100-80GB", "no GPU target config")])
def test_bad_gpu_names_give_clear_errors(name, message):
    with pytest.raises(plan.PlanError, match=message):
        topology.gpu_target(name)


def test_without_the_plugin_gpu_topologies_say_what_to_install(monkeypatch):
    monkeypatch.setattr(cuda_plugin, "MODULE", "jaxrubric_no_such_plugin")
    with pytest.raises(plan.PlanError, match=re.escape("pip install -e '.[gpu-plan]'")):
        topology.devices("8xH100")


def test_the_plugins_missing_driver_lines_are_held_back_and_nothing_else():
    said = ("WARNING: All log messages before absl::InitializeLog() is called are written to "
            "STDERR\nI0000 00:00:1796637149.643001   14010 cudart_stub.cc:31] Could not find "
            "cuda drivers on your machine, GPU will not be used.\nE0000 something else\n")
    assert cuda_plugin.without_driver_lines(said) == "E0000 something else\n"


def test_a_process_starting_jax_prints_nothing_about_a_missing_driver():
    if not cuda_plugin.installed() or cuda_plugin.driver_present():
        pytest.skip("the CUDA plugin's warning shows only where it is installed without a driver")
    out = subprocess.run([sys.executable, "-c", "import jaxrubric, jax; jax.devices()"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0 and out.stderr == "", out.stderr


def test_device_memory_defaults_to_the_gpus_only(capsys):
    base = ["--config", TINY, "--mesh", "fsdp=4"]
    assert plan.main(base) == 2
    assert "--device-memory is required" in capsys.readouterr().err
    assert plan.main(base + ["--topology", "9xH100"]) == 2
    assert "one host of 1 to 8" in capsys.readouterr().err
    if cuda_plugin.installed():
        assert plan.main(base + ["--topology", "2xH100"]) == 2
        assert "covers 4 devices, not 2" in capsys.readouterr().err
        assert plan.main(base + ["--topology", "2xH100", "--devices", "8"]) == 2
        assert "the topology 2xH100 has 2 chips" in capsys.readouterr().err


def test_compile_only_gpus_carry_the_kinds_the_peaks_know():
    needs_plugin()
    for model, (flops, bandwidth, _) in DATASHEETS.items():
        devices = topology.devices(f"8x{model}")
        assert len(devices) == 8 and {d.platform for d in devices} == {"gpu"}
        assert topology.chip(devices[0]) == (devices[0].device_kind, flops, bandwidth, "gpu")


def compiled_text(f, *shapes, **options) -> str:
    """`f` compiled for one compile-only H100, for bf16 arguments of `shapes`."""
    needs_plugin()
    device = topology.devices("1xH100")[0]
    args = [jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=SingleDeviceSharding(device))
            for s in shapes]
    return jax.jit(f).lower(*args).compile(compiler_options=options or None).as_text()


CUBLAS = {"xla_gpu_enable_triton_gemm": False}  # XLA's default for a matmul is a Triton kernel


@pytest.mark.parametrize("options", [CUBLAS, {}], ids=["cublas", "triton"])
def test_gemms_count_two_flops_per_multiply_add(options):
    matmul = compiled_text(lambda a, b: a @ b, (256, 512), (512, 1024), **options)
    batched = compiled_text(lambda a, b: jnp.einsum("bmk,bnk->bnm", a, b), (8, 128, 64),
                            (8, 256, 64), **options)
    assert ("__cublas$lt$matmul" in matmul + batched) == (options == CUBLAS)
    # The split-K Triton kernel sums its partial products in a reduction: a little more.
    assert hlo_cost.total(hlo_cost.stage_costs(matmul)).flops == pytest.approx(
        2 * 256 * 1024 * 512, rel=0.0 if options else 0.01)
    assert hlo_cost.total(hlo_cost.stage_costs(batched)).flops == pytest.approx(
        2 * 8 * 128 * 256 * 64, rel=0.0 if options else 0.01)
    if options:  # the operands read and the result written, not cuBLAS's scratch buffer
        assert hlo_cost.total(hlo_cost.stage_costs(matmul)).bytes == 2 * (
            256 * 512 + 512 * 1024 + 256 * 1024)


def test_a_scanned_gemm_counts_its_trip_count():
    def layers(ws, x):
        return jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)[0]

    text = compiled_text(layers, (10, 256, 256), (64, 256), **CUBLAS)
    assert text.count("__cublas$lt$matmul") == 1
    costs = hlo_cost.stage_costs(text)
    assert costs["unknown_loops"].flops == 0
    once = hlo_cost.total(hlo_cost.stage_costs(text, trip_counts=False)).flops
    matmul = 2 * 64 * 256 * 256
    assert matmul <= once < 1.05 * matmul  # the tanh and the loop counter on top
    assert hlo_cost.total(costs).flops == pytest.approx(10 * once, rel=0.01)


def test_causal_pairs_count_the_upper_left_triangle():
    for queries, keys in [(1, 1), (5, 5), (4, 9), (9, 4), (1, 7), (7, 1)]:
        assert hlo_cost.causal_pairs(queries, keys) == np.tril(np.ones((queries, keys))).sum()


def attention_module(target: str, mask: str, q: str, k: str, v: str, scores: str) -> str:
    """A module of one cuDNN fused attention call, as XLA:GPU writes it (attributes that the
    count does not read left out)."""
    return f"""ENTRY %main (q: bf16[{q}], k: bf16[{k}], v: bf16[{v}]) -> bf16[1] {{
  %q = bf16[{q}] parameter(0)
  %k = bf16[{k}] parameter(1)
  %v = bf16[{v}] parameter(2)
  %fmha = (bf16[{q}], u8[0]{{0}}) custom-call(%q, %k, %v), custom_call_target="{target}", \
backend_config={{"cudnn_fmha_backend_config": {{"intermediate_tensor_shape": {{"element_type": \
"BF16", "dimensions": [{scores}]}}, "mask_type": "{mask}"}}}}
  ROOT %r = bf16[1] constant(0)
}}"""


@pytest.mark.parametrize("target, mask, matmuls", [
    ("__cudnn$fmhaSoftmax", "NO_MASK", 2), ("__cudnn$fmhaSoftmaxBackward", "NO_MASK", 5),
    ("__cudnn$fmhaSoftmax", "CAUSAL", 2), ("__cudnn$fmhaSoftmaxBackward", "PADDING_CAUSAL", 5)])
def test_cudnn_attention_counts_its_matmuls(target, mask, matmuls):
    # Batch 2, 8 query heads over 2 key-value heads, 16 queries, 32 keys, head size 64.
    text = attention_module(target, mask, "2,16,8,64", "2,32,2,64", "2,32,2,64",
                            '"2", "8", "16", "32"')
    pairs = np.tril(np.ones((16, 32))).sum() if "CAUSAL" in mask else 16 * 32
    cost = hlo_cost.total(hlo_cost.stage_costs(text))
    assert cost.flops == matmuls * 2 * 2 * 8 * pairs * 64
    q, kv = 2 * 16 * 8 * 64, 2 * 32 * 2 * 64
    assert cost.bytes == 2 * (q + 2 * kv + q)  # q, k, v read, one q-shaped result written


def test_cudnn_attention_compiled_for_an_h100():
    """jax's cuDNN attention, forward and backward, counted from the compiled calls (XLA needs
    cuDNN's library to build them: `nvidia-cudnn-cu12`, not needed for the round)."""
    needs_plugin()
    try:
        cudnn = importlib.util.find_spec("nvidia.cudnn")
    except ModuleNotFoundError:  # no `nvidia` namespace: no NVIDIA library at all
        cudnn = None
    if cudnn is None:
        pytest.skip("cuDNN's fused attention compiles only with cuDNN's library "
                    "(pip install nvidia-cudnn-cu12); the round needs none")

    def attend(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")

    shapes = (2, 256, 8, 64), (2, 128, 2, 64), (2, 128, 2, 64)
    forward = compiled_text(attend, *shapes)
    backward = compiled_text(jax.grad(lambda *a: attend(*a).astype(jnp.float32).sum(),
                                      argnums=(0, 1, 2)), *shapes)
    assert "__cudnn$fmhaSoftmaxBackward" in backward
    pairs = hlo_cost.causal_pairs(256, 128)
    assert hlo_cost.total(hlo_cost.stage_costs(forward)).flops == 2 * 2 * 2 * 8 * pairs * 64
    # The gradient's program runs the forward (its output and softmax statistics) and the
    # backward: 2 + 5 matmuls, and a few elementwise FLOPs on top.
    assert hlo_cost.total(hlo_cost.stage_costs(backward)).flops == pytest.approx(
        7 * 2 * 2 * 8 * pairs * 64, rel=0.01)


# The tiny round (fsdp=2) compiled with XLA's GPU compiler for two H100s that are not there
# (140-190 s on 2 cores), as the v5e test in test_plan.py does for a TPU slice. GPU layouts do
# not pad: XLA's arguments are the plan's state to the byte. Temporaries: measured plan/XLA
# 0.78. The compiler is not held to the memory (XLA:GPU has no such limit).
@pytest.mark.slow
def test_tiny_round_compiled_for_two_h100s(monkeypatch, capsys):
    needs_plugin()
    compiled = {}
    real = plan_compile.compiled_memory

    def keep(*args, **kwargs):
        compiled.update(real(*args, **kwargs))
        return compiled

    monkeypatch.setattr(plan_compile, "compiled_memory", keep)
    with jax.default_matmul_precision("default"):
        assert plan.main(["--config", TINY, "--mesh", "fsdp=2", "--topology", "2xH100"]) == 0
    printed = capsys.readouterr().out
    estimate = plan.plan_memory(load_config(TINY, ["mesh.fsdp=2"]), 80 * GIB, devices=2)
    assert "device memory 80.00 GiB" in printed  # the H100's, by default
    assert "2 x NVIDIA H100 80GB HBM3 (the GPU compiler" in printed
    assert compiled["argument"] == compiled["argument_arrays"] == estimate["state_total"]
    ratio = estimate["phase_totals"][estimate["peak_phase"]] / compiled["temp"]
    assert 0.6 <= ratio <= 1.3, (ratio, compiled["temp"])
    # The decode loops' trip counts are read through XLA:GPU's fused loop condition.
    costs = compiled["cost"]
    assert costs["unknown_loops"].flops == 0
    assert all(costs[s].flops >= compiled["model_flops"][s].model / 4
               for s in compiled["model_flops"])
    # The roofline names every stage, on the H100's peaks.
    roofline = printed[printed.index("Roofline on NVIDIA H100 80GB HBM3 (989 TFLOP/s"):]
    rows = {line.split("  ")[0] for line in roofline.splitlines()[2:-1]}
    assert rows == set(compiled["model_flops"]) | {"other"}


def test_a_missing_cudnn_says_how_to_compile_anyway():
    err = plan_compile._failed("stage 'policy rollout' (role policy)",
                               RuntimeError("cuDNN not found.\nthe compiler's details"))
    assert "pip install --no-deps nvidia-cudnn-cu12" in str(err)
    assert "attention_impl=xla" in str(err)
