"""A module whose import never ends (10 minutes): a job that preloads it is stopped while
its warm process imports (tests/integration/test_warm.py)."""

import time

time.sleep(600)
