import sys

from moekda.cli import main

sys.exit(main())
