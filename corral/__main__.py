import sys

from corral.cli.main import main

sys.exit(main())
