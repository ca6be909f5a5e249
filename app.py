"""The demo's script entry point, for a Hugging Face Space (space/README.md: app_file) and a source checkout:

    python app.py --tiny           # tiny seeded models, no download (what the browser test runs)
    python app.py --target DIR --drafter DIR [--drafter-none DIR]

The app itself is hf_dspark/demo/app.py (also `hf-dspark demo`); the options are hf_dspark/cli/demo.py's.
"""

from hf_dspark.cli.demo import parse_app_args
from hf_dspark.demo.app import main

if __name__ == "__main__":
    main(parse_app_args())
