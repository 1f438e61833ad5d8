"""Tiny GenRubric: the tiny DynamicRubric setup with signed rubric groups written from the query
alone, one rubric-induced response per group, every response judged under every group.

    jaxrubric train --config configs/tiny_genrubric.py --config.rounds=2 --workdir W
"""

import importlib.util
from pathlib import Path


def get_config():
    spec = importlib.util.spec_from_file_location(
        "tiny_dynamic_rubric", Path(__file__).with_name("tiny_dynamic_rubric.py"))
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    config = tiny.tiny_config("genrubric")
    config.round.num_rubrics = 3  # each group's induced response is judged by the others
    config.round.soft_verdicts = True
    # GenRubric self-evolves the generator against a fixed answerer and judge (the paper's
    # setting): --config.round.policy.freeze=false trains the answering policy too.
    config.round.policy.freeze = True
    return config
