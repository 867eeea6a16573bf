"""DVC stage `base`: a thin entry point; the work is in lopd.stages."""

import sys

from lopd.cli import main

if __name__ == "__main__":
    sys.exit(main(["base", *sys.argv[1:]]))
