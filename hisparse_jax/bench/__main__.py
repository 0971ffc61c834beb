"""python -m hisparse_jax.bench ... is `hisparse-bench ...`."""

import sys

from .cli import main

sys.exit(main())
