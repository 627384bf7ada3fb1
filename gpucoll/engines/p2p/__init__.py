"""Point to point: host messages (host.py), GPU messages (gpu.py) and their GPU outboxes."""
