"""Engines: what runs a numbered, validated Call (gpucoll/base/call.py).

One module per engine; each states the cost-table rows it serves (`rows`, the selector's
algorithm names in gpucoll/algorithms/selector.py), runs a call (`run(call, algorithm)`) and may
offer a packed fast path. It gets a narrow CommView of its communicator (comm_view.py), never the
Communicator, and raises gpucoll errors that the dispatcher routes to gpucoll/dispatch/diagnosis.py.

    direct.py         host buffers, one host: one shared segment, one native call ("direct")
    schedules.py      host buffers: schedules over the peer channels (every schedule row)
    hierarchical.py   host all-reduce across hosts: three collectives on sub-communicators
                      ("hierarchical")
    gpu/engine.py     GPU buffers: IPC kernels on the staging buffers ("one-shot", "two-shot",
                      "staged") or on registered user buffers ("registered"), host-staged without P2P

The dispatcher (gpucoll/dispatch/dispatcher.py) picks the row by the cost table and runs the engine
that serves it. Which rows a communicator offers is data: the selector knows the transports of
each row, and the dispatcher names the native rows its communicator has (`available`); only the
hierarchical engine, which takes nothing but host all-reduces on communicators that span hosts,
is asked first (`can_run(call)`). Also here: queue.py (a communicator's calls in issue order) and
p2p/ (point to point).
"""
