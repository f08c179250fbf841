"""`python -m egressd` is the `egressd` console script."""

from egressd.cli import main

raise SystemExit(main())
