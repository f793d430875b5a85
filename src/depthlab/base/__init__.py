"""The foundation every other package stands on: small shared helpers with no torch at import.

    errors      DepthlabError / ConfigError, ``choices`` (the one-line "choose one of" text), first_line
    fileio      THE atomic writer (``publish``: a temporary sibling, fsync, rename), json_safe, sha256_file
    store/      run directories on disk: the checkpoint format, integrity checks, the one-writer run lock
    provenance  versions and the command line a run or report records
    progress    a progress bar in a terminal, ETA lines in a log file
    metrics     perplexity, variance; htmlpage: self-contained HTML; extras: optional packages; lazy: exports
"""
