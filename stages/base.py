"""DVC stage `base`: a thin entry point; the work is in lopd.stages."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's lopd, not another install

from lopd.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["base", *sys.argv[1:]]))
