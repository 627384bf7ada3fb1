"""A module that starts a thread when imported (for the --preload check of tests/test_warm_start.py)."""
import threading
import time

_worker = threading.Thread(target=time.sleep, args=(5,), daemon=True)
_worker.start()
