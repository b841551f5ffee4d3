"""pytest setup of flashgen's Python tests: importing testsupport puts python/ on sys.path (flashgen from this
checkout) and points FLASHGEN_TUNING_DB at a fresh file unless it is set."""

import testsupport  # noqa: F401
