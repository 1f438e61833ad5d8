"""`jaxrubric inspect`: one self-contained HTML page of what a run's evaluator did (curves,
warnings, rubric cards with their verdict grids, the criteria the generator writes most), read
from a training workdir, a toy world's workdir or a `jaxrubric evaluate` output folder."""
