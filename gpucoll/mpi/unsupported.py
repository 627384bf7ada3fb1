"""The mpi4py names gpucoll does not provide: one table, feature -> names.

Each name becomes a stub that raises NotImplementedError naming the feature when it is called
(so programs and test suites that probe for a feature by calling it and catching
NotImplementedError work); nothing is refused at attribute access. A name is "Class.member"
or a module-level function; "Class.member=" is a property. Stubs are installed only where a
class lacks the member. As in mpi4py over an MPI library without the feature, the null handles
of these classes (MPI.WIN_NULL, ...) raise NotImplementedError too.
"""
from ..errors import GpucollError
from .constants import INTEGERS as _C
from .handle import Handle


class Unsupported(GpucollError, NotImplementedError):
    """What a stub raises: a NotImplementedError (feature probes catch it) that is also an
    MPI.Exception of class ERR_UNSUPPORTED_OPERATION (programs that catch MPI errors catch it)."""

    def __init__(self, message):
        super().__init__(message, error_class=_C["ERR_UNSUPPORTED_OPERATION"])

_WIN_MEMBERS = (
    "Accumulate Allocate Allocate_shared Attach Call_errhandler Compare_and_swap Complete Create Create_dynamic "
    "Create_errhandler Create_keyval Delete_attr Detach Fence Fetch_and_op Flush Flush_all Flush_local "
    "Flush_local_all Free Free_keyval Get Get_accumulate Get_attr Get_errhandler Get_group Get_info Get_name "
    "Lock Lock_all Post Put Raccumulate Rget Rget_accumulate Rput Set_attr Set_errhandler Set_info Set_name "
    "Shared_query Start Sync Test Unlock Unlock_all Wait tomemory attrs= flavor= group= group_rank= group_size= "
    "info= model= name=")
_FILE_MEMBERS = (
    "Call_errhandler Close Create_errhandler Delete Get_amode Get_atomicity Get_byte_offset Get_errhandler "
    "Get_group Get_info Get_position Get_position_shared Get_size Get_type_extent Get_view Iread Iread_all "
    "Iread_at Iread_at_all Iread_shared Iwrite Iwrite_all Iwrite_at Iwrite_at_all Iwrite_shared Open "
    "Preallocate Read Read_all Read_all_begin Read_all_end Read_at Read_at_all Read_at_all_begin "
    "Read_at_all_end Read_ordered Read_ordered_begin Read_ordered_end Read_shared Seek Seek_shared "
    "Set_atomicity Set_errhandler Set_info Set_size Set_view Sync Write Write_all Write_all_begin "
    "Write_all_end Write_at Write_at_all Write_at_all_begin Write_at_all_end Write_ordered "
    "Write_ordered_begin Write_ordered_end Write_shared amode= atomicity= group= group_rank= group_size= "
    "info= size=")
_SESSION_MEMBERS = (
    "Attach_buffer Call_errhandler Create_errhandler Create_group Detach_buffer Finalize Flush_buffer "
    "Get_errhandler Get_info Get_nth_pset Get_num_psets Get_pset_info Iflush_buffer Init Set_errhandler")
_NEIGHBOR = ("Neighbor_allgather Neighbor_allgather_init Neighbor_allgatherv Neighbor_allgatherv_init "
             "Neighbor_alltoall Neighbor_alltoall_init Neighbor_alltoallv Neighbor_alltoallv_init "
             "Neighbor_alltoallw Neighbor_alltoallw_init Ineighbor_allgather Ineighbor_allgatherv "
             "Ineighbor_alltoall Ineighbor_alltoallv Ineighbor_alltoallw neighbor_allgather neighbor_alltoall")


def _on(cls, names):
    return [f"{cls}.{n}" for n in names.split()]


FEATURES = [
    ("one-sided communication (RMA windows)", _on("Win", _WIN_MEMBERS)),
    ("MPI-IO (files)", _on("File", _FILE_MEMBERS) + ["Register_datarep"]),
    ("MPI sessions", _on("Session", _SESSION_MEMBERS) + ["Intracomm.Create_from_group",
                                                         "Group.Create_from_session_pset"]),
    ("intercommunicators", _on("Intercomm", "Get_remote_group Get_remote_size Merge Create_from_groups "
                                            "remote_group= remote_size=") + ["Intracomm.Create_intercomm",
                                                                             "_commctx_inter"]),
    ("Cartesian and graph topologies",
     _on("Intracomm", "Create_cart Create_graph Create_dist_graph Create_dist_graph_adjacent Cart_map Graph_map")
     + _on("Topocomm", "degrees= indegree= outdegree= inedges= outedges= inoutedges=")
     + _on("Cartcomm", "Get_cart_rank Get_coords Get_dim Get_topo Shift Sub coords= dim= dims= ndim= periods= "
                       "topo=")
     + _on("Graphcomm", "Get_dims Get_neighbors Get_neighbors_count Get_topo dims= edges= index= nedges= "
                        "neighbors= nneighbors= nnodes= topo=")
     + _on("Distgraphcomm", "Get_dist_neighbors Get_dist_neighbors_count")),
    ("neighbourhood collectives (they need topologies)", _on("Topocomm", _NEIGHBOR)),
    ("fault tolerance (ULFM)", _on("Comm", "Ack_failed Agree Get_failed Iagree Is_revoked Ishrink Revoke Shrink")),
    ("dynamic processes (spawn, ports, names)",
     _on("Intracomm", "Accept Connect Spawn Spawn_multiple") + ["Comm.Join", "Open_port", "Close_port",
                                                                 "Publish_name", "Unpublish_name", "Lookup_name"]),
    ("partitioned point to point", _on("Comm", "Psend_init Precv_init")
     + _on("Prequest", "Pready Pready_list Pready_range Parrived")),
    ("hardware resource information (MPI 4.1)", ["Get_hw_resource_info"]),
    ("the MPI ABI queries (MPI 5)", ["Get_abi_version", "Get_abi_info", "Get_abi_fortran_info"]),
    ("access to C-level MPI handles", ["_addressof", "_handleof", "_sizeof", "_datatype_create",
                                       "_datatype_decode", "_set_abort_status"]),
    ("distributed arrays of datatypes (Create_darray)", ["Datatype.Create_darray"]),
    ("external32 packing", _on("Datatype", "Pack_external Unpack_external Pack_external_size")),
]

def _stub(owner, member, feature):
    where = f"gpucoll.MPI.{owner + '.' if owner else ''}{member}"

    def unsupported(*args, **kwargs):
        raise Unsupported(f"{where}: {feature} are not supported by gpucoll")
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
            if hasattr(cls, member):
                continue
            setattr(cls, member, _property(owner, member, feature) if prop else _stub(owner, member, feature))


def unsupported_names():
    """Every name in the table (for the README and the tests)."""
    return [(feature, [n.rstrip("=") for n in names]) for feature, names in FEATURES]


class Win(Handle):
    """RMA windows: not supported by gpucoll (only MPI.WIN_NULL exists)."""

    __slots__ = ()
    _kind = "win"


class File(Handle):
    """MPI-IO files: not supported by gpucoll (only MPI.FILE_NULL exists)."""

    __slots__ = ()
    _kind = "file"


class Session(Handle):
    """MPI sessions: not supported by gpucoll (only MPI.SESSION_NULL exists)."""

    __slots__ = ()
    _kind = "session"
