"""Attribute caching on communicators, datatypes and windows (Create_keyval, Set_attr, ...).

A keyval carries a copy function (what Dup does with the attribute: None/False drop it, True
shares it, a callable returns the copy or NotImplemented to drop it) and a delete function
(called when the attribute is deleted, replaced or its object freed). An exception in either is
printed and raised as MPI.Exception(ERR_OTHER), as mpi4py does.
"""
import traceback

from ..base.errors import GpucollError, InvalidUsageError
from ..base.mpi_constants import INTEGERS as _C

KEYVAL_INVALID, ERR_KEYVAL, ERR_OTHER = _C["KEYVAL_INVALID"], _C["ERR_KEYVAL"], _C["ERR_OTHER"]

_KEYVALS = {}      # keyval -> (kind, copy_fn, delete_fn)
_next = [1000]     # user keyvals start here, above the predefined ones (TAG_UB, HOST, ...)


def create_keyval(kind, copy_fn=None, delete_fn=None, nopython=False):
    keyval = _next[0]
    _next[0] += 1
    _KEYVALS[keyval] = (kind, copy_fn, delete_fn)
    return keyval


def free_keyval(keyval):
    _KEYVALS.pop(keyval, None)
    return KEYVAL_INVALID


def _entry(keyval, kind, what):
    entry = _KEYVALS.get(keyval)
    if entry is None or entry[0] != kind:
        raise InvalidUsageError(f"{what}: {keyval} is not a {kind} keyval", error_class=ERR_KEYVAL)
    return entry


def _callback(fn, *args, **kwargs):
    """Call a program's callback: its exception is printed, then raised as an MPI error (an MPI
    error as it is, anything else as ERR_OTHER), as mpi4py does."""
    try:
        return fn(*args, **kwargs)
    except GpucollError:
        traceback.print_exc()
        raise
    except Exception as exc:
        traceback.print_exc()
        raise GpucollError(ERR_OTHER) from exc


def get_attr(attrs, keyval, kind):
    if keyval not in _KEYVALS:
        raise InvalidUsageError(f"Get_attr: {keyval} is not a keyval", error_class=ERR_KEYVAL)
    return attrs.get(keyval)


def set_attr(obj, attrs, keyval, value, kind):
    _entry(keyval, kind, "Set_attr")
    if keyval in attrs:
        delete_attr(obj, attrs, keyval, kind)
    attrs[keyval] = value


def delete_attr(obj, attrs, keyval, kind):
    _, _, delete_fn = _entry(keyval, kind, "Delete_attr")
    value = attrs.pop(keyval, None)
    if callable(delete_fn):
        _callback(delete_fn, obj, keyval, value)


def copy_attrs(obj, attrs):
    """The attributes a Dup of obj gets."""
    out = {}
    for keyval, value in attrs.items():
        entry = _KEYVALS.get(keyval)
        copy_fn = entry[1] if entry else None
        if copy_fn is True:
            out[keyval] = value
        elif callable(copy_fn):
            new = _callback(copy_fn, obj, keyval, value)
            if new is not NotImplemented:
                out[keyval] = new
    return out


def delete_all(obj, attrs):
    """Call the delete functions of every attribute (the object is being freed)."""
    for keyval in list(attrs):
        entry = _KEYVALS.get(keyval)
        value = attrs.pop(keyval)
        if entry and callable(entry[2]):
            _callback(entry[2], obj, keyval, value)
