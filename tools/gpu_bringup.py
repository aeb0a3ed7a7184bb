#!/usr/bin/env python3
"""One-shot GPU bring-up of Loom on a lent GPU host; `--help` lists the numbered steps, their
time budgets and what they write. Standard library only: the host's python may have nothing
but torch. The steps live in tools/bringup/."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bringup.driver import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
