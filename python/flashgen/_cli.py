"""The `flashgen` command of the wheel: runs the CLI binary bundled in the package (flashgen/bin/flashgen)."""

import os
import pathlib
import sys


def main():
    binary = pathlib.Path(__file__).resolve().parent / "bin" / "flashgen"
    if not os.access(binary, os.X_OK):
        sys.exit(f"flashgen: no CLI bundled with this package (looked for {binary}); install the package with "
                 "`pip install --no-build-isolation ./python` from a flashgen checkout, which builds it, or use "
                 "build/flashgen of a source build")
    os.execv(binary, [str(binary), *sys.argv[1:]])


if __name__ == "__main__":
    main()
