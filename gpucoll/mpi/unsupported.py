"""The mpi4py names gpucoll does not provide: one table, feature -> names.

Each name becomes a stub that raises NotImplementedError naming the feature when it is called
(so programs and test suites that probe for a feature by calling it and catching
NotImplementedError work); nothing is refused at attribute access. A name is "Class.member"
or a module-level function; "Class.member=" is a property. Stubs are installed where the class
does not define the member itself (an inherited one is replaced: Intercomm's reduce-scatter).
"""
from ..base.errors import GpucollError
from ..base.mpi_constants import INTEGERS as _C


class Unsupported(GpucollError, NotImplementedError):
    """What a stub raises: a NotImplementedError (feature probes catch it) that is also an
    MPI.Exception of class ERR_UNSUPPORTED_OPERATION (programs that catch MPI errors catch it)."""

    def __init__(self, message):
        super().__init__(message, error_class=_C["ERR_UNSUPPORTED_OPERATION"])


def _on(cls, names):
    return [f"{cls}.{n}" for n in names.split()]


FEATURES = [
    ("user-defined data representations (MPI-IO)", ["Register_datarep"]),
    ("reduce-scatter across an intercommunicator",
     _on("Intercomm", "Reduce_scatter Reduce_scatter_block Ireduce_scatter Ireduce_scatter_block "
                      "Reduce_scatter_init Reduce_scatter_block_init")),
    ("hardware resource information (MPI 4.1)", ["Get_hw_resource_info"]),
    ("access to C-level MPI handles", ["_addressof", "_handleof", "_sizeof", "_datatype_create",
                                       "_datatype_decode"]),
    ("external32 packing", _on("Datatype", "Pack_external Unpack_external Pack_external_size")),
]


def _stub(owner, member, feature):
    where = f"gpucoll.MPI.{owner + '.' if owner else ''}{member}"

    def unsupported(*args, **kwargs):
        raise Unsupported(f"{where}: not supported by gpucoll ({feature})")
    unsupported.__name__ = member
    unsupported.unsupported_feature = feature
    unsupported.__qualname__ = f"{owner}.{member}" if owner else member
    unsupported.__doc__ = f"Not supported by gpucoll: {feature}. Raises NotImplementedError."
    return unsupported


def _property(owner, member, feature):
    stub = _stub(owner, member, feature)
    prop = property(lambda self: stub(self), doc=stub.__doc__)
    prop.fget.unsupported_feature = feature
    return prop


def install(namespace):
    """Put a stub for every listed name that `namespace` (gpucoll.MPI's globals) lacks."""
    for feature, names in FEATURES:
        for name in names:
            owner, _, member = name.rpartition(".")
            prop = member.endswith("=")
            member = member.rstrip("=")
            if not owner:
                namespace.setdefault(member, _stub("", member, feature))
                continue
            cls = namespace[owner]
            if member in vars(cls):  # the class's own member: provided (an inherited one is replaced)
                continue
            setattr(cls, member, _property(owner, member, feature) if prop else _stub(owner, member, feature))


def unsupported_names():
    """Every name in the table (for docs/mpi.md and the tests)."""
    return [(feature, [n.rstrip("=") for n in names]) for feature, names in FEATURES]
