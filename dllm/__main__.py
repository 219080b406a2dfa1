"""`python -m dllm ...` runs the `dllm` command (the same as `python -m dllm.cli ...`)."""
import sys

from dllm.cli import main

sys.exit(main())
