"""`python -m hf_dspark.cli ...`: the same as the `hf-dspark` console script."""

import sys

from . import main

sys.exit(main())
