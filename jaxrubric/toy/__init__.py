"""The toy world: a task with a known answer, where learning can be measured offline.

`ORACLES` maps the names a config's `oracle` may take to their ground-truth rewards: the
training task is handed one (`train.train(..., oracle=...)`), it never imports a world.
"""

from jaxrubric.toy.digits_task import oracle_reward as _digits_oracle

ORACLES = {"toy_digits": _digits_oracle}
