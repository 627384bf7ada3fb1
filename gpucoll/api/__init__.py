"""gpucoll's own API: the Communicator and the process's world."""
