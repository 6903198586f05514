"""TEST-ONLY: `make test-quick` puts tests/no_verl first on PYTHONPATH, so that no quick-tier test
imports verl (in its process, or in a `check` it runs): it needs none, as on a login node. A test
that does need verl is marked `verl` (tests/conftest.py) and runs in `make test-verl`."""

raise ImportError("verl is kept out of the quick tier (tests/no_verl): mark the test `verl` (make test-verl)")
