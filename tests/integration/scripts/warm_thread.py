"""A module that starts a thread when it is imported: `--preload warm_thread` must start
cold (tests/integration/test_warm.py)."""

import threading
import time

threading.Thread(target=time.sleep, args=(3600,), daemon=True, name="preloaded").start()
