"""From a user's arguments to a checked Call: buffer reading (host and GPU) and argument checks."""
