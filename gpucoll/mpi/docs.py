"""Docstrings of gpucoll.MPI in mpi4py's layout, set once when gpucoll.MPI is assembled.

mpi4py's docstrings come from Cython's embedded signatures: a function's or a property's first
line is its call signature, then a blank line, then the description, whose first line is a
summary sentence. Tools and mpi4py's own tests read them that way (they drop the first line), so
every function and property reachable from gpucoll.MPI gets that layout here: the signature line
is made from the code, the description is the source's docstring with its summary paragraph on
one line, or, for an mpi4py name the source leaves undocumented, a pointer to mpi4py's reference,
whose behaviour gpucoll.MPI follows. Private names without a docstring are left alone."""
import inspect

_DONE = "__gpucoll_signed__"


def _description(doc, qualname):
    """The description: the summary paragraph joined on one line, the rest kept as written."""
    if not doc or not doc.strip():
        return f"Same as `mpi4py.MPI.{qualname}`: see mpi4py's reference."
    paragraphs = inspect.cleandoc(doc).split("\n\n", 1)
    summary = " ".join(line.strip() for line in paragraphs[0].splitlines())
    return "\n\n".join([summary, *paragraphs[1:]])


def _signature(func):
    try:
        return str(inspect.signature(func))
    except (TypeError, ValueError):  # some callables do not say
        return "(...)"


def _sign_function(func, qualname):
    if getattr(func, _DONE, False) or not hasattr(func, "__code__"):
        return  # a function met again under another name, or not Python code (a C function)
    name = qualname.rpartition(".")[2]
    if name.startswith("_") and not func.__doc__:
        return
    func.__doc__ = f"{qualname}{_signature(func)}\n\n{_description(func.__doc__, qualname)}"
    setattr(func, _DONE, True)


def _sign_class(cls, seen):
    if cls in seen or not cls.__module__.startswith("gpucoll"):
        return
    seen.add(cls)
    for base in cls.__mro__[1:]:  # the mixins that hold a class's methods (collectives, topology, ...)
        if base.__module__.startswith("gpucoll.mpi."):
            _sign_class(base, seen)
    if cls.__doc__:
        cls.__doc__ = _description(cls.__doc__, cls.__name__)
    for attr, value in list(vars(cls).items()):
        qualname = f"{cls.__name__}.{attr}"
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, property):
            if value.__doc__ or not attr.startswith("_"):
                value.__doc__ = f"{qualname}\n\n{_description(value.__doc__, qualname)}"
        elif inspect.isfunction(value):
            _sign_function(value, qualname)
        elif inspect.isclass(value):
            _sign_class(value, seen)


def sign(namespace):
    """Give every class, function and property of `namespace` (a module's globals) its layout."""
    seen = set()
    for name, value in list(namespace.items()):
        if inspect.isclass(value):
            _sign_class(value, seen)
        elif inspect.isfunction(value) and value.__module__.startswith("gpucoll"):
            _sign_function(value, value.__name__)
