import sys

from e2eprof.cli import main

sys.exit(main())
