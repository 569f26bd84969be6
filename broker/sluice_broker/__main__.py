import sys

from sluice.broker.main import main

sys.exit(main())
