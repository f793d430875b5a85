#!/usr/bin/env python3
"""Build the open-english corpus: the same as ``python3 -m depthlab.data.opencorpus`` (see docs/corpus.md).

    python3 scripts/build_corpus.py            # into $DEPTHLAB_CACHE or ~/.cache/depthlab
    python3 scripts/build_corpus.py --toy      # offline dry run into a temp dir
"""

import sys

from depthlab.data.opencorpus.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
