"""Ways a Python program ends, for tests/test_warm_start.py: a forked rank must end each
way as one started anew does (exit status, what reaches stderr, what runs at exit).

    gpurun -np 1 python rank_endings.py MODE
      exit-message   sys.exit("a message"): the message on stderr, status 1
      exit-code      sys.exit(3)
      raise          an uncaught ValueError: the traceback from this file's line, status 1
      interrupt      an uncaught KeyboardInterrupt: Python ends by SIGINT itself
      at-exit        a non-daemon thread finishes, then atexit runs, then the buffered line
      stdout-closed  the program closes sys.stdout: status 0 (Python skips a closed stream)
      hook-fails     sys.excepthook itself raises: both tracebacks, status 1
      file-left-open PATH  writes "kept" to PATH and never closes it: the buffered text must
                     reach the file at exit
      lazy-proxy     keeps an object whose __class__ raises (as lazy module proxies do): status 0
"""
import atexit
import sys
import threading
import time

mode = sys.argv[1]
if mode == "exit-message":
    sys.exit("a message")
elif mode == "exit-code":
    sys.exit(3)
elif mode == "raise":
    raise ValueError("raised by the program")
elif mode == "interrupt":
    raise KeyboardInterrupt
elif mode == "at-exit":
    def late():
        time.sleep(0.3)
        print("thread done", file=sys.__stdout__, flush=True)

    atexit.register(lambda: print("atexit ran", file=sys.__stdout__, flush=True))
    threading.Thread(target=late).start()
    sys.stdout = open(1, "w", buffering=1 << 16, closefd=False)  # flushed only at exit
    sys.stdout.write("buffered line\n")
elif mode == "stdout-closed":
    print("gone")
    sys.stdout.close()
elif mode == "hook-fails":
    def hook(*exc_info):
        raise RuntimeError("the hook failed")

    sys.excepthook = hook
    raise ValueError("raised by the program")
elif mode == "file-left-open":
    left = open(sys.argv[2], "w")
    left.write("kept")
elif mode == "lazy-proxy":
    class Proxy:
        @property
        def __class__(self):
            raise RuntimeError("not loaded yet")

    kept = Proxy()
    print("done")
else:
    sys.exit(f"unknown mode {mode}")
