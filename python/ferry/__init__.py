"""ferry: the client of the ferry remote file system, for Python.

``ferry.Client(url)`` gives the path operations of the Rust client library
(errors are ``OSError`` subclasses with ``errno`` set) and ``open()`` returns
real ``io`` file objects. ``ferry://host:port/path`` URLs work in fsspec,
pandas and pyarrow through :class:`ferry.fs.FerryFileSystem` (registered as
the ``ferry`` protocol by an entry point).
"""

from ._client import Client, DirEntry

__all__ = ["Client", "DirEntry"]
__version__ = "0.1.0"
