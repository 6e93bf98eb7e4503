"""``python -m durable_harness`` runs the command-line tool."""

import sys

from durable_harness.cli.main import main

sys.exit(main())
