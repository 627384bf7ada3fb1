"""Another user's process that squats a job's shared-memory names (standard library only).

    setpriv --reuid=65534 --regid=65534 --clear-groups python3 shm_squatter.py

Reads one JSON line {path: hex bytes} from stdin, creates each file with mode 0666 holding those
bytes, prints one JSON line {path: sha256 of the content}, and stays alive (a live process, as a
real squatter would be) until its stdin closes.
"""
import hashlib
import json
import os
import sys

planted = {}
for path, data in json.loads(sys.stdin.readline()).items():
    data = bytes.fromhex(data)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    os.fchmod(fd, 0o666)
    os.write(fd, data)
    os.close(fd)
    planted[path] = hashlib.sha256(data).hexdigest()
print(json.dumps({"pid": os.getpid(), "uid": os.getuid(), "files": planted}), flush=True)
sys.stdin.read()
