"""gpucoll.MPI's communicator classes by name.

The module that defines a communicator class registers it when it is imported (gpucoll.MPI
imports them all), so that the code that makes a communicator of another kind (an Intercomm from
Intracomm.Create_intercomm or Accept, a Cartcomm from Create_cart, the Intracomm of an agreement)
finds its class here instead of importing the module that defines it: comm.py's mixins sit below
comm.py, and intercomm.py and topocomm.py above it, with no import running back up.
"""
_CLASSES = {}


def register(cls):
    """Class decorator: the class can be found by its name."""
    _CLASSES[cls.__name__] = cls
    return cls


def kind(name):
    """The registered communicator class `name` (Intracomm, Intercomm, Cartcomm, ...)."""
    try:
        return _CLASSES[name]
    except KeyError:
        raise RuntimeError(f"no communicator class {name!r} is registered; import gpucoll.MPI first") from None
