"""The comparison tables of `benchmarks/round_stages.py` (one program vs separate programs, with
vs without telemetry) and `benchmarks/sampling.py` (share of the matmul-only ceiling, from
`benchmarks/decode_matmul.py`) run at tiny sizes, so they cannot rot. No timing is asserted: only that the rows come out with
finite numbers and that both forms of the round compute the same round."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from xla_flags import FAST_COMPILE

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import decode_matmul  # noqa: E402
import sampling as sampling_benchmark  # noqa: E402


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip("|").split("|")]


def number(cell: str) -> float:
    value = float(cell.rstrip("x%"))
    assert math.isfinite(value) and value > 0, cell
    return value


def round_stages_table(table: str) -> list[str]:
    """The output lines of one of `round_stages.py`'s tables, at tiny sizes, on one CPU device
    with XLA:CPU's cheapest code generation (compiling the round twice is nearly all the
    time)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": FAST_COMPILE}
    result = subprocess.run(
        [sys.executable, "benchmarks/round_stages.py", "--only", table, "--repeats", "1",
         "--config.round.response_tokens=4", "--config.rubric.max_items=2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout.splitlines()


@pytest.mark.slow
def test_round_stages_one_program_vs_separate_programs():
    lines = round_stages_table("programs")
    assert "load average (1 min)" in lines[0] and "after" in lines[0], lines[0]
    rows = {cells(line)[0]: cells(line) for line in lines
            if line.startswith("| ") and not line.startswith("| form ")}
    assert list(rows) == ["one program", "separate programs"], rows
    assert rows["one program"][1] == "1" and int(rows["separate programs"][1]) > 1
    for row in rows.values():
        for cell in row[2:]:
            number(cell)
    assert rows["one program"][-1] == "1.00x"
    assert any(line.startswith("Both forms compute the same round") for line in lines), lines


@pytest.mark.slow
def test_round_stages_with_and_without_telemetry():
    rows = [cells(line) for line in round_stages_table("telemetry")
            if line.startswith("| ") and not line.startswith("| block ")]
    assert [row[0] for row in rows] == ["1", "2", "3", "4", "5", "median"], rows
    for block, with_, without, ratio in rows[:-1]:
        assert number(ratio) == pytest.approx(number(with_) / number(without), rel=0.01)
    assert sorted(number(r[3]) for r in rows[:-1])[2] == number(rows[-1][3])


def test_matmul_ceiling_rows():
    size = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    # A sampler at 1e5 tokens/s (10 us a token) over 2 rows and 4 rows: each share is the
    # ceiling's time over that (the 2-row ceiling measured once).
    lines = sampling_benchmark.ceiling_rows("tiny", size, {"two": (2, 1e5), "four": (4, 1e5)},
                                            repeats=1)
    assert [cells(line)[:3] for line in lines] == [["tiny", "two", "2"], ["tiny", "four", "4"]]
    for line in lines:
        sampler_us, ceiling_us, share = cells(line)[3:]
        assert number(sampler_us) == 10.0
        assert number(share) == pytest.approx(10 * number(ceiling_us), abs=1)
    # decode_matmul's own table, from the same function.
    table = decode_matmul.ceiling_table(2, 1, models=((16, 32, 1),))
    assert cells(table[-1])[0] == "hidden 16, 1 layers"
    for cell in cells(table[-1])[1:]:
        number(cell)


def test_genrubric_signal_pays_sounder_rubrics_and_common_coins_only_couple_the_coins():
    """`benchmarks/genrubric_signal.py`: comprehensiveness points at sounder rubrics; with
    only sound rubrics (coins left only on the digits a rubric does not name) common coins
    move the correlation by less than 0.2."""
    import genrubric_signal

    assert genrubric_signal.correlation(60, 0) > 0.15
    sound = dict(informed=1.0, groups=4)
    assert genrubric_signal.correlation(30, 1, **sound) == pytest.approx(
        genrubric_signal.correlation(30, 1, common=True, **sound), abs=0.2)


def _tiny_decoder(vocab: int):
    import jaxrubric

    return jaxrubric.init_model(jaxrubric.tiny_config(
        "qwen3", vocab_size=vocab, hidden_size=32, intermediate_size=64, num_layers=1,
        num_heads=2, num_kv_heads=1, head_dim=16), seed=0)


@pytest.mark.slow
def test_prefix_sharing_updates_run_and_agree():
    """`benchmarks/prefix_sharing.py`'s update steps, at a tiny size: the shared-prompt step
    gives the unshared one's weights (the benchmark times the same update two ways)."""
    import jax
    import numpy as np
    import prefix_sharing

    model = _tiny_decoder(8192)
    new = {}
    for shared in (False, True):
        step, args = prefix_sharing._update(model, 2, 8, 3, 4, shared)
        new[shared] = step(*args).params
    for a, b in zip(jax.tree.leaves(new[False]), jax.tree.leaves(new[True])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


@pytest.mark.slow
def test_peer_grpo_jaxrubric_iteration_runs():
    """`benchmarks/peer_grpo.py`'s jaxrubric rows (a row per completion, and each prompt once)
    on a tiny model: the timing harness runs with the round's current API."""
    import peer_grpo

    work = peer_grpo.make_work()
    model = _tiny_decoder(peer_grpo.QWEN3["vocab_size"])
    for shared in (False, True):
        timing = peer_grpo.jaxrubric_iteration(model, work, repeats=1, shared=shared)
        assert 0 < timing.best_s <= timing.first_s
