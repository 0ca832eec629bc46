"""effectlog: the truth about external side effects performed by workers."""


def __getattr__(name: str) -> str:
    """``effectlog.__version__``, read from the installed package's metadata on first use
    (so that ``import effectlog`` stays cheap)."""
    if name == "__version__":
        from importlib.metadata import version

        return version("effectlog")
    raise AttributeError(f"module 'effectlog' has no attribute {name!r}")
