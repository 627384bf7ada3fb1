"""Python face of each transport (shared memory, TCP) and the choice of network interface."""
