"""Run directories on disk: the checkpoint format (atomic writes, checksums, the newest intact one),
integrity checks (finite tensors, file hashes, data fingerprints), the one-writer run lock; every file is
published through :mod:`depthlab.base.fileio`.

    from depthlab.base.store.checkpoint import save_checkpoint, load_intact, list_checkpoints
    from depthlab.base.store.lock import RunLock

Knows nothing of models or training: ``depthlab.train`` writes through it, ``depthlab.targets`` reads.
"""
