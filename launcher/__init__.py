"""gpurun, gpucoll's launcher: start N ranks of a program on this host.

Installed as `gpucoll.launcher`; the `gpurun` console script calls `cli.main`. The modules
each do one job: `cli` parses the command line, `job` runs the event loop and the
stop/kill policy, `spawn` starts ranks in their own process groups, `env` builds their
environment, `output` forwards their lines, `signals` turns signals into loop events and
`report` words the failure report and picks the exit code.
"""
