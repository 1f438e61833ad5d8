"""`python -m jaxrubric.plan`: the `jaxrubric plan` command on its own."""

import sys

from jaxrubric.plan.cli import main

sys.exit(main())
