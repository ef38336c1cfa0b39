import sys

from trainsentry.cli import main

sys.exit(main())
