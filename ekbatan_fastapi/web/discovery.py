"""Finding ``@distributed_job`` classes: in the modules named in settings, and in any module
already imported when the application starts."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable

from ..domain.errors import ConfigurationError
from ..domain.job import Job, is_distributed_job

__all__ = ["discover_job_classes", "import_job_modules"]


def import_job_modules(modules: Iterable[str], *, setting: str = "ekbatan.jobs.modules") -> None:
    """Import each module so that the job classes it defines are registered."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is not None and (name == error.name or name.startswith(error.name + ".")):
                raise ConfigurationError(
                    f"{setting} lists {name!r}, which cannot be imported ({error}); check the "
                    "dotted module path and that its package is installed"
                ) from None
            error.add_note(f"while importing {name!r} listed in {setting}")
            raise
        except Exception as error:
            error.add_note(f"while importing {name!r} listed in {setting}")
            raise


def _subclasses(root: type) -> Iterable[type]:
    cls: type
    for cls in root.__subclasses__():
        yield cls
        yield from _subclasses(cls)


def discover_job_classes() -> list[type[Job]]:
    """Every concrete class marked ``@distributed_job`` in an imported module, in a stable
    order (module, then class name)."""
    found: dict[type[Job], None] = {}
    for cls in _subclasses(Job):
        if is_distributed_job(cls) and not inspect.isabstract(cls):
            found[cls] = None
    return sorted(found, key=lambda c: (c.__module__, c.__qualname__))
