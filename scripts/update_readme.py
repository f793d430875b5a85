"""Regenerate the parts of README.md that come from code: the scheme table (from the registry).

    python scripts/update_readme.py          # rewrite README.md in place
    python scripts/update_readme.py --check  # exit 1 if README.md is stale (tests do the same check)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from depthlab.schemes import scheme_table

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"(<!-- schemes:start -->\n).*?(<!-- schemes:end -->)", re.S)


def main() -> int:
    text = README.read_text()
    if not BLOCK.search(text):
        print("README.md has no <!-- schemes:start --> ... <!-- schemes:end --> block", file=sys.stderr)
        return 2
    new = BLOCK.sub(lambda m: m.group(1) + scheme_table() + "\n" + m.group(2), text)
    if "--check" in sys.argv:
        return 0 if new == text else 1
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
